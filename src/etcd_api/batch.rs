//! The responses of an etcd Watch stream: a watch's changes taken
//! together go in one response, cut (between revisions, or into fragments
//! where the watch allows) to the message limit. A change is encoded as
//! etcd's `mvccpb.Event` once, for every stream that sends it; only the
//! response around it is a stream's own.

use std::collections::VecDeque;

use bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use smallvec::SmallVec;

use super::wire::{header, Encoded};
use crate::etcdpb::etcdserverpb::WatchResponse;
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
        /// Most responses carry one change: kept inline, with no
        /// allocation of its own.
        events: SmallVec<[Encoded; 1]>,
    },
}

/// `WatchResponse`'s fields, as etcd's `rpc.proto` numbers them.
const HEADER: u32 = 1;
const WATCH_ID: u32 = 2;
const FRAGMENT: u32 = 7;
const EVENTS: u32 = 11;
/// The most a response's fields before its changes take (each key and
/// varint at most 1 and 10 bytes), and a change's key and length.
const HEAD_BYTES: usize = 48;
const KEY_BYTES: usize = 12;
/// `ResponseHeader.revision`, the one field of [`header`] watchproxy sets.
const HEADER_REVISION: u32 = 3;

/// The bytes of a [`header`] at `revision`.
fn header_len(revision: u64) -> usize {
    match revision {
        0 => 0,
        r => key_len(HEADER_REVISION) + encoded_len_varint(r),
    }
}

impl Outgoing {
    /// When the oldest live change it carries reached its cache.
    pub fn received(&self) -> Option<std::time::Instant> {
        match self {
            Outgoing::Message(_) => None,
            Outgoing::Changes { events, .. } => events.iter().filter_map(|e| e.received).min(),
        }
    }

    /// The revision its header names: the last change's, as etcd's does.
    fn revision(events: &[Encoded]) -> u64 {
        events.last().map_or(0, |e| e.revision)
    }

    /// An upper bound of [`Outgoing::encoded_len`] for changes, cheap to
    /// take: what a response's cut is decided by.
    fn size_bound(&self) -> usize {
        match self {
            Outgoing::Message(m) => m.encoded_len(),
            Outgoing::Changes { events, .. } => {
                HEAD_BYTES
                    + (events.iter())
                        .map(|e| KEY_BYTES + e.bytes.len())
                        .sum::<usize>()
            }
        }
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
        let header = header_len(Self::revision(events));
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
        // What comes before the changes, gathered and written at once: a
        // buffer takes a varint byte by byte. The header is written by
        // hand: its revision is all it holds.
        let mut head = [0u8; HEAD_BYTES];
        let mut at = &mut head[..];
        let revision = Self::revision(events);
        encode_key(HEADER, WireType::LengthDelimited, &mut at);
        encode_varint(header_len(revision) as u64, &mut at);
        if revision != 0 {
            encode_key(HEADER_REVISION, WireType::Varint, &mut at);
            encode_varint(revision, &mut at);
        }
        if watch_id != 0 {
            encode_key(WATCH_ID, WireType::Varint, &mut at);
            encode_varint(watch_id as u64, &mut at);
        }
        if fragment {
            encode_key(FRAGMENT, WireType::Varint, &mut at);
            encode_varint(1, &mut at);
        }
        let written = HEAD_BYTES - at.len();
        buf.put_slice(&head[..written]);
        for e in events {
            let mut key = [0u8; KEY_BYTES];
            let mut at = &mut key[..];
            encode_key(EVENTS, WireType::LengthDelimited, &mut at);
            encode_varint(e.bytes.len() as u64, &mut at);
            let written = KEY_BYTES - at.len();
            buf.put_slice(&key[..written]);
            buf.put_slice(&e.bytes);
        }
    }
}

/// The responses of a stream waiting to be sent, in order. A turn of the
/// stream adds to them: a watch's changes taken together go in one
/// response (split only between revisions, or, for a watch that allows
/// it, into fragments), until something else for that watch follows.
#[derive(Default)]
pub struct Batch {
    out: VecDeque<Outgoing>,
    /// Where each watch's changes are gathered in `out` this turn: a turn
    /// has few watches, looked for in order.
    gathering: Vec<(i64, usize)>,
    /// Where this turn's responses start in `out`.
    turn: usize,
}

