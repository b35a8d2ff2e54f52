//! The trigger index: which watchers an event can concern.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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
}

/// Watcher ids by trigger.
#[derive(Debug, Default)]
pub struct TriggerIndex {
    all: HashSet<u64>,
    by_key: HashMap<Arc<str>, HashSet<u64>>,
    /// One map per indexed field, by its position in the selectable fields.
    by_field: HashMap<usize, HashMap<String, HashSet<u64>>>,
}

impl TriggerIndex {
    pub fn insert(&mut self, id: u64, trigger: &Trigger) {
        match trigger {
            Trigger::All => self.all.insert(id),
            Trigger::Key(k) => self.by_key.entry(k.clone()).or_default().insert(id),
            Trigger::Field { field, value } => self
                .by_field
                .entry(*field)
                .or_default()
                .entry(value.clone())
                .or_default()
                .insert(id),
        };
    }

    pub fn remove(&mut self, id: u64, trigger: &Trigger) {
        match trigger {
            Trigger::All => {
                self.all.remove(&id);
            }
            Trigger::Key(k) => {
                if let Some(set) = self.by_key.get_mut(k) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.by_key.remove(k);
                    }
                }
            }
            Trigger::Field { field, value } => {
                if let Some(values) = self.by_field.get_mut(field) {
                    if let Some(set) = values.get_mut(value) {
                        set.remove(&id);
                        if set.is_empty() {
                            values.remove(value);
                        }
                    }
                }
            }
        }
    }

    /// Appends to `out` every watcher `event` can concern: those that pin
    /// nothing, those on its key, and those pinned to its new or previous
    /// value of an indexed field. No id appears twice.
    pub fn candidates(&self, event: &Event, out: &mut Vec<u64>) {
        out.extend(self.all.iter().copied());
        if let Some(set) = self.by_key.get(event.key()) {
            out.extend(set.iter().copied());
        }
        for (&field, values) in &self.by_field {
            let (now, before) = (field_of(&event.object, field), field_of(&event.prev, field));
            for v in [now, before.filter(|b| Some(*b) != now)]
                .into_iter()
                .flatten()
            {
                if let Some(set) = values.get(v) {
                    out.extend(set.iter().copied());
                }
            }
        }
    }
}

fn field_of(o: &Option<Arc<Object>>, field: usize) -> Option<&str> {
    o.as_ref()
        .and_then(|o| o.fields.get(field))
        .map(String::as_str)
}
