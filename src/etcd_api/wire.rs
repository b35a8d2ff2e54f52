//! Objects and changes as etcd's messages show them.

use bytes::Bytes;
use prost::Message;

use crate::dispatch::View;
use crate::etcdpb::etcdserverpb::ResponseHeader;
use crate::etcdpb::mvccpb::{self, event::EventType as Kind};
use crate::object::{EventType, Object, Revision};

/// A change as etcd's `mvccpb.Event`, encoded.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub revision: Revision,
    pub bytes: Bytes,
    /// When the change reached its cache (live changes of a cache).
    pub received: Option<std::time::Instant>,
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
    let bytes = view.etcd_encoded[prev_kv as usize]
        .get_or_init(|| event(view, prev_kv).encode_to_vec().into())
        .clone();
    Encoded {
        revision: view.revision,
        bytes,
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
