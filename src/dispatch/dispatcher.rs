//! The dispatcher of one resource: its registered watchers in the trigger
//! index, each event queued to those it concerns, and due bookmarks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::cuts::Cuts;
use super::inbox::{Counters, Inbox, Mailbox, Place, QueueSpec};
use super::posts::{Posts, POST_PARCELS};
use super::trigger::{Trigger, TriggerIndex};
use super::{transition, transition_by, Delivery, Encode, View, Wants};

mod bookmarks;
use crate::object::{Event, EventType, Object, Projection, Revision};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;

/// An event's views by the type they show it as.
type ByType = [Option<Arc<View>>; 3];

/// Where the view of `kind` for projection `p` goes (by identity: the
/// dispatcher interns projections).
#[inline(never)]
fn projected_slot<'a>(
    projected: &'a mut Vec<(Arc<Projection>, ByType)>,
    p: &Arc<Projection>,
    kind: EventType,
) -> &'a mut Option<Arc<View>> {
    let at = match projected.iter().position(|(q, _)| Arc::ptr_eq(q, p)) {
        Some(at) => at,
        None => {
            projected.push((p.clone(), [None, None, None]));
            projected.len() - 1
        }
    };
    &mut projected[at].1[kind as usize]
}

struct Entry {
    /// Boxed: a dispatch reads every entry it reaches, and most are decided
    /// by their trigger set without their predicate (an entry is 48 bytes
    /// with it boxed, 192 with it inline).
    predicate: Box<Predicate>,
    /// Interned in [`Watchers::projections`], so watchers with equal
    /// projections share one view (and encoding) of an event.
    projection: Option<Arc<Projection>>,
    /// The predicate says no more than the watcher's trigger set, so being
    /// reached through that set decides a match without reading it.
    trigger_decides: bool,
    /// Events at or before this revision are already in the watcher's
    /// initial state or replay.
    start: Revision,
    to: Place,
    /// Where its deliveries wait to be posted, in [`Posts`].
    post: usize,
    bookmarks: bool,
}

pub(super) struct Watchers {
    next_id: u64,
    index: TriggerIndex<Entry>,
    /// When each watcher that allows bookmarks gets its next one; entries
    /// of watchers that left are dropped when they come due.
    bookmarks_due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The newest revision dispatched (events or progress); bookmarks carry it.
    revision: Revision,
    posts: Posts,
    /// No more events will come: the cache's writer is gone.
    closed: bool,
    /// The distinct projections of the watchers, with how many use each.
    projections: HashMap<Arc<Projection>, usize>,
}

/// The watchers of one resource.
///
/// Events are dispatched by the single cache writer, in revision order. The
/// lock is held while queueing to the interested watchers: a send never
/// waits, and holding it is what orders registration against dispatch (a
/// watcher registered at revision R is in the set before any event after R
/// is dispatched).
pub struct Dispatcher {
    pub(super) watchers: Mutex<Watchers>,
    queue_len: usize,
    bookmark_interval: Duration,
    pub(super) metrics: ResourceMetrics,
    /// Kept by the watchers' queues.
    counters: Arc<Counters>,
    encode: Option<Encode>,
    /// The wakers of receivers a dispatch has queued to, woken after it
    /// releases the lock; kept for the allocation.
    wakes: Mutex<Vec<Waker>>,
    /// Objects recently cut to a projection, for every watcher shown them.
    cuts: Cuts,
}

/// A registered watcher's receiving end; dropping it unregisters.
pub struct Subscription {
    id: u64,
    pub mailbox: Mailbox,
    dispatcher: Arc<Dispatcher>,
}

impl Subscription {
    /// `o` as a watcher that wants `wants` is shown it.
    pub(super) fn show(&self, wants: &Wants, o: Arc<Object>) -> Arc<Object> {
        self.dispatcher.show(wants, o)
    }

    /// Resumes live delivery after the watcher read the window through
    /// `after`. The caller holds the cache lock and has checked that the
    /// window holds nothing after `after`, so events up to it that are
    /// still on their way are skipped and every later one is delivered.
    pub(crate) fn rejoin(&self, after: Revision) {
        self.mailbox.rejoin(after);
    }

    /// Asks for a bookmark at the newest revision dispatched, behind
    /// everything dispatched to this watcher so far.
    pub(crate) fn bookmark_now(&self) {
        self.dispatcher.bookmark_one(self.id);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut w = self.dispatcher.watchers.lock();
        if let Some(entry) = w.index.remove(self.id) {
            w.posts.leave(entry.post);
            if let Some(p) = entry.projection {
                if let Some(users) = w.projections.get_mut(&p) {
                    *users -= 1;
                    if *users == 0 {
                        w.projections.remove(&p);
                    }
                }
            }
        }
        self.dispatcher.metrics.watchers.set(w.index.len() as i64);
    }
}

