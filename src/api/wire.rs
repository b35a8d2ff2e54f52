//! The wire form of what the API sends: objects, pages and watch events as
//! `watchproxy.v1` messages. A change is encoded once for all its watchers
//! (the dispatcher calls [`encode_event`]), on top of the object's own
//! encoding made when it was read.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, Bytes};
use prost::Message;

use super::compression::Codec;
use crate::dispatch::{Compressed, Encoded, View};
use crate::object::{EventType, Object, Revision};
use crate::pb;

/// One `WatchEvent` of a watch stream, as it is written to the wire.
pub enum WatchMessage {
    /// A live or replayed change. Live changes carry the encoding every
    /// watcher shares, and it is copied straight from them to the wire.
    Change(Arc<View>),
    /// An initial object, shared by the watches that start from one
    /// state.
    Initial(Arc<Packed>),
    /// Made for this watcher: bookmarks.
    Own(Encoded),
}

/// An encoded message shared by the streams that send it, and its
/// compressed forms, each made by the first stream that needs it.
#[derive(Debug, Default)]
pub struct Packed {
    pub encoded: Encoded,
    compressed: Compressed,
}

impl Packed {
    pub fn new(encoded: Encoded) -> Self {
        Self {
            encoded,
            compressed: Default::default(),
        }
    }

    /// Its form in `codec`, and whether this call made it; none when
    /// compressing does not shrink it.
    pub fn compressed(&self, codec: Codec) -> (Option<&Bytes>, bool) {
        (self.compressed).get_or_make(codec.slot(), || codec.compress(&self.encoded.to_bytes()))
    }
}

impl WatchMessage {
    /// The message's length when its bytes are at hand (0 for a change
    /// read back from the window, which is encoded as it is written).
    pub fn len_hint(&self) -> usize {
        match self {
            WatchMessage::Own(e) => e.size(),
            WatchMessage::Initial(p) => p.encoded.size(),
            WatchMessage::Change(view) => view.encoded.as_ref().map_or(0, Encoded::size),
        }
    }

    /// A change's form compressed with `codec`, made once for every stream
    /// that sends it; none where it would not shrink.
    pub fn compressed_change(view: &View, codec: Codec) -> Option<&Bytes> {
        let (form, _) = (view.compressed).get_or_make(codec.slot(), || {
            codec.compress(&change_encoding(view).to_bytes())
        });
        form
    }

    /// When its change reached the cache, for a live change.
    pub fn received(&self) -> Option<std::time::Instant> {
        match self {
            WatchMessage::Change(view) => view.received,
            _ => None,
        }
    }

    /// Writes the message to `dst`.
    pub fn write_to(&self, dst: &mut impl BufMut) {
        let e = match self {
            WatchMessage::Own(e) => e,
            WatchMessage::Initial(p) => &p.encoded,
            WatchMessage::Change(view) => &*change_encoding(view),
        };
        dst.put_slice(&e.head);
        dst.put_slice(&e.body);
    }

    /// The message compressed with `codec`, made once for every stream
    /// that sends it; none for bookmarks, and where it would not shrink.
    pub fn compressed(&self, codec: Codec) -> Option<Bytes> {
        let (form, _) = match self {
            WatchMessage::Own(_) => return None,
            WatchMessage::Initial(p) => p.compressed(codec),
            WatchMessage::Change(view) => (Self::compressed_change(view, codec), false),
        };
        form.cloned()
    }
}

/// A change's encoding: the one shared by its watchers, or, for a change
/// read back from the window, made for this watcher.
fn change_encoding(view: &View) -> Cow<'_, Encoded> {
    match &view.encoded {
        Some(e) => Cow::Borrowed(e),
        None => Cow::Owned(encode_event(
            view.kind,
            &view.object,
            view.revision,
            view.resync_from,
        )),
    }
}