impl Batch {
    pub fn push(&mut self, response: WatchResponse) {
        self.gathering.retain(|(id, _)| *id != response.watch_id);
        self.out.push_back(Outgoing::Message(response));
    }

    pub fn event(&mut self, id: i64, event: Encoded) {
        let at = match self.gathering.iter().find(|(w, _)| *w == id) {
            Some(&(_, at)) => at,
            None => {
                self.out.push_back(Outgoing::Changes {
                    watch_id: id,
                    fragment: false,
                    events: SmallVec::new(),
                });
                self.gathering.push((id, self.out.len() - 1));
                self.out.len() - 1
            }
        };
        if let Some(Outgoing::Changes { events, .. }) = self.out.get_mut(at) {
            events.push(event);
        }
    }

    /// Ends the turn: its responses over `max` bytes are cut.
    pub fn end_turn(&mut self, fragments: impl Fn(i64) -> bool, max: usize) {
        self.gathering.clear();
        if self.turn >= self.out.len() {
            return;
        }
        let turn = self.turn;
        let over = |r: &Outgoing| r.size_bound() > max && r.encoded_len() > max;
        if let Some(first) = (self.out.range(turn..)).position(over) {
            let rest: Vec<Outgoing> = self.out.drain(turn + first..).collect();
            for r in rest {
                match r {
                    Outgoing::Changes {
                        watch_id, events, ..
                    } if over(&r) => {
                        split(watch_id, events, max, fragments(watch_id), &mut self.out)
                    }
                    r => self.out.push_back(r),
                }
            }
        }
        self.turn = self.out.len();
    }

    /// The next response to send.
    pub fn pop_front(&mut self) -> Option<Outgoing> {
        let next = self.out.pop_front()?;
        self.turn = self.turn.saturating_sub(1);
        Some(next)
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Forgets every response not sent.
    pub fn clear(&mut self) {
        self.out.clear();
        self.gathering.clear();
        self.turn = 0;
    }
}

/// `events` of watch `id` in responses of at most `max` bytes where they
/// can be: cut between revisions, and, with `fragment`, inside one too,
/// each part but the last of a cut revision marked `fragment` as etcd
/// marks them.
fn split(
    id: i64,
    events: SmallVec<[Encoded; 1]>,
    max: usize,
    fragment: bool,
    out: &mut VecDeque<Outgoing>,
) {
    let part = |events: SmallVec<[Encoded; 1]>, fragment: bool| Outgoing::Changes {
        watch_id: id,
        fragment,
        events,
    };
    let mut current: SmallVec<[Encoded; 1]> = SmallVec::new();
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
        split(3, events.into(), 250, fragment, &mut out);
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
    fn changes_are_written_as_prost_writes_the_response() {
        for (revision, id, fragment) in [(5, 3, false), (300, 0, true), (1 << 40, 7, false)] {
            let events = [put("/a", revision), put("/b", revision)];
            let r = Outgoing::Changes {
                watch_id: id,
                fragment,
                events: events.iter().cloned().collect(),
            };
            let mut ours = Vec::new();
            r.encode_raw(&mut ours);
            let theirs = WatchResponse {
                header: header(revision as Revision),
                watch_id: id,
                fragment,
                events: (events.iter())
                    .map(|e| mvccpb::Event::decode(&e.bytes[..]).unwrap())
                    .collect(),
                ..Default::default()
            };
            assert_eq!(ours, theirs.encode_to_vec(), "{revision} {id} {fragment}");
            assert_eq!(r.encoded_len(), ours.len());
            assert!(r.size_bound() >= ours.len());
        }
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
        batch.end_turn(|_| false, usize::MAX);
        let sent: Vec<WatchResponse> = std::iter::from_fn(|| batch.pop_front())
            .map(|r| read(&r))
            .collect();
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
