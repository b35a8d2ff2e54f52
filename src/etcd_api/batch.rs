//! The responses of an etcd Watch stream: a watch's changes taken
//! together go in one response, cut (between revisions, or into fragments
//! where the watch allows) to the message limit. A change is encoded as
//! etcd's `mvccpb.Event` once, for every stream that sends it; only the
//! response around it is a stream's own.

use std::collections::VecDeque;

use bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use super::wire::{header, Encoded};
use crate::etcdpb::etcdserverpb::{ResponseHeader, WatchResponse};
use crate::object::Revision;

/// The watch id of a response that belongs to no one watch (a progress
/// answer, a refused creation), as etcd sends it.
pub const NO_WATCH: i64 = -1;

/// A response of an etcd Watch stream, as it is written.
#[derive(Debug)]
pub enum Outgoing {
    /// Anything but changes: a creation, a cancel, progress.
    Message(WatchResponse),
    /// Changes of one watch, in order; the header names the last one's
    /// revision, as etcd's does.
    Changes {
        watch_id: i64,
        /// More of the last revision follows in the next response.
        fragment: bool,
        events: Vec<Encoded>,
    },
}

/// `WatchResponse`'s fields, as etcd's `rpc.proto` numbers them.
const HEADER: u32 = 1;
const WATCH_ID: u32 = 2;
const FRAGMENT: u32 = 7;
const EVENTS: u32 = 11;

impl Outgoing {
    /// When the oldest live change it carries reached its cache.
    pub fn received(&self) -> Option<std::time::Instant> {
        match self {
            Outgoing::Message(_) => None,
            Outgoing::Changes { events, .. } => events.iter().filter_map(|e| e.received).min(),
        }
    }

    fn header(events: &[Encoded]) -> ResponseHeader {
        header(events.last().map_or(0, |e| e.revision)).unwrap_or_default()
    }

    pub fn encoded_len(&self) -> usize {
        let (watch_id, fragment, events) = match self {
            Outgoing::Message(m) => return m.encoded_len(),
            Outgoing::Changes {
                watch_id,
                fragment,
                events,
            } => (*watch_id, *fragment, events),
        };
        let header = Self::header(events).encoded_len();
        let mut len = key_len(HEADER) + encoded_len_varint(header as u64) + header;
        if watch_id != 0 {
            len += key_len(WATCH_ID) + encoded_len_varint(watch_id as u64);
        }
        if fragment {
            len += key_len(FRAGMENT) + 1;
        }
        len + (events.iter())
            .map(|e| key_len(EVENTS) + encoded_len_varint(e.bytes.len() as u64) + e.bytes.len())
            .sum::<usize>()
    }

    /// Writes it as etcd's `WatchResponse`, in field order.
    pub fn encode_raw(&self, buf: &mut impl BufMut) {
        let (watch_id, fragment, events) = match self {
            Outgoing::Message(m) => return m.encode_raw(buf),
            Outgoing::Changes {
                watch_id,
                fragment,
                events,
            } => (*watch_id, *fragment, events),
        };
        prost::encoding::message::encode(HEADER, &Self::header(events), buf);
        if watch_id != 0 {
            prost::encoding::int64::encode(WATCH_ID, &watch_id, buf);
        }
        if fragment {
            prost::encoding::bool::encode(FRAGMENT, &fragment, buf);
        }
        for e in events {
            encode_key(EVENTS, WireType::LengthDelimited, buf);
            encode_varint(e.bytes.len() as u64, buf);
            buf.put_slice(&e.bytes);
        }
    }
}

/// The responses one turn of the stream sends, in order: a watch's
/// changes taken together go in one response (split only between
/// revisions, or, for a watch that allows it, into fragments). Kept by
/// its stream from turn to turn, with its room.
#[derive(Default)]
pub struct Batch {
    responses: Vec<Outgoing>,
    /// Where each watch's changes are gathered, while nothing else for it
    /// has followed: a turn has few watches, looked for in order.
    gathering: Vec<(i64, usize)>,
}

impl Batch {
    pub fn push(&mut self, response: WatchResponse) {
        self.gathering.retain(|(id, _)| *id != response.watch_id);
        self.responses.push(Outgoing::Message(response));
    }

    pub fn event(&mut self, id: i64, event: Encoded) {
        let at = match self.gathering.iter().find(|(w, _)| *w == id) {
            Some(&(_, at)) => at,
            None => {
                self.responses.push(Outgoing::Changes {
                    watch_id: id,
                    fragment: false,
                    events: Vec::new(),
                });
                self.gathering.push((id, self.responses.len() - 1));
                self.responses.len() - 1
            }
        };
        if let Outgoing::Changes { events, .. } = &mut self.responses[at] {
            events.push(event);
        }
    }

