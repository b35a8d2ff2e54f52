//! Store indexes on the resource's indexed fields: value → keys.

use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use crate::object::Object;

/// The keys holding one value of one field, in key order.
pub type Keys = OrdSet<Arc<str>>;

/// One persistent map per indexed field, so a snapshot of the indexes is
/// as cheap as a snapshot of the store.
#[derive(Debug, Clone, Default)]
pub struct FieldIndexes {
    /// (position among the selectable fields, value → keys)
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
            for (field, map) in &mut ix.fields {
                let Some(value) = o.fields.get(*field) else {
                    continue;
                };
                // Looked up by reference: most values are already there.
                match map.get_mut(value) {
                    Some(keys) => {
                        keys.insert(o.key.clone());
                    }
                    None => {
                        map.insert(value.to_owned(), OrdSet::unit(o.key.clone()));
                    }
                }
            }
        }
        ix
    }

    /// Moves `key` from its old values to its new ones.
    pub fn update(&mut self, key: &Arc<str>, old: Option<&Object>, new: Option<&Object>) {
        for (field, map) in &mut self.fields {
            let value =
                |o: Option<&Object>| o.and_then(|o| o.fields.get(*field)).map(str::to_owned);
            let (was, now) = (value(old), value(new));
            if was == now {
                continue;
            }
            if let Some(v) = was {
                if let Some(keys) = map.get_mut(&v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        map.remove(&v);
                    }
                }
            }
            if let Some(v) = now {
                map.entry(v).or_default().insert(key.clone());
            }
        }
    }

    /// The keys with `value` in field `field`: `None` if that field is not
    /// indexed, an empty set if no object has the value.
    pub fn lookup(&self, field: usize, value: &str) -> Option<Keys> {
        let (_, map) = self.fields.iter().find(|(f, _)| *f == field)?;
        Some(map.get(value).cloned().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, node: &str) -> Object {
        Object::bare(key, "", "", 1, Default::default(), &["x", node])
    }

    #[test]
    fn updates_move_keys_between_values() {
        let mut ix = FieldIndexes::new(&[1]);
        let (a, b) = (obj("/p/a", "n1"), obj("/p/b", "n1"));
        ix.update(&a.key, None, Some(&a));
        ix.update(&b.key, None, Some(&b));
        let keys = |ix: &FieldIndexes, v| {
            ix.lookup(1, v)
                .unwrap()
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&ix, "n1"), ["/p/a", "/p/b"]);
        let snapshot = ix.clone();
        let a2 = obj("/p/a", "n2");
        ix.update(&a.key, Some(&a), Some(&a2));
        ix.update(&b.key, Some(&b), None);
        assert_eq!(keys(&ix, "n1"), Vec::<String>::new());
        assert_eq!(keys(&ix, "n2"), ["/p/a"]);
        assert_eq!(
            keys(&snapshot, "n1"),
            ["/p/a", "/p/b"],
            "snapshots are unaffected"
        );
        assert!(ix.lookup(0, "x").is_none(), "field 0 is not indexed");
    }
}