/// Encodes a change as a `WatchEvent`, with the version to resume from
/// after it. At the object's own revision (every event but DELETED) the
/// message is a few bytes of header followed by the object's encoding made
/// when it was read, so no watcher encodes the object again.
///
/// An event of a resync is marked and resumes from `resync_from`; its
/// object keeps its own version, a DELETED the event's (the list's).
pub fn encode_event(
    kind: EventType,
    o: &Object,
    revision: Revision,
    resync_from: Option<Revision>,
) -> Encoded {
    let shown = match (resync_from, kind) {
        (Some(_), EventType::Added | EventType::Modified) => o.revision,
        _ => revision,
    };
    let resume = resync_from.unwrap_or(revision);
    encode(kind, o, shown, resync_from.is_some(), Some(resume))
}

/// An ADDED event of an initial state: the object at its own version, and
/// no version to resume from (the state's is on the bookmark ending it).
pub fn encode_initial(o: &Object) -> Encoded {
    encode(EventType::Added, o, o.revision, false, None)
}

fn encode(
    kind: EventType,
    o: &Object,
    shown: Revision,
    resync: bool,
    resume: Option<Revision>,
) -> Encoded {
    use prost::encoding::{encode_key, encode_varint, string, WireType};
    if shown != o.revision || o.wire.is_empty() {
        let mut event = event_pb(kind, o, shown);
        event.resync = resync;
        event.resume_resource_version = resume.map(|r| r.to_string()).unwrap_or_default();
        return Encoded {
            head: Bytes::from(event.encode_to_vec()),
            body: Bytes::new(),
        };
    }
    // Fields before the object's, which ends the message: a protobuf
    // reader takes fields in any order.
    let mut head = Vec::with_capacity(32);
    encode_key(1, WireType::Varint, &mut head);
    encode_varint(event_type_pb(kind) as u64, &mut head);
    if resync {
        prost::encoding::bool::encode(4, &true, &mut head);
    }
    if let Some(resume) = resume {
        string::encode(6, &resume.to_string(), &mut head);
    }
    encode_key(2, WireType::LengthDelimited, &mut head);
    encode_varint(o.wire.len() as u64, &mut head);
    Encoded {
        head: Bytes::from(head),
        body: o.wire.clone(),
    }
}

/// One ADDED event carrying `objects` (a batch of an initial state), each
/// at its own revision, built on the objects' own encodings.
pub fn encode_added_batch(objects: &[Arc<Object>]) -> Encoded {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let mut head = Vec::with_capacity(4);
    encode_key(1, WireType::Varint, &mut head);
    encode_varint(pb::EventType::Added as u64, &mut head);
    let size: usize = objects.iter().map(|o| o.wire.len() + 8).sum();
    let mut body = bytes::BytesMut::with_capacity(size);
    for o in objects {
        let own;
        let wire = match o.wire.is_empty() {
            false => &o.wire,
            true => {
                own = Bytes::from(object_pb(o, o.revision).encode_to_vec());
                &own
            }
        };
        encode_key(5, WireType::LengthDelimited, &mut body);
        encode_varint(wire.len() as u64, &mut body);
        body.put_slice(wire);
    }
    Encoded {
        head: Bytes::from(head),
        body: body.freeze(),
    }
}

/// A BOOKMARK: only a resource version, and whether it ends the initial
/// events or a resync.
pub fn encode_bookmark(revision: Revision, initial_events_end: bool, resync: bool) -> Encoded {
    let bookmark = pb::WatchEvent {
        r#type: pb::EventType::Bookmark as i32,
        object: Some(pb::Object {
            resource_version: revision.to_string(),
            ..Default::default()
        }),
        initial_events_end,
        resync,
        objects: Vec::new(),
        resume_resource_version: revision.to_string(),
    };
    Encoded {
        head: Bytes::from(bookmark.encode_to_vec()),
        body: Bytes::new(),
    }
}