    /// Moves the turn's responses to `out`, cut to `max` bytes, and
    /// starts the next turn.
    pub fn drain_into(
        &mut self,
        out: &mut VecDeque<Outgoing>,
        fragments: impl Fn(i64) -> bool,
        max: usize,
    ) {
        self.gathering.clear();
        for r in self.responses.drain(..) {
            match r {
                Outgoing::Changes {
                    watch_id, events, ..
                } if r.encoded_len() > max => {
                    split(watch_id, events, max, fragments(watch_id), out)
                }
                r => out.push_back(r),
            }
        }
    }
}

/// `events` of watch `id` in responses of at most `max` bytes where they
/// can be: cut between revisions, and, with `fragment`, inside one too,
/// each part but the last of a cut revision marked `fragment` as etcd
/// marks them.
fn split(id: i64, events: Vec<Encoded>, max: usize, fragment: bool, out: &mut VecDeque<Outgoing>) {
    let part = |events: Vec<Encoded>, fragment: bool| Outgoing::Changes {
        watch_id: id,
        fragment,
        events,
    };
    let mut current: Vec<Encoded> = Vec::new();
    let mut size = 0;
    let mut events = events.into_iter().peekable();
    while let Some(e) = events.next() {
        let len = e.bytes.len() + 8;
        let same_revision = current
            .last()
            .is_some_and(|last| last.revision == e.revision);
        if size + len > max && !current.is_empty() && (fragment || !same_revision) {
            out.push_back(part(std::mem::take(&mut current), same_revision));
            size = 0;
        }
        current.push(e);
        size += len;
        if events.peek().is_none() {
            out.push_back(part(std::mem::take(&mut current), false));
        }
    }
}

/// A creation refused for `why`.
pub fn refused(why: String) -> WatchResponse {
    WatchResponse {
        watch_id: NO_WATCH,
        created: true,
        canceled: true,
        cancel_reason: why,
        ..Default::default()
    }
}

/// Watch `id` canceled because the changes it needs are gone: it may
/// start again from `compact_revision`, after reading the state again.
pub fn compacted(id: i64, current: Revision, compact_revision: Revision) -> WatchResponse {
    WatchResponse {
        header: header(current),
        watch_id: id,
        canceled: true,
        compact_revision: compact_revision as i64,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdpb::mvccpb;

    fn put(key: &str, revision: i64) -> Encoded {
        let e = mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: key.as_bytes().to_vec().into(),
                mod_revision: revision,
                value: vec![b'v'; 100].into(),
                ..Default::default()
            }),
            prev_kv: None,
        };
        Encoded {
            revision: revision as Revision,
            received: None,
            bytes: e.encode_to_vec().into(),
        }
    }

    /// `r` as a client reads it.
    fn read(r: &Outgoing) -> WatchResponse {
        let mut buf = Vec::new();
        r.encode_raw(&mut buf);
        assert_eq!(buf.len(), r.encoded_len());
        WatchResponse::decode(&buf[..]).unwrap()
    }

    fn parts(fragment: bool) -> Vec<(Vec<i64>, bool)> {
        let events = vec![put("/a", 5), put("/b", 5), put("/c", 5), put("/d", 6)];
        let mut out = VecDeque::new();
        split(3, events, 250, fragment, &mut out);
        let revisions = |r: &WatchResponse| {
            r.events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect()
        };
        (out.iter().map(read))
            .map(|r| (revisions(&r), r.fragment))
            .collect()
    }

    #[test]
    fn a_revision_is_cut_only_into_fragments_and_only_when_asked() {
        assert_eq!(parts(false), [(vec![5, 5, 5], false), (vec![6], false)]);
        assert_eq!(parts(true), [(vec![5, 5], true), (vec![5, 6], false)]);
    }

    #[test]
    fn a_watchs_changes_gather_until_something_else_for_it_follows() {
        let mut batch = Batch::default();
        batch.event(1, put("/a", 5));
        batch.event(2, put("/b", 5));
        batch.event(1, put("/c", 6));
        batch.push(WatchResponse {
            watch_id: 1,
            canceled: true,
            ..Default::default()
        });
        batch.event(1, put("/d", 7));
        let mut out = VecDeque::new();
        batch.drain_into(&mut out, |_| false, usize::MAX);
        let sent: Vec<WatchResponse> = out.iter().map(read).collect();
        let shape: Vec<(i64, usize, bool)> = sent
            .iter()
            .map(|r| (r.watch_id, r.events.len(), r.canceled))
            .collect();
        assert_eq!(
            shape,
            [(1, 2, false), (2, 1, false), (1, 0, true), (1, 1, false)]
        );
        assert_eq!(sent[0].header.unwrap().revision, 6);
        assert_eq!(&sent[0].events[1].kv.as_ref().unwrap().key[..], b"/c");
    }
}
