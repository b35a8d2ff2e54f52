//! A watch whose range spans several served prefixes (and, forwarded, the
//! keys between them): the changes of each part merged in revision order.
//! The parts share etcd's revision space, so the merge is exact once each
//! part is known to have shown everything up to a revision: a change is
//! shown only when every part has got that far. A cache's watcher proves
//! it with a bookmark asked for on demand; a forwarded part with etcd's
//! progress notifications (`--experimental-watch-progress-notify-interval`
//! bounds how long the changes of the others wait while it is idle).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use prost::Message;

use super::forward;
use crate::access::HeldGrant;
use crate::api::error::{revoked, ApiError};
use crate::api::{Mark, Shown, WatchStream};
use crate::dispatch::View;
use crate::etcdpb::mvccpb;
use crate::object::Revision;

/// How often a part that holds the others back is asked again for the
/// revision it has shown everything up to.
const ASK_EVERY: Duration = Duration::from_millis(50);

/// Changes one merged watch holds at most while a part lags, and the
/// memory they may keep (the cache's objects, which the window would
/// otherwise let go, and etcd's events): past either the watch is canceled
/// as compacted and its client reads again.
pub const MAX_HELD: usize = 65_536;
pub const MAX_HELD_BYTES: u64 = 16 << 20;

/// What an etcd watch shows next.
pub enum Seen {
    /// A change of a cache.
    Change(Arc<View>),
    /// A change etcd sent, for keys outside the served prefixes (boxed:
    /// a cache's changes, far more common, move through the stream by
    /// value).
    Forwarded(Revision, Box<mvccpb::Event>),
    /// Every change up to the revision was shown; `notify`: as a progress
    /// notification, which a watch that asked for them is sent.
    Progress(Revision, bool),
    /// The watch cannot go on: `compact_revision` > 0 when the changes it
    /// needs are gone.
    Canceled {
        current: Revision,
        compact_revision: Revision,
        reason: String,
    },
}

/// What one watch of an etcd Watch stream follows. Most follow one cache:
/// that variant is kept inline, without an allocation of its own.
#[allow(clippy::large_enum_variant)]
pub enum Watched {
    /// The cache of the one resource its range lies in.
    One(WatchStream),
    Merged(Box<Merge>),
}

impl Watched {
    /// The revision everything shown so far is complete up to, where the
    /// watch itself knows it.
    pub fn through(&self) -> Option<Revision> {
        match self {
            Watched::One(_) => None,
            Watched::Merged(m) => Some(m.shown_through),
        }
    }
}

impl Watched {
    /// Whether it follows a cache, whose end at shutdown ends it.
    pub fn follows_a_cache(&self) -> bool {
        match self {
            Watched::One(_) => true,
            Watched::Merged(m) => (m.parts.iter()).any(|p| matches!(p.source, PartFeed::Cache(_))),
        }
    }
}

impl Stream for Watched {
    type Item = Result<Seen, ApiError>;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Watched::One(stream) => loop {
                let seen = match std::task::ready!(stream.poll_shown(cx)) {
                    None => return Poll::Ready(None),
                    Some(Err(e)) => Err(e),
                    Some(Ok(Shown::Change(view))) => Ok(Seen::Change(view)),
                    Some(Ok(Shown::Bookmark(r, mark))) => {
                        Ok(Seen::Progress(r, mark == Mark::Progress))
                    }
                    Some(Ok(Shown::Initial(_))) => continue,
                };
                return Poll::Ready(Some(seen));
            },
            Watched::Merged(m) => m.poll(cx),
        }
    }
}

/// Where a part's changes come from.
pub enum PartFeed {
    Cache(Box<WatchStream>),
    /// A gap between the served prefixes, watched on etcd.
    Etcd(Box<etcd_client::WatchStream>),
}

struct Part {
    source: PartFeed,
    /// Every change of the part up to here has been taken from it.
    through: Revision,
    /// Changes taken from it, waiting for the other parts to get as far.
    held: VecDeque<(Revision, Seen)>,
    /// A progress notification came since the last one shown.
    notified: bool,
}

/// The parts of one watch, merged in revision order.
pub struct Merge {
    parts: Vec<Part>,
    /// Every change up to here has been shown.
    shown_through: Revision,
    /// The progress last shown.
    progress_shown: Revision,
    held: usize,
    /// What the held changes keep, as [`weight`] counts it.
    held_bytes: u64,
    /// When the parts that hold the others back are asked next.
    ask: Pin<Box<tokio::time::Sleep>>,
    /// What allows the parts read from etcd, while it still does, and
    /// the waker its end wakes.
    gaps: Option<(HeldGrant, Arc<AtomicWaker>)>,
}