pub fn object_pb(o: &Object, revision: Revision) -> pb::Object {
    pb::Object {
        key: o.key().to_owned(),
        namespace: o.namespace().to_owned(),
        name: o.name().to_owned(),
        resource_version: revision.to_string(),
        labels: o.labels().to_map(),
        value: o.value_bytes(),
    }
}

fn event_type_pb(kind: EventType) -> pb::EventType {
    match kind {
        EventType::Added => pb::EventType::Added,
        EventType::Modified => pb::EventType::Modified,
        EventType::Deleted => pb::EventType::Deleted,
    }
}

fn event_pb(kind: EventType, o: &Object, revision: Revision) -> pb::WatchEvent {
    pb::WatchEvent {
        r#type: event_type_pb(kind) as i32,
        object: Some(object_pb(o, revision)),
        initial_events_end: false,
        resync: false,
        objects: Vec::new(),
        resume_resource_version: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Resource;

    #[test]
    fn events_built_on_the_objects_own_encoding_decode_as_if_encoded_whole() {
        let mut r = Resource::for_tests(&[]);
        r.prefix = "/registry/pods".into();
        let value = br#"{"metadata":{"labels":{"app":"web"}},"spec":{"x":1}}"#;
        let o = r
            .decode(b"/registry/pods/ns/a", value, 42)
            .expect("decodes");
        assert_eq!(o.value(), value, "the value is the end of the encoding");
        for (kind, revision) in [
            (EventType::Added, 42),
            (EventType::Modified, 42),
            (EventType::Deleted, 50),
        ] {
            let e = encode_event(kind, &o, revision, None);
            assert_eq!(
                e.body.is_empty(),
                revision != o.revision,
                "the object's bytes are shared unless its version differs"
            );
            let decoded = pb::WatchEvent::decode(e.to_bytes()).unwrap();
            let mut whole = event_pb(kind, &o, revision);
            whole.resume_resource_version = revision.to_string();
            assert_eq!(decoded, whole);
        }
        let initial = pb::WatchEvent::decode(encode_initial(&o).to_bytes()).unwrap();
        assert_eq!(initial, event_pb(EventType::Added, &o, 42));
    }

    #[test]
    fn a_resync_shows_objects_at_their_own_version_and_resumes_from_its_start() {
        let r = Resource::for_tests(&[]);
        let o = r.decode(b"/p/ns/a", br#"{"a":1}"#, 42).unwrap();
        let (from, listed) = (30, 60);
        for (kind, version) in [
            (EventType::Added, 42),
            (EventType::Modified, 42),
            (EventType::Deleted, listed),
        ] {
            let e = encode_event(kind, &o, listed, Some(from));
            assert_eq!(e.body.is_empty(), kind == EventType::Deleted);
            let decoded = pb::WatchEvent::decode(e.to_bytes()).unwrap();
            let mut want = event_pb(kind, &o, version);
            want.resync = true;
            want.resume_resource_version = from.to_string();
            assert_eq!(decoded, want, "{kind}");
        }
        let end = pb::WatchEvent::decode(encode_bookmark(listed, false, true).to_bytes()).unwrap();
        assert_eq!(end.resume_resource_version, listed.to_string());
        assert!(end.resync);
    }

    #[test]
    fn a_batch_decodes_as_the_added_objects_in_order() {
        let r = Resource::for_tests(&[]);
        let objects: Vec<Arc<Object>> = (1..4)
            .map(|i| {
                let key = format!("/p/ns/o{i}");
                Arc::new(r.decode(key.as_bytes(), br#"{"a":1}"#, i).unwrap())
            })
            .collect();
        let decoded = pb::WatchEvent::decode(encode_added_batch(&objects).to_bytes()).unwrap();
        assert_eq!(decoded.r#type, pb::EventType::Added as i32);
        assert_eq!(decoded.object, None);
        let want: Vec<pb::Object> = objects.iter().map(|o| object_pb(o, o.revision)).collect();
        assert_eq!(decoded.objects, want);
    }
}
