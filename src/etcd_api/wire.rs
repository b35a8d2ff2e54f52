//! Objects and changes as etcd's messages show them.

use bytes::Bytes;
use prost::Message;

use crate::dispatch::View;
use crate::etcdpb::etcdserverpb::{ResponseHeader, WatchResponse};
use crate::etcdpb::mvccpb::{self, event::EventType as Kind};
use crate::object::{EventType, Object, Revision};

/// A change as etcd's watch sends it, encoded once for every stream: the
/// whole `WatchResponse` a watch of id 0 gets for it alone (its header and
/// the change), whose tail is the change's `mvccpb.Event`. Most watches
/// are their stream's first, id 0, and get their changes one at a time:
/// theirs is a copy of these bytes.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub revision: Revision,
    bytes: Bytes,
    /// Where the `mvccpb.Event` starts in `bytes`.
    event_at: usize,
    /// When the change reached its cache (live changes of a cache).
    pub received: Option<std::time::Instant>,
}

impl Encoded {
    /// `event`, at `revision`.
    pub fn new(
        revision: Revision,
        event: &mvccpb::Event,
        received: Option<std::time::Instant>,
    ) -> Self {
        let alone = WatchResponse {
            header: header(revision),
            events: vec![event.clone()],
            ..Default::default()
        };
        let bytes: Bytes = alone.encode_to_vec().into();
        let event_at = bytes.len() - event.encoded_len();
        Self {
            revision,
            bytes,
            event_at,
            received,
        }
    }

    /// The change's `mvccpb.Event`.
    pub fn event(&self) -> &[u8] {
        &self.bytes[self.event_at..]
    }

    /// The response of a watch of id 0 holding this change alone.
    pub fn alone(&self) -> &[u8] {
        &self.bytes
    }
}

/// A header at `revision`. watchproxy is no member of etcd's cluster:
/// it names neither a cluster, a member nor a raft term.
pub fn header(revision: Revision) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision: revision as i64,
        ..Default::default()
    })
}

/// An object as etcd stores it; its key and value share the object's
/// buffer.
pub fn key_value(o: &Object, with_value: bool) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: key_of(o),
        create_revision: o.stored.create_revision as i64,
        mod_revision: o.revision as i64,
        version: o.stored.version,
        value: match with_value {
            true => o.value_bytes(),
            false => Bytes::new(),
        },
        lease: o.stored.lease,
    }
}

fn key_of(o: &Object) -> Bytes {
    o.wire.slice_ref(o.key_bytes())
}

/// [`event`], encoded once for every stream that sends it.
pub fn encoded_event(view: &View, prev_kv: bool) -> Encoded {
    let shared = view.etcd_encoded[prev_kv as usize].get_or_init(|| {
        let e = Encoded::new(view.revision, &event(view, prev_kv), None);
        (e.bytes, e.event_at)
    });
    Encoded {
        revision: view.revision,
        bytes: shared.0.clone(),
        event_at: shared.1,
        received: view.received,
    }
}

/// A change as etcd's watch shows it: a PUT of the new state, or a DELETE
/// of the key at the change's revision; with the state before, when asked
/// and the watcher was shown it. An object that enters a watcher's
/// selection (a creation, or a change that brings it into a forced
/// selector) is ADDED for that watcher: what it held before is nothing the
/// watcher may see, and etcd sends no earlier state for a creation either.
pub fn event(view: &View, prev_kv: bool) -> mvccpb::Event {
    let (kind, kv) = match view.kind {
        EventType::Added | EventType::Modified => (Kind::Put, key_value(&view.object, true)),
        EventType::Deleted => (
            Kind::Delete,
            mvccpb::KeyValue {
                key: key_of(&view.object),
                mod_revision: view.revision as i64,
                ..Default::default()
            },
        ),
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv),
        prev_kv: (view.prev.as_ref())
            .filter(|_| prev_kv && view.kind != EventType::Added)
            .map(|p| key_value(p, true)),
    }
}