impl Merge {
    /// The parts, in key order, of a watch that has seen everything up to
    /// `after`; `gaps`: the grant its parts read from etcd hold.
    pub fn new(sources: Vec<PartFeed>, after: Revision, gaps: Option<HeldGrant>) -> Self {
        let gaps = gaps.map(|grant| {
            let woken = Arc::new(AtomicWaker::new());
            let alarm = woken.clone();
            grant.grant().on_revoke(move || alarm.wake());
            (grant, woken)
        });
        let parts = (sources.into_iter())
            .map(|source| Part {
                source,
                through: after,
                held: VecDeque::new(),
                notified: false,
            })
            .collect();
        Self {
            parts,
            shown_through: after,
            progress_shown: after,
            held: 0,
            held_bytes: 0,
            ask: Box::pin(tokio::time::sleep(Duration::ZERO)),
            gaps,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Seen, ApiError>>> {
        if let Some((grant, woken)) = &mut self.gaps {
            woken.register(cx.waker());
            if let Some(why) = grant.revoked() {
                self.gaps = None;
                return Poll::Ready(Some(Err(revoked(why, None))));
            }
        }
        for part in &mut self.parts {
            while self.held < MAX_HELD && self.held_bytes < MAX_HELD_BYTES {
                match part.poll_take(cx) {
                    Poll::Ready(Some(Taken::Changes(n, bytes))) => {
                        self.held += n;
                        self.held_bytes += bytes;
                    }
                    Poll::Ready(Some(Taken::Progress)) => {}
                    Poll::Ready(Some(Taken::End(end))) => return Poll::Ready(Some(*end)),
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => break,
                }
            }
        }
        let through = self.parts.iter().map(|p| p.through).min().unwrap_or(0);
        // The oldest change every part has got past, the first part's first
        // within a revision.
        let next = (self.parts.iter().enumerate())
            .filter_map(|(i, p)| p.held.front().map(|(r, _)| (*r, i)))
            .filter(|(r, _)| *r <= through)
            .min();
        if let Some((_, i)) = next {
            self.held -= 1;
            let (revision, seen) = self.parts[i].held.pop_front().expect("a held change");
            self.held_bytes -= weight(&seen);
            self.shown_through = self.shown_through.max(revision.saturating_sub(1));
            return Poll::Ready(Some(Ok(seen)));
        }
        self.shown_through = self.shown_through.max(through);
        if self.held >= MAX_HELD || self.held_bytes >= MAX_HELD_BYTES {
            return Poll::Ready(Some(Ok(Seen::Canceled {
                current: through,
                compact_revision: through + 1,
                reason: "the watch's parts fell too far apart".into(),
            })));
        }
        let notified = self.parts.iter().any(|p| p.notified);
        if notified && through > self.progress_shown {
            self.progress_shown = through;
            self.parts.iter_mut().for_each(|p| p.notified = false);
            return Poll::Ready(Some(Ok(Seen::Progress(through, true))));
        }
        let wanted = (self.parts.iter())
            .filter_map(|p| p.held.front().map(|(r, _)| *r))
            .min();
        if let Some(wanted) = wanted {
            while self.ask.as_mut().poll(cx).is_ready() {
                for part in self.parts.iter().filter(|p| p.through < wanted) {
                    if let PartFeed::Cache(stream) = &part.source {
                        stream.bookmark_now();
                    }
                }
                let next = tokio::time::Instant::now() + ASK_EVERY;
                self.ask.as_mut().reset(next);
            }
        }
        Poll::Pending
    }
}

/// What one turn of reading a part took.
enum Taken {
    /// How many changes, and their [`weight`].
    Changes(usize, u64),
    Progress,
    End(Box<Result<Seen, ApiError>>),
}

impl Part {
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<Option<Taken>> {
        match &mut self.source {
            PartFeed::Cache(stream) => {
                let shown = match std::task::ready!(stream.poll_shown(cx)) {
                    None => return Poll::Ready(None),
                    Some(Err(e)) => return Poll::Ready(Some(Taken::End(Box::new(Err(e))))),
                    Some(Ok(shown)) => shown,
                };
                Poll::Ready(Some(match shown {
                    // A resync ends the watch: shown at once.
                    Shown::Change(view) if view.resync_from.is_some() => {
                        Taken::End(Box::new(Ok(Seen::Change(view))))
                    }
                    Shown::Change(view) => {
                        // More of its revision may follow.
                        let revision = view.revision;
                        self.through = self.through.max(revision - 1);
                        let seen = Seen::Change(view);
                        let bytes = weight(&seen);
                        self.held.push_back((revision, seen));
                        Taken::Changes(1, bytes)
                    }
                    Shown::Bookmark(revision, mark) => {
                        self.through = self.through.max(revision);
                        self.notified |= mark == Mark::Progress;
                        Taken::Progress
                    }
                    Shown::Initial(_) => Taken::Progress,
                }))
            }
            PartFeed::Etcd(stream) => {
                let response = match std::task::ready!(stream.poll_next_unpin(cx)) {
                    None => return Poll::Ready(None),
                    Some(Err(e)) => {
                        let e = crate::source::EtcdError::Client(e);
                        return Poll::Ready(Some(Taken::End(Box::new(Err(e.into())))));
                    }
                    Some(Ok(r)) => r,
                };
                let current = response.header().map_or(0, |h| h.revision()) as Revision;
                if response.canceled() {
                    return Poll::Ready(Some(Taken::End(Box::new(Ok(Seen::Canceled {
                        current,
                        compact_revision: response.compact_revision() as Revision,
                        reason: response.cancel_reason().to_owned(),
                    })))));
                }
                let events = response.events();
                if events.is_empty() {
                    // A progress notification (or the watch's creation).
                    if !response.created() {
                        self.through = self.through.max(current);
                        self.notified = true;
                    }
                    return Poll::Ready(Some(Taken::Progress));
                }
                // etcd sends a revision whole in one response.
                let mut bytes = 0;
                for e in events {
                    let revision = e.kv().map_or(0, |kv| kv.mod_revision()) as Revision;
                    self.through = self.through.max(revision);
                    let seen = Seen::Forwarded(revision, Box::new(forward::event(e)));
                    bytes += weight(&seen);
                    self.held.push_back((revision, seen));
                }
                Poll::Ready(Some(Taken::Changes(events.len(), bytes)))
            }
        }
    }
}

/// About the memory a held change keeps.
fn weight(seen: &Seen) -> u64 {
    match seen {
        Seen::Change(view) => view.object.cost() + view.prev.as_ref().map_or(0, |p| p.cost()),
        Seen::Forwarded(_, e) => (e.encoded_len() + std::mem::size_of::<mvccpb::Event>()) as u64,
        Seen::Progress(..) | Seen::Canceled { .. } => 0,
    }
}
