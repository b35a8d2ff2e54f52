//! The trigger index: watchers grouped by what can concern them.

use std::collections::HashMap;
use std::sync::Arc;

use super::shards::ShardSets;
use crate::object::{Event, Object};

/// Where a watcher is registered. Each watcher is in exactly one set, so
/// an event visits only the sets its key and field values name, plus the
/// watchers that pin nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// Pins nothing indexed: sees every event.
    All,
    /// Watches one object: events on this key.
    Key(Arc<str>),
    /// Pins selectable field `field` (its position in the resource's
    /// selectable fields, which must be indexed) to `value`.
    Field { field: usize, value: String },
    /// Selects a shard of shard field `field` (its position in the
    /// resource's shard fields): hashes in `ranges` (inclusive, apart).
    Shard {
        field: usize,
        ranges: Arc<[(u64, u64)]>,
    },
}

type Set<T> = HashMap<u64, T>;

/// What the set an event reached a watcher through says about the watcher:
/// the key, or the field value, it is registered under.
#[derive(Debug, Clone, Copy)]
pub enum Via<'a> {
    All,
    Key(&'a str),
    Field(usize, &'a str),
    /// A shard set: the watcher's own ranges decide, so it never lets
    /// the set decide for it.
    Shard,
}

impl Via<'_> {
    /// Whether `o` has the key or field value of this set.
    pub fn holds(&self, o: &Object) -> bool {
        match *self {
            Via::All => true,
            Via::Key(k) => o.key_bytes() == k.as_bytes(),
            Via::Field(f, v) => o.fields().get(f) == Some(v),
            Via::Shard => {
                debug_assert!(false, "a shard set does not decide a match");
                false
            }
        }
    }
}

/// Watchers (`T`, by id) in their trigger's set. Each set holds its
/// watchers inline, so dispatch reaches an interested watcher with one
/// lookup and never touches the others.
#[derive(Debug)]
pub struct TriggerIndex<T> {
    /// Where each watcher is, to find it again.
    triggers: HashMap<u64, Trigger>,
    all: Set<T>,
    by_key: HashMap<Arc<str>, Set<T>>,
    /// One map per indexed field, by its position in the selectable fields.
    by_field: HashMap<usize, HashMap<String, Set<T>>>,
    /// One index per shard field in use, by its position.
    by_shard: HashMap<usize, ShardSets<T>>,
}

impl<T> Default for TriggerIndex<T> {
    fn default() -> Self {
        Self {
            triggers: HashMap::new(),
            all: HashMap::new(),
            by_key: HashMap::new(),
            by_field: HashMap::new(),
            by_shard: HashMap::new(),
        }
    }
}

impl<T> TriggerIndex<T> {
    pub fn len(&self) -> usize {
        self.triggers.len()
    }

    pub fn insert(&mut self, id: u64, trigger: Trigger, watcher: T) {
        let set = match &trigger {
            Trigger::All => &mut self.all,
            Trigger::Key(k) => self.by_key.entry(k.clone()).or_default(),
            Trigger::Field { field, value } => self
                .by_field
                .entry(*field)
                .or_default()
                .entry(value.clone())
                .or_default(),
            Trigger::Shard { field, ranges } => {
                let sets = self.by_shard.entry(*field).or_default();
                sets.insert(id, ranges, watcher);
                self.triggers.insert(id, trigger);
                return;
            }
        };
        set.insert(id, watcher);
        self.triggers.insert(id, trigger);
    }

    pub fn remove(&mut self, id: u64) -> Option<T> {
        let removed = match self.triggers.remove(&id)? {
            Trigger::All => self.all.remove(&id),
            Trigger::Key(k) => {
                let set = self.by_key.get_mut(&k)?;
                let w = set.remove(&id);
                if set.is_empty() {
                    self.by_key.remove(&k);
                }
                w
            }
            Trigger::Field { field, value } => {
                let values = self.by_field.get_mut(&field)?;
                let set = values.get_mut(&value)?;
                let w = set.remove(&id);
                if set.is_empty() {
                    values.remove(&value);
                }
                w
            }
            Trigger::Shard { field, ranges } => {
                let sets = self.by_shard.get_mut(&field)?;
                let w = sets.remove(id, &ranges);
                if sets.is_empty() {
                    self.by_shard.remove(&field);
                }
                w
            }
        };
        removed
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        match self.triggers.get(&id)? {
            Trigger::All => self.all.get_mut(&id),
            Trigger::Key(k) => self.by_key.get_mut(k)?.get_mut(&id),
            Trigger::Field { field, value } => {
                self.by_field.get_mut(field)?.get_mut(value)?.get_mut(&id)
            }
            Trigger::Shard { field, .. } => self.by_shard.get_mut(field)?.get_mut(id),
        }
    }

    /// Calls `f` for every watcher.
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        let keyed = self.by_key.values().flat_map(Set::values);
        let fielded = self
            .by_field
            .values()
            .flat_map(HashMap::values)
            .flat_map(Set::values);
        let sharded = self.by_shard.values().flat_map(ShardSets::values);
        self.all
            .values()
            .chain(keyed)
            .chain(fielded)
            .chain(sharded)
            .for_each(&mut f);
    }

    /// Every watcher, taking them out.
    pub fn into_watchers(self) -> impl Iterator<Item = T> {
        let keyed = self.by_key.into_values().flat_map(Set::into_values);
        let fielded = self
            .by_field
            .into_values()
            .flat_map(HashMap::into_values)
            .flat_map(Set::into_values);
        let sharded = self.by_shard.into_values().flat_map(ShardSets::into_values);
        self.all
            .into_values()
            .chain(keyed)
            .chain(fielded)
            .chain(sharded)
    }

    /// Calls `f` for every watcher `event` can concern: those that pin
    /// nothing, those on its key, those pinned to its new or previous
    /// value of an indexed field, and those whose shard holds its new or
    /// previous hash; each once.
    pub fn for_each_candidate<'e>(
        &mut self,
        event: &'e Event,
        mut f: impl FnMut(u64, &mut T, Via<'e>),
    ) {
        let mut visit =
            |set: &mut Set<T>, via: Via<'e>| set.iter_mut().for_each(|(id, w)| f(*id, w, via));
        visit(&mut self.all, Via::All);
        if !self.by_key.is_empty() {
            if let Some(set) = self.by_key.get_mut(event.key()) {
                visit(set, Via::Key(event.key()));
            }
        }
        for (&field, values) in &mut self.by_field {
            let (now, before) = (
                field_of(event.object(), field),
                field_of(event.prev(), field),
            );
            for v in [now, before.filter(|b| Some(*b) != now)]
                .into_iter()
                .flatten()
            {
                if let Some(set) = values.get_mut(v) {
                    visit(set, Via::Field(field, v));
                }
            }
        }
        for (&field, sets) in &mut self.by_shard {
            let hash = |o: Option<&Arc<Object>>| o.map(|o| o.shard_hash(field));
            let (now, before) = (hash(event.object()), hash(event.prev()));
            sets.for_each_holding(now, before, |id, w| f(id, w, Via::Shard));
        }
    }
}

fn field_of(o: Option<&Arc<Object>>, field: usize) -> Option<&str> {
    o.and_then(|o| o.fields().get(field))
}