impl Dispatcher {
    pub fn new(queue_len: usize, bookmark_interval: Duration, metrics: ResourceMetrics) -> Self {
        Self {
            watchers: Mutex::new(Watchers {
                next_id: 0,
                index: TriggerIndex::default(),
                bookmarks_due: BinaryHeap::new(),
                revision: 0,
                posts: Posts::default(),
                closed: false,
                projections: HashMap::new(),
            }),
            queue_len,
            bookmark_interval,
            counters: Arc::new(Counters {
                deliveries: metrics.deliveries.clone(),
                fell_behind: metrics.fell_behind.clone(),
                behind: metrics.behind.clone(),
                caught_up: metrics.behind_caught_up.clone(),
                ended_behind: metrics.behind_ended.clone(),
            }),
            metrics,
            encode: None,
            wakes: Mutex::default(),
            cuts: Cuts::default(),
        }
    }

    /// Encodes each delivered change once, for all its watchers.
    pub fn with_encoder(mut self, encode: Encode) -> Self {
        self.encode = Some(encode);
        self
    }

    /// Adds a watcher that receives events after `start` in `inbox`,
    /// registered under `trigger`, which must cover every object
    /// `predicate` can match. One that starts `behind` reads the window
    /// from `start` and then rejoins.
    pub fn register(
        self: &Arc<Self>,
        inbox: &Arc<Inbox>,
        wants: impl Into<Wants>,
        trigger: Trigger,
        start: Revision,
        bookmarks: bool,
        behind: bool,
    ) -> Subscription {
        let Wants {
            predicate,
            projection,
        } = wants.into();
        let mailbox = inbox.open(QueueSpec {
            capacity: self.queue_len,
            start,
            behind,
            counters: self.counters.clone(),
        });
        let due = self.next_bookmark(Instant::now());
        let mut w = self.watchers.lock();
        let id = w.next_id;
        w.next_id += 1;
        if w.closed {
            // Its queue ends at once: the watcher sees `Closed`.
            let mut wakes = Vec::new();
            inbox.post_end(mailbox.address(), &mut wakes);
            drop(w);
            wakes.into_iter().for_each(Waker::wake);
            return Subscription {
                id,
                mailbox,
                dispatcher: self.clone(),
            };
        }
        if bookmarks {
            w.bookmarks_due.push(Reverse((due, id)));
        }
        let trigger_decides = match &trigger {
            Trigger::All => {
                !predicate.has_selectors()
                    && predicate.namespace().is_none()
                    && predicate.name().is_none()
            }
            Trigger::Key(_) => predicate.is_only_name(),
            Trigger::Field { field, .. } => predicate.is_only_field_pin(*field),
            Trigger::Shard { .. } => false,
        };
        let projection = projection.map(|p| {
            let (shared, users) = w.projections.remove_entry(&p).unwrap_or((p, 0));
            w.projections.insert(shared.clone(), users + 1);
            shared
        });
        let entry = Entry {
            predicate: Box::new(predicate),
            projection,
            trigger_decides,
            start,
            to: mailbox.address(),
            post: w.posts.join(inbox),
            bookmarks,
        };
        w.index.insert(id, trigger, entry);
        self.metrics.watchers.set(w.index.len() as i64);
        drop(w);
        Subscription {
            id,
            mailbox,
            dispatcher: self.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.watchers.lock().index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `o` as a watcher that wants `wants` is shown it: cut to its
    /// projection once for every watcher shown this version so.
    pub fn show(&self, wants: &Wants, o: Arc<Object>) -> Arc<Object> {
        match &wants.projection {
            Some(p) => self.cuts.cut(p, &o),
            None => o,
        }
    }

    /// Queues `events` (in revision order) to every watcher they concern,
    /// visiting only the watchers the trigger index names. Each inbox gets
    /// the batch's deliveries at once; a watcher whose queue is full falls
    /// behind there and is never waited for nor cut off.
    pub fn dispatch(&self, events: &[Arc<Event>]) {
        self.deliver(events, None);
    }

    /// [`Dispatcher::dispatch`] of changes the cache took off its etcd
    /// watch at `received`.
    pub fn dispatch_received(&self, events: &[Arc<Event>], received: std::time::Instant) {
        self.deliver(events, Some(received));
    }

    fn deliver(&self, events: &[Arc<Event>], received: Option<std::time::Instant>) {
        let Some(last) = events.last() else { return };
        let mut encodings = 0;
        let mut wakes = std::mem::take(&mut *self.wakes.lock());
        let mut guard = self.watchers.lock();
        let w = &mut *guard;
        w.revision = w.revision.max(last.revision);
        let Watchers { index, posts, .. } = w;
        for event in events {
            // One view (and encoding) per type this event is delivered as,
            // and per projection.
            let mut views: ByType = [None, None, None];
            let mut projected: Vec<(Arc<Projection>, ByType)> = Vec::new();
            index.for_each_candidate(event, |_, entry, via| {
                if event.revision <= entry.start {
                    return;
                }
                let seen = match entry.trigger_decides {
                    true => transition_by(event, |o| via.holds(o)),
                    false => transition(&entry.predicate, event),
                };
                let Some((kind, object)) = seen else {
                    return;
                };
                let slot = match &entry.projection {
                    None => &mut views[kind as usize],
                    Some(p) => projected_slot(&mut projected, p, kind),
                };
                let view = match slot {
                    Some(view) => view,
                    None => {
                        encodings += u64::from(self.encode.is_some());
                        let projection = entry.projection.as_ref();
                        let object = object.clone();
                        slot.insert(self.view(kind, object, projection, event, received))
                    }
                };
                posts.send_change(entry.post, entry.to, view);
            });
            if posts.parcels >= POST_PARCELS {
                posts.post(&mut wakes);
            }
        }
        posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
        self.metrics.encodings.inc_by(encodings);
    }

    /// An event as the watchers of one type and projection see it, encoded
    /// once for them all. Out of line: made once per event and type, while
    /// the loop around it runs per watcher.
    #[inline(never)]
    fn view(
        &self,
        kind: EventType,
        object: Arc<Object>,
        projection: Option<&Arc<Projection>>,
        event: &Event,
        received: Option<std::time::Instant>,
    ) -> Arc<View> {
        let object = match projection {
            Some(p) => self.cuts.cut(p, &object),
            None => object,
        };
        let encoded = (self.encode.as_ref())
            .map(|encode| encode(kind, &object, event.revision, event.resync_from));
        Arc::new(View {
            kind,
            object,
            prev: event.prev().cloned(),
            revision: event.revision,
            resync_from: event.resync_from,
            encoded,
            compressed: Default::default(),
            etcd_encoded: Default::default(),
            kubernetes_line: Default::default(),
            received,
        })
    }

    /// Ends every watcher's queue after what it holds, and any registered
    /// later at once: no more events will come. Watchers learn of it from
    /// their own queues, so a watch needs no other signal to see the end.
    pub fn close(&self) {
        let mut wakes = Vec::new();
        let mut w = self.watchers.lock();
        w.closed = true;
        let index = std::mem::take(&mut w.index);
        for entry in index.into_watchers() {
            w.posts.inbox(entry.post).post_end(entry.to, &mut wakes);
        }
        w.posts = Posts::default();
        w.bookmarks_due.clear();
        w.projections.clear();
        self.metrics.watchers.set(0);
        drop(w);
        wakes.into_iter().for_each(Waker::wake);
    }

    /// Tells every watcher that started before `revision` that what it was
    /// just sent was a resync's difference, complete as of `revision`; or,
    /// with `expire`, that its history is gone (it finds the window
    /// starting after it, and ends).
    pub fn history_lost(&self, revision: Revision, expire: bool) {
        let mut wakes = std::mem::take(&mut *self.wakes.lock());
        let mut guard = self.watchers.lock();
        let w = &mut *guard;
        w.revision = w.revision.max(revision);
        let Watchers { index, posts, .. } = w;
        index.for_each(|entry| {
            if entry.start < revision {
                let delivery = match expire {
                    true => Delivery::Behind,
                    false => Delivery::ResyncEnd(revision),
                };
                posts.send(entry.post, entry.to, delivery);
            }
        });
        posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
    }

    /// Records progress without events (an etcd progress notification).
    pub fn progress(&self, revision: Revision) {
        let mut w = self.watchers.lock();
        w.revision = w.revision.max(revision);
    }

    /// Wakes the receivers a batch queued to, each once, and keeps the
    /// list's allocation for the next batch.
    fn wake(&self, mut wakes: Vec<Waker>) {
        wakes.drain(..).for_each(Waker::wake);
        *self.wakes.lock() = wakes;
    }
}
