//! Store indexes on the resource's indexed fields: value → keys.

use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use super::Stored;
use crate::object::Object;

/// The objects holding one value of one field, in key order.
pub type Keys = OrdSet<Stored>;

/// One persistent map per indexed field, so a snapshot of the indexes is
/// as cheap as a snapshot of the store.
#[derive(Debug, Clone, Default)]
pub struct FieldIndexes {
    /// (position among the selectable fields, value → objects)
    fields: Vec<(usize, OrdMap<String, Keys>)>,
}

impl FieldIndexes {
    pub fn new(positions: &[usize]) -> Self {
        Self {
            fields: positions.iter().map(|&p| (p, OrdMap::new())).collect(),
        }
    }

    /// Indexes built from every object of a list.
    pub fn build(positions: &[usize], objects: &[Arc<Object>]) -> Self {
        let mut ix = Self::new(positions);
        for o in objects {
            ix.update(None, Some(o));
        }
        ix
    }

    /// Moves an object from its old version's values to its new one's. The
    /// new version takes the old one's place even where its value stays,
    /// so the index never keeps a version the store let go.
    pub fn update(&mut self, old: Option<&Arc<Object>>, new: Option<&Arc<Object>>) {
        for (field, map) in &mut self.fields {
            let was = old.and_then(|o| Some((o, o.fields().get(*field)?)));
            let now = new.and_then(|o| Some((o, o.fields().get(*field)?)));
            if let Some((o, v)) = was.filter(|(_, v)| now.is_none_or(|(_, n)| n != *v)) {
                if let Some(keys) = map.get_mut(v) {
                    keys.remove(o.key_bytes());
                    if keys.is_empty() {
                        map.remove(v);
                    }
                }
            }
            if let Some((o, v)) = now {
                // Looked up by reference: most values are already there.
                match map.get_mut(v) {
                    Some(keys) => {
                        keys.insert(Stored(o.clone()));
                    }
                    None => {
                        map.insert(v.to_owned(), OrdSet::unit(Stored(o.clone())));
                    }
                }
            }
        }
    }

    /// The objects with `value` in field `field`: `None` if that field is
    /// not indexed, `Some(None)` if no object has the value.
    pub fn objects(&self, field: usize, value: &str) -> Option<Option<&Keys>> {
        let (_, map) = self.fields.iter().find(|(f, _)| *f == field)?;
        Some(map.get(value))
    }

    /// How many objects have `value` in field `field`, if it is indexed.
    pub fn count(&self, field: usize, value: &str) -> Option<usize> {
        Some(self.objects(field, value)?.map_or(0, Keys::len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, node: &str, revision: u64) -> Arc<Object> {
        Arc::new(Object::bare(
            key,
            "",
            "",
            revision,
            Default::default(),
            &["x", node],
        ))
    }

    /// Each value's objects, as (key, revision).
    fn held(ix: &FieldIndexes, v: &str) -> Vec<(String, u64)> {
        let objects = ix.objects(1, v).unwrap().into_iter().flatten();
        objects.map(|o| (o.key().to_owned(), o.revision)).collect()
    }

    #[test]
    fn updates_move_objects_between_values_and_keep_the_newest_version() {
        let mut ix = FieldIndexes::new(&[1]);
        let (a, b) = (obj("/p/a", "n1", 1), obj("/p/b", "n1", 1));
        ix.update(None, Some(&a));
        ix.update(None, Some(&b));
        let key = |k: &str| (k.to_owned(), 1);
        assert_eq!(held(&ix, "n1"), [key("/p/a"), key("/p/b")]);
        let snapshot = ix.clone();
        let (a2, b2) = (obj("/p/a", "n2", 2), obj("/p/b", "n1", 2));
        ix.update(Some(&a), Some(&a2));
        // The value stays; the version held moves on.
        ix.update(Some(&b), Some(&b2));
        assert_eq!(held(&ix, "n1"), [("/p/b".to_owned(), 2)]);
        assert_eq!(held(&ix, "n2"), [("/p/a".to_owned(), 2)]);
        ix.update(Some(&b2), None);
        assert_eq!(held(&ix, "n1"), []);
        assert_eq!(ix.count(1, "n1"), Some(0));
        assert_eq!(
            held(&snapshot, "n1"),
            [key("/p/a"), key("/p/b")],
            "snapshots are unaffected"
        );
        assert!(ix.objects(0, "x").is_none(), "field 0 is not indexed");
    }
}
