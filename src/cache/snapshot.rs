//! A snapshot of the store: the objects as of one revision, with their
//! indexes, and the reads a List makes of them.

use std::ops::Bound;
use std::sync::Arc;

use super::{Digest, FieldIndexes, Store};
use crate::object::{Object, Resource, Revision};
use crate::selector::Predicate;

/// The objects as of one revision.
#[derive(Clone)]
pub struct Snapshot {
    pub store: Store,
    pub indexes: FieldIndexes,
    pub revision: Revision,
    /// The revision of the newest change in the objects, at or below
    /// `revision` (their objects are the same); 0 where not known (a past
    /// state). A tier below confirms its own freshness with it.
    pub changed: Revision,
    /// The objects' [`Digest`], where they are the current ones; none for
    /// a past state.
    pub digest: Option<Digest>,
}

impl Snapshot {
    /// The objects the predicate selects, in key order, starting after
    /// `after` when given. Reads only the key range the namespace or name
    /// pins.
    pub fn select<'a>(
        &'a self,
        resource: &Resource,
        predicate: &'a Predicate,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Object>> + 'a> {
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.as_bytes()));
        self.select_between(resource, predicate, from, Bound::Unbounded)
    }

    /// [`Snapshot::select`] of the keys between `from` and `to`: the
    /// store's range, or the field index a pinned field names, whichever
    /// is narrower.
    pub fn select_between<'a>(
        &'a self,
        resource: &Resource,
        predicate: &'a Predicate,
        from: Bound<&[u8]>,
        to: Bound<&'a [u8]>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Object>> + 'a> {
        let within = move |key: &[u8]| {
            let above = match from {
                Bound::Included(f) => key >= f,
                Bound::Excluded(f) => key > f,
                Bound::Unbounded => true,
            };
            above && below(to, key)
        };
        let namespace = predicate.namespace().unwrap_or("");
        if let Some(name) = predicate.name() {
            if !resource.namespaced || !namespace.is_empty() {
                let key = resource.key(namespace, name);
                let hit = match within(key.as_bytes()) {
                    true => self.store.get(key.as_bytes()),
                    false => None,
                };
                return Box::new(
                    hit.into_iter()
                        .map(|s| &s.0)
                        .filter(|o| predicate.matches(o)),
                );
            }
        }
        let prefix = resource.namespace_prefix(namespace);
        let indexed = predicate
            .pinned_fields()
            .filter_map(|(field, value)| self.indexes.objects(field, value))
            .min_by_key(|keys| keys.map_or(0, |k| k.len()));
        if let Some(keys) = indexed {
            let Some(keys) = keys else {
                return Box::new(std::iter::empty());
            };
            return Box::new(
                (keys.range::<_, [u8]>((from, Bound::Unbounded)))
                    .map(|s| &s.0)
                    .take_while(move |o| below(to, o.key_bytes()))
                    .filter(move |o| o.key_bytes().starts_with(prefix.as_bytes()))
                    .filter(|o| predicate.matches(o)),
            );
        }
        let lower = match from {
            Bound::Included(f) | Bound::Excluded(f) if f >= prefix.as_bytes() => from,
            _ => Bound::Included(prefix.as_bytes()),
        };
        let range = self.store.range::<_, [u8]>((lower, Bound::Unbounded));
        Box::new(
            range
                .map(|s| &s.0)
                .take_while(move |o| o.key_bytes().starts_with(prefix.as_bytes()))
                .take_while(move |o| below(to, o.key_bytes()))
                .filter(|o| predicate.matches(o)),
        )
    }
}

/// Whether `key` is before the upper bound `to`.
fn below(to: Bound<&[u8]>, key: &[u8]) -> bool {
    match to {
        Bound::Included(t) => key <= t,
        Bound::Excluded(t) => key < t,
        Bound::Unbounded => true,
    }
}
