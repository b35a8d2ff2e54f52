//! What a watch of an etcd Watch stream showed, as etcd's client sees it.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures::Stream;
use smallvec::SmallVec;

use tonic::Status;

use super::super::batch::{compacted, Outgoing};
use super::super::keys::KeyRange;
use super::super::merge::{Seen, Watched};
use super::super::wire::{encoded_event, header, Encoded};
use super::EtcdStream;
use crate::api::error::{etcd_status, ApiError};
use crate::dispatch::Offer;
use crate::etcdpb::etcdserverpb::WatchResponse;
use crate::etcdpb::mvccpb;
use crate::object::EventType;

/// What a watch shows next; its failure boxed, so that its changes move
/// through the stream small.
pub(in super::super) type Next = Result<Seen, Box<ApiError>>;

/// What a watch's client asked to be shown of its changes.
#[derive(Debug, Clone, Copy)]
pub(in super::super) struct Asked {
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
}

impl Asked {
    /// Whether its client asked not to be shown a put (`put`) or a
    /// deletion.
    fn hides(&self, put: bool) -> bool {
        (put && self.no_put) || (!put && self.no_delete)
    }
}

/// One watch of the stream: what it follows, with what its client asked
/// for at hand, so that a change is shown without a lookup.
pub(in super::super) struct Watch {
    pub feed: Watched,
    /// Its range, when the caches it follows hold keys outside it: their
    /// changes there are passed over.
    pub range: Option<KeyRange>,
    pub asked: Asked,
}

impl Watch {
    /// Its next change inside its range.
    #[inline]
    fn poll_seen(&mut self, cx: &mut Context<'_>) -> Poll<Option<Next>> {
        loop {
            let seen = match std::task::ready!(Pin::new(&mut self.feed).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                Some(Ok(seen)) => seen,
            };
            if let (Seen::Change(view), Some(range)) = (&seen, &self.range) {
                if view.resync_from.is_none() && !range.contains(view.object.key_bytes()) {
                    continue;
                }
            }
            return Poll::Ready(Some(Ok(seen)));
        }
    }
}

/// The watches of a stream, by id, polled in turn: each poll starts after
/// the watch that showed something last, so a busy watch does not keep
/// the others waiting. Most streams hold one watch.
#[derive(Default)]
pub(in super::super) struct WatchSet {
    /// The first inline, in the stream's own allocation: one fewer place
    /// in memory to reach per change.
    watches: SmallVec<[(i64, Watch); 1]>,
    next: usize,
    /// How many follow no cache (all their keys read from etcd).
    without_cache: usize,
}

impl WatchSet {
    pub fn insert(&mut self, id: i64, watch: Watch) {
        self.without_cache += usize::from(!watch.feed.follows_a_cache());
        self.watches.push((id, watch));
    }

    pub fn remove(&mut self, id: i64) -> Option<Watch> {
        let at = self.watches.iter().position(|(w, _)| *w == id)?;
        Some(self.remove_at(at))
    }

    fn remove_at(&mut self, at: usize) -> Watch {
        let (_, watch) = self.watches.swap_remove(at);
        self.without_cache -= usize::from(!watch.feed.follows_a_cache());
        watch
    }

    /// Whether it holds watches and every one follows a cache, whose end
    /// at shutdown ends it.
    pub fn all_follow_a_cache(&self) -> bool {
        !self.watches.is_empty() && self.without_cache == 0
    }

    pub fn values(&self) -> impl Iterator<Item = &Watch> {
        self.watches.iter().map(|(_, w)| w)
    }

    /// The next change of any watch, with its id and what its client
    /// asked for; a watch that ended is dropped.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i64, Next, Asked)>> {
        let mut tried = 0;
        while tried < self.watches.len() {
            let at = match self.next + tried {
                at if at < self.watches.len() => at,
                at => at % self.watches.len(),
            };
            let len = self.watches.len();
            let (id, watch) = &mut self.watches[at];
            match watch.poll_seen(cx) {
                Poll::Ready(Some(seen)) => {
                    // Kept below the length, so that a stream of one watch
                    // divides nothing.
                    self.next = if at + 1 < len { at + 1 } else { 0 };
                    return Poll::Ready(Some((*id, seen, watch.asked)));
                }
                Poll::Ready(None) => {
                    self.remove_at(at);
                }
                Poll::Pending => tried += 1,
            }
        }
        match self.watches.is_empty() {
            true => Poll::Ready(None),
            false => Poll::Pending,
        }
    }
}

impl EtcdStream {
    /// What watch `id` showed, as etcd's client sees it; a failure that
    /// is not the watch's alone ends the stream with its status.
    pub(super) fn take(&mut self, id: i64, seen: Next, asked: Asked) -> Result<(), Status> {
        match seen {
            Ok(Seen::Change(view)) if view.resync_from.is_some() => {
                // etcd's history was lost and the cache listed again at
                // the view's revision: etcd's clients know this as a
                // compaction, and read again.
                self.close(id);
                self.batch
                    .push(compacted(id, view.revision, view.revision + 1));
            }
            Ok(Seen::Change(view)) => {
                let put = view.kind != EventType::Deleted;
                if !asked.hides(put) {
                    self.batch.event(id, encoded_event(&view, asked.prev_kv));
                }
            }
            Ok(Seen::Forwarded(revision, e)) => {
                let put = e.r#type == mvccpb::event::EventType::Put as i32;
                if !asked.hides(put) {
                    self.batch.event(id, Encoded::new(revision, &e, None));
                }
            }
            Ok(Seen::Progress(revision, true)) if asked.progress_notify => {
                self.batch.push(WatchResponse {
                    header: header(revision),
                    watch_id: id,
                    ..Default::default()
                });
            }
            Ok(Seen::Progress(..)) => {}
            Ok(Seen::Canceled {
                current,
                compact_revision,
                reason,
            }) => {
                self.close(id);
                self.batch.push(WatchResponse {
                    header: header(current),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compact_revision as i64,
                    cancel_reason: reason,
                    ..Default::default()
                });
            }
            Err(e) => match *e {
                ApiError::FellBehind {
                    oldest, current, ..
                } => {
                    self.close(id);
                    self.batch.push(compacted(id, current, oldest + 1));
                }
                e => return Err(etcd_status(e)),
            },
        }
        Ok(())
    }

