//! The responses of an etcd Watch stream: a watch's changes taken
//! together go in one response, cut (between revisions, or into fragments
//! where the watch allows) to the message limit. A change is encoded as
//! etcd's `mvccpb.Event` once, for every stream that sends it; only the
//! response around it is a stream's own.

use std::collections::VecDeque;

use bytes::BufMut;
use prost::encoding::{encoded_len_varint, key_len};
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
    /// Anything but changes: a creation, a cancel, progress. Boxed: they
    /// are few, and changes move through the stream small.
    Message(Box<WatchResponse>),
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

/// The one-byte key of field `field` (below 16) of wire type `wire`.
const fn key(field: u32, wire: u8) -> u8 {
    ((field << 3) as u8) | wire
}
const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

/// Writes `v` as a varint at `at` of `buf`, which has room for it.
#[inline]
fn put_varint(buf: &mut [u8], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        buf[*at] = (v as u8) | 0x80;
        v >>= 7;
        *at += 1;
    }
    buf[*at] = v as u8;
    *at += 1;
}

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

    /// The whole response, encoded once for every stream, where it is a
    /// lone change of a watch of id 0.
    fn alone(watch_id: i64, fragment: bool, events: &[Encoded]) -> Option<&[u8]> {
        match events {
            [e] if watch_id == 0 && !fragment => Some(e.alone()),
            _ => None,
        }
    }

    /// The revision its header names: the last change's, as etcd's does.
    fn revision(events: &[Encoded]) -> u64 {
        events.last().map_or(0, |e| e.revision)
    }

    /// An upper bound of [`Outgoing::encoded_len`] for changes, cheap to
    /// take: what a response's cut is decided by, and the room its
    /// writing reserves.
    pub fn len_hint(&self) -> usize {
        match self {
            Outgoing::Message(m) => m.encoded_len(),
            Outgoing::Changes { events, .. } => {
                HEAD_BYTES
                    + (events.iter())
                        .map(|e| KEY_BYTES + e.event().len())
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
        if let Some(alone) = Self::alone(watch_id, fragment, events) {
            return alone.len();
        }
        len + (events.iter())
            .map(|e| e.event().len())
            .map(|n| key_len(EVENTS) + encoded_len_varint(n as u64) + n)
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
        if let Some(alone) = Self::alone(watch_id, fragment, events) {
            return buf.put_slice(alone);
        }
        // What comes before the changes, gathered and written at once: a
        // buffer takes a varint byte by byte. The header is written by
        // hand: its revision is all it holds.
        let mut head = [0u8; HEAD_BYTES];
        let mut at = 0;
        let revision = Self::revision(events);
        head[at] = key(HEADER, LENGTH_DELIMITED);
        at += 1;
        put_varint(&mut head, &mut at, header_len(revision) as u64);
        if revision != 0 {
            head[at] = key(HEADER_REVISION, VARINT);
            at += 1;
            put_varint(&mut head, &mut at, revision);
        }
        if watch_id != 0 {
            head[at] = key(WATCH_ID, VARINT);
            at += 1;
            put_varint(&mut head, &mut at, watch_id as u64);
        }
        if fragment {
            head[at..at + 2].copy_from_slice(&[key(FRAGMENT, VARINT), 1]);
            at += 2;
        }
        buf.put_slice(&head[..at]);
        for e in events {
            let mut key_and_len = [0u8; KEY_BYTES];
            key_and_len[0] = key(EVENTS, LENGTH_DELIMITED);
            let mut at = 1;
            put_varint(&mut key_and_len, &mut at, e.event().len() as u64);
            buf.put_slice(&key_and_len[..at]);
            buf.put_slice(e.event());
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
    gathering: SmallVec<[(i64, usize); 2]>,
    /// Where this turn's responses start in `out`.
    turn: usize,
    /// An upper bound of the largest response of this turn: while it is
    /// within the limit, none is looked at to be cut.
    turn_bound: usize,
}

impl Batch {
    pub fn push(&mut self, response: WatchResponse) {
        self.gathering.retain(|(id, _)| *id != response.watch_id);
        let response = Outgoing::Message(Box::new(response));
        self.turn_bound = self.turn_bound.max(response.len_hint());
        self.out.push_back(response);
    }

    pub fn event(&mut self, id: i64, event: Encoded) {
        // Each response's bound is within the sum of all of them.
        self.turn_bound += KEY_BYTES + event.event().len();
        let gathered = (self.gathering.iter())
            .find(|(w, _)| *w == id)
            .and_then(|&(_, at)| self.out.get_mut(at));
        match gathered {
            Some(Outgoing::Changes { events, .. }) => events.push(event),
            _ => {
                self.turn_bound += HEAD_BYTES;
                self.gathering.push((id, self.out.len()));
                self.out.push_back(Outgoing::Changes {
                    watch_id: id,
                    fragment: false,
                    events: smallvec::smallvec![event],
                });
            }
        }
    }

    /// Ends the turn: its responses over `max` bytes are cut.
    #[inline]
    pub fn end_turn(&mut self, fragments: impl Fn(i64) -> bool, max: usize) {
        self.gathering.clear();
        if std::mem::take(&mut self.turn_bound) > max {
            self.cut(fragments, max);
        }
        self.turn = self.out.len();
    }

    /// Cuts this turn's responses over `max` bytes.
    #[cold]
    fn cut(&mut self, fragments: impl Fn(i64) -> bool, max: usize) {
        let turn = self.turn;
        let over = |r: &Outgoing| r.len_hint() > max && r.encoded_len() > max;
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
        self.turn_bound = 0;
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
        let len = e.event().len() + 8;
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
        Encoded::new(revision as Revision, &e, None)
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
        let cases = [(5, 3, false, 2), (300, 0, true, 2), (1 << 40, 7, false, 2)];
        // A lone change of watch 0 is its shared encoding, as it is.
        let alone = [(5, 0, false, 1), (1 << 40, 0, false, 1), (9, 0, false, 2)];
        for (revision, id, fragment, n) in cases.into_iter().chain(alone) {
            let events = [put("/a", revision), put("/b", revision)];
            let events = &events[..n];
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
                    .map(|e| mvccpb::Event::decode(e.event()).unwrap())
                    .collect(),
                ..Default::default()
            };
            assert_eq!(ours, theirs.encode_to_vec(), "{revision} {id} {fragment}");
            assert_eq!(r.encoded_len(), ours.len());
            assert!(r.len_hint() >= ours.len());
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
