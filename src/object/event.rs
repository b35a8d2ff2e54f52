//! What happened to a key at a revision: the object before and after it,
//! so each watcher can tell what it sees of the change.

use std::fmt;
use std::sync::Arc;

use super::{Object, Revision};

/// What happened to a key, as etcd reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        })
    }
}

/// A change to one key at one revision. Carries the previous state too, so
/// each watcher can judge whether the object starts, keeps or stops matching
/// its selector. Built only through its constructors, so a creation has no
/// previous state, a deletion no new one, and every event has one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Where the event stands in the resource's history: watches resume
    /// after it.
    pub revision: Revision,
    change: Change,
    /// On an event of a resync (a difference from a list, not history):
    /// the version the lost history starts from, where a client resumes
    /// from after the event, so that a resume is exact (the whole resync
    /// again).
    pub resync_from: Option<Revision>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Added(Arc<Object>),
    Modified {
        object: Arc<Object>,
        prev: Arc<Object>,
    },
    Deleted(Arc<Object>),
}

impl Event {
    pub fn added(revision: Revision, object: Arc<Object>) -> Self {
        Self {
            revision,
            change: Change::Added(object),
            resync_from: None,
        }
    }

    pub fn modified(revision: Revision, object: Arc<Object>, prev: Arc<Object>) -> Self {
        Self {
            revision,
            change: Change::Modified { object, prev },
            resync_from: None,
        }
    }

    /// A deletion, carrying the last state of the object.
    pub fn deleted(revision: Revision, prev: Arc<Object>) -> Self {
        Self {
            revision,
            change: Change::Deleted(prev),
            resync_from: None,
        }
    }

    /// The event that takes a key from `prev` to `object`; none when the
    /// key neither was nor is there.
    pub fn between(
        revision: Revision,
        prev: Option<Arc<Object>>,
        object: Option<Arc<Object>>,
    ) -> Option<Self> {
        Some(match (prev, object) {
            (None, Some(o)) => Self::added(revision, o),
            (Some(p), Some(o)) => Self::modified(revision, o, p),
            (Some(p), None) => Self::deleted(revision, p),
            (None, None) => return None,
        })
    }

    /// This event as part of a resync from `from` (see
    /// [`Event::resync_from`]).
    pub fn in_resync(self, from: Revision) -> Self {
        Self {
            resync_from: Some(from),
            ..self
        }
    }

    pub fn kind(&self) -> EventType {
        match self.change {
            Change::Added(_) => EventType::Added,
            Change::Modified { .. } => EventType::Modified,
            Change::Deleted(_) => EventType::Deleted,
        }
    }

    /// The new state; none for a deletion.
    /// The memory of the state it shows, as [`Object::cost`] counts it,
    /// and of the event itself.
    pub fn cost(&self) -> u64 {
        let shown = self.object().or(self.prev());
        shown.map_or(0, |o| o.cost()) + std::mem::size_of::<Event>() as u64 + 32
    }

    pub fn object(&self) -> Option<&Arc<Object>> {
        match &self.change {
            Change::Added(o) | Change::Modified { object: o, .. } => Some(o),
            Change::Deleted(_) => None,
        }
    }

    /// The state before; none for a creation.
    pub fn prev(&self) -> Option<&Arc<Object>> {
        match &self.change {
            Change::Modified { prev: p, .. } | Change::Deleted(p) => Some(p),
            Change::Added(_) => None,
        }
    }

    pub fn key(&self) -> &str {
        match &self.change {
            Change::Added(o) | Change::Modified { object: o, .. } | Change::Deleted(o) => o.key(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Resource;

    #[test]
    fn an_event_is_named_by_the_states_before_and_after_it() {
        let r = Resource::for_tests(&[]);
        let o = |v: Revision| Arc::new(r.decode(b"/p/ns/a", b"{}", v).unwrap());
        let (before, after) = (o(3), o(5));
        assert_eq!(Event::between(5, None, None), None);
        let cases = [
            (None, Some(&after), EventType::Added),
            (Some(&before), Some(&after), EventType::Modified),
            (Some(&before), None, EventType::Deleted),
        ];
        for (prev, object, kind) in cases {
            let e = Event::between(5, prev.cloned(), object.cloned()).unwrap();
            assert_eq!(e.kind(), kind);
            assert_eq!((e.prev(), e.object()), (prev, object));
            assert_eq!(e.key(), "/p/ns/a");
        }
    }
}