    /// Takes what the watches have ready, at most `max` of it: how much,
    /// and whether every watch was then found waiting.
    pub(super) fn take_ready(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Result<(usize, bool), Status> {
        let mut taken = 0;
        while taken < max {
            match self.streams.poll_next(cx) {
                Poll::Ready(Some((id, shown, asked))) => self.take(id, shown, asked)?,
                Poll::Ready(None) => break,
                Poll::Pending => return Ok((taken, true)),
            }
            taken += 1;
        }
        Ok((taken, false))
    }

    /// A lone change, the common case, answered without the batch: the
    /// first thing a stream with nothing waiting takes from its watches,
    /// sent at once when the watches have nothing after it. Anything else
    /// goes to the batch as [`EtcdStream::take_ready`] puts it.
    pub(super) fn take_lone(&mut self, cx: &mut Context<'_>) -> Result<Lone, Status> {
        let (id, seen, asked) = match self.streams.poll_next(cx) {
            Poll::Pending | Poll::Ready(None) => {
                self.waiting = true;
                return Ok(Lone::Waiting);
            }
            Poll::Ready(Some(next)) => next,
        };
        let change = match seen {
            Ok(Seen::Change(view)) if view.resync_from.is_none() => view,
            seen => {
                self.take(id, seen, asked)?;
                return Ok(Lone::More);
            }
        };
        let put = change.kind != EventType::Deleted;
        if asked.hides(put) {
            return Ok(Lone::More);
        }
        let event = encoded_event(&change, asked.prev_kv);
        match self.streams.poll_next(cx) {
            Poll::Pending | Poll::Ready(None) => {
                self.waiting = true;
                Ok(Lone::Alone(Outgoing::Changes {
                    watch_id: id,
                    fragment: false,
                    events: smallvec::smallvec![event],
                }))
            }
            Poll::Ready(Some((next, seen, asked))) => {
                self.batch.event(id, event);
                self.take(next, seen, asked)?;
                Ok(Lone::More)
            }
        }
    }

    /// The response for a live change its connection's task takes straight
    /// from the sort of its inbox (see
    /// [`crate::dispatch::Inbox::collect_taking`]), when the change is
    /// alone in its revision and for the stream's one watch, a cache's,
    /// and nothing is due before it: no response waiting, no request to
    /// read or answer, no end, no credential ended; `fits` says whether a
    /// message of so many bytes goes out whole now. None: the change goes
    /// through the queue.
    pub(crate) fn offer(
        &mut self,
        offer: &Offer<'_>,
        fits: impl FnOnce(usize) -> bool,
    ) -> Option<Outgoing> {
        let view = offer.view;
        if !offer.alone()
            || !self.batch.is_empty()
            || self.end.is_some()
            || self.ended
            || self.pending.is_some()
            || self.requests_woken.woken.load(Ordering::Acquire)
            || self.grant.may_have_ended()
            || view.resync_from.is_some()
        {
            return None;
        }
        let [(id, watch)] = self.streams.watches.as_mut_slice() else {
            return None;
        };
        let Watched::One(stream) = &mut watch.feed else {
            return None;
        };
        let inside = (watch.range.as_ref()).is_none_or(|r| r.contains(view.object.key_bytes()));
        let put = view.kind != EventType::Deleted;
        if stream.place() != offer.queue || !inside || watch.asked.hides(put) {
            return None;
        }
        let response = Outgoing::Changes {
            watch_id: *id,
            fragment: false,
            events: smallvec::smallvec![encoded_event(view, watch.asked.prev_kv)],
        };
        (fits(response.encoded_len()) && stream.take_live(view)).then_some(response)
    }

    /// Reads what [`EtcdStream::offer`] reads, for a connection that reads
    /// every stream a sort's changes may be offered to before offering any
    /// (see [`crate::dispatch::Taker::ahead`]): the stream's own lines,
    /// its requests' flag, its watch's range and queue.
    pub(crate) fn ahead(&self) -> u64 {
        let mut seen = u64::from(self.requests_woken.woken.load(Ordering::Relaxed))
            ^ u64::from(self.batch.is_empty())
            ^ u64::from(self.pending.is_some() || self.end.is_some());
        if let Some((id, watch)) = self.streams.watches.first() {
            seen ^= *id as u64 ^ u64::from(watch.range.as_ref().is_some_and(|r| r.contains(&[])));
            if let Watched::One(stream) = &watch.feed {
                seen ^= u64::from(stream.place() == Default::default());
            }
        }
        seen
    }

    fn close(&mut self, id: i64) {
        self.open.remove(&id);
        self.streams.remove(id);
    }
}

/// What [`EtcdStream::take_lone`] found.
pub(super) enum Lone {
    /// One change, and nothing after it: its response.
    Alone(Outgoing),
    /// Every watch is waiting.
    Waiting,
    /// More than one thing: in the batch, where the rest go.
    More,
}
