//! The deliveries for the watchers one task reads: a connection's watches,
//! or a watcher on its own.
//!
//! A dispatcher posts its batch for an inbox with one lock and one wake, and
//! the reader sorts it into its watchers' queues, which no other thread
//! touches. With a queue per watcher shared with the dispatcher, each
//! delivery moved that queue's lock, its item and its watch's ready flag
//! between cores: about a fifth of the fan-out's time. A batch moves a few
//! cache lines per inbox instead.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use std::task::Waker;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use slotmap::SlotMap;

use super::{Delivery, View};
use crate::object::Revision;

mod mailbox;
mod offer;

pub use mailbox::Mailbox;
pub use offer::{Offer, Taker};

slotmap::new_key_type! {
    /// Where a queue is in its inbox: how the reader names the watches to
    /// poll. Its version tells it from an earlier queue in the same slot,
    /// so a delivery to a queue that left is dropped.
    pub struct Place;
}

/// A delivery on its way to one queue.
pub(super) struct Parcel {
    pub to: Place,
    pub carried: Carried,
}

/// What a parcel carries.
pub(super) enum Carried {
    /// The change at this index of the views posted with it: each inbox
    /// holds a change once, however many of its watchers it goes to, so a
    /// delivery moves no reference count another core moves too.
    Change(u32),
    /// A bookmark, the end of a resync, or `Behind`.
    Other(Delivery),
    /// The queue ends.
    End,
}

pub struct Inbox {
    incoming: Mutex<Incoming>,
    queues: Mutex<Queues>,
    /// Read by one watcher, which sorts what is posted itself. Otherwise
    /// the reading task sorts it for all its watchers ([`Inbox::collect`]).
    solo: bool,
}

struct Incoming {
    parcels: Vec<Parcel>,
    /// The changes the parcels name.
    views: Vec<Arc<View>>,
    /// How many parcels may wait: the room of all the queues together.
    room: usize,
    /// Parcels were refused for want of room since the reader last
    /// collected: every queue falls behind.
    overflowed: bool,
    reader: Option<Waker>,
}

#[derive(Default)]
struct Queues {
    slots: SlotMap<Place, Queue>,
    /// The parcels being sorted and the changes they name; kept for the
    /// allocations.
    sorting: Vec<Parcel>,
    sorting_views: Vec<Arc<View>>,
    /// Places named by a sort outside [`Inbox::collect`], which the next
    /// collection gives its reader.
    named: Vec<Place>,
}

struct Queue {
    items: VecDeque<Delivery>,
    capacity: usize,
    /// Live deliveries are skipped: `Behind` is queued, and the watcher
    /// reads the event window until it rejoins.
    behind: bool,
    /// Events up to here are in the watcher's initial state or were read
    /// from the window.
    start: Revision,
    /// Behind since its queue filled (or its history went): counted in
    /// the gauge of watchers behind until it rejoins or ends.
    stalled: bool,
    /// The dispatcher sends nothing more.
    closed: bool,
    counters: Arc<Counters>,
    /// The place the reader knows this queue's reader by, when it is not
    /// the queue's own (the watches of an etcd Watch stream, named by the
    /// stream's place).
    report: Option<Place>,
}

/// What a dispatcher gives a new queue.
pub(super) struct QueueSpec {
    pub capacity: usize,
    pub start: Revision,
    pub behind: bool,
    pub counters: Arc<Counters>,
}

/// The counts of a resource that its watchers' queues keep.
#[derive(Default)]
pub(super) struct Counters {
    pub deliveries: Counter,
    pub fell_behind: Counter,
    pub behind: Gauge,
    pub caught_up: Counter,
    pub ended_behind: Counter,
}

impl Queue {
    /// Live deliveries stop: the watcher reads the window until it rejoins.
    fn stall(&mut self) {
        self.behind = true;
        if !self.stalled {
            self.stalled = true;
            self.counters.behind.inc();
        }
    }
}

impl Inbox {
    /// An inbox for the watchers of one task, which calls
    /// [`Inbox::collect`] to sort what arrived.
    pub fn shared() -> Arc<Self> {
        Self::new(false)
    }

    /// An inbox for one watcher.
    pub fn solo() -> Arc<Self> {
        Self::new(true)
    }

    fn new(solo: bool) -> Arc<Self> {
        Arc::new(Self {
            incoming: Mutex::new(Incoming {
                parcels: Vec::new(),
                views: Vec::new(),
                room: 0,
                overflowed: false,
                reader: None,
            }),
            queues: Mutex::default(),
            solo,
        })
    }

    /// A place of the inbox that no dispatcher posts to: how a reader of
    /// the inbox's task names a stream of several watches of its own
    /// (etcd's Watch), which it polls when that stream's waker says so.
    pub fn reserve(self: &Arc<Self>) -> Mailbox {
        self.open(QueueSpec {
            capacity: 0,
            start: 0,
            behind: false,
            counters: Arc::default(),
        })
    }

    pub(super) fn open(self: &Arc<Self>, spec: QueueSpec) -> Mailbox {
        let capacity = spec.capacity;
        let queue = Queue {
            items: VecDeque::new(),
            capacity,
            behind: spec.behind,
            start: spec.start,
            stalled: false,
            closed: false,
            counters: spec.counters,
            report: None,
        };
        let mut queues = self.queues.lock();
        let at = queues.slots.insert(queue);
        self.incoming.lock().room += capacity;
        drop(queues);
        Mailbox {
            inbox: self.clone(),
            at,
        }
    }

    /// Posts all of `parcels` and the `views` they name (leaving both
    /// empty), or none when the inbox has no room for them, which puts
    /// every queue behind. A reader that waits is not woken here: its
    /// waker is added to `wakes`, for the caller to wake once its locks
    /// are released.
    pub(super) fn post(
        &self,
        parcels: &mut Vec<Parcel>,
        views: &mut Vec<Arc<View>>,
        wakes: &mut Vec<Waker>,
    ) {
        let mut incoming = self.incoming.lock();
        if incoming.overflowed || incoming.parcels.len() + parcels.len() > incoming.room {
            incoming.overflowed = true;
            parcels.clear();
        } else {
            // Another dispatcher's post waits unsorted: these name their
            // changes after its.
            let base = incoming.views.len() as u32;
            if base > 0 {
                for p in parcels.iter_mut() {
                    if let Carried::Change(i) = &mut p.carried {
                        *i += base;
                    }
                }
            }
            incoming.parcels.append(parcels);
            incoming.views.append(views);
        }
        wakes.extend(incoming.reader.take());
        drop(incoming);
        views.clear();
    }

    /// Ends a queue after what it holds, whatever the room.
    pub(super) fn post_end(&self, to: Place, wakes: &mut Vec<Waker>) {
        let mut incoming = self.incoming.lock();
        incoming.parcels.push(Parcel {
            to,
            carried: Carried::End,
        });
        wakes.extend(incoming.reader.take());
    }

    /// Sorts what was posted into the queues, and adds to `ready` the place
    /// ([`Mailbox::place`]) of each queue that stops being empty or ends:
    /// its watcher has something to read. `reader` is woken by the next
    /// post. A watcher is not woken by its queue: the reader, which was,
    /// polls those it names.
    pub fn collect(&self, reader: &Waker, ready: &mut Vec<Place>) {
        self.collect_taking(reader, ready, |_: Offer<'_>| false);
    }

    /// [`Inbox::collect`], offering each live change for a queue that is
    /// empty and live to `take` first: a change `take` shows at once
    /// (true) is counted as delivered and never queued. `take` runs while
    /// the inbox's queues are held: it must not touch them (through a
    /// [`Mailbox`]).
    pub fn collect_taking(&self, reader: &Waker, ready: &mut Vec<Place>, take: impl Taker) {
        let mut queues = self.queues.lock();
        ready.append(&mut queues.named);
        self.sort(&mut queues, Some(reader), Some(ready), take);
    }

    /// Sorts what was posted into the queues now, for a reader of some of
    /// them that must see everything posted so far (an etcd Watch stream
    /// answering a progress request). The places it names wait for the
    /// next collection: whatever was posted woke the inbox's reader.
    pub fn sort_now(&self) {
        let mut queues = self.queues.lock();
        let mut named = std::mem::take(&mut queues.named);
        self.sort(&mut queues, None, Some(&mut named), |_: Offer<'_>| false);
        queues.named = named;
    }

    /// Moves the posted parcels into their queues, naming in `ready` those
    /// that were empty; `take` is offered live changes first (see
    /// [`Inbox::collect_taking`]).
    fn sort(
        &self,
        queues: &mut Queues,
        reader: Option<&Waker>,
        mut ready: Option<&mut Vec<Place>>,
        mut take: impl Taker,
    ) {
        let overflowed = {
            let mut incoming = self.incoming.lock();
            match (&incoming.reader, reader) {
                (_, None) => {}
                (Some(w), Some(reader)) if w.will_wake(reader) => {}
                (_, Some(reader)) => incoming.reader = Some(reader.clone()),
            }
            std::mem::swap(&mut incoming.parcels, &mut queues.sorting);
            std::mem::swap(&mut incoming.views, &mut queues.sorting_views);
            std::mem::take(&mut incoming.overflowed)
        };
        let Queues {
            slots,
            sorting,
            sorting_views: views,
            ..
        } = queues;
        // Each queue a parcel goes to, and what the reader keeps for it, is
        // read before any is sorted: these reads, independent of each
        // other, wait for the memory together, where the sort's, one after
        // another, would wait for each (a queue is read once per change,
        // long after the last, and is rarely still in the CPU's cache). A
        // solo inbox's one queue is its reader's own, read just before.
        if !self.solo {
            let mut seen = 0;
            for parcel in sorting.iter() {
                if let Some(q) = slots.get(parcel.to) {
                    seen ^= q.start ^ q.items.len() as u64;
                    take.ahead(q.report.unwrap_or(parcel.to));
                }
            }
            std::hint::black_box(seen);
        }
        let mut tally = Tally::default();
        let mut name = |place: Place| {
            if let Some(ready) = ready.as_deref_mut() {
                ready.push(place);
            }
        };
        for Parcel { to, carried } in sorting.drain(..) {
            let Some(q) = slots.get_mut(to) else {
                continue;
            };
            let delivery = match carried {
                Carried::End => {
                    q.closed = true;
                    if q.items.is_empty() {
                        name(q.report.unwrap_or(to));
                    }
                    continue;
                }
                Carried::Other(delivery) => delivery,
                Carried::Change(i) => {
                    let view = &views[i as usize];
                    if q.behind || view.revision <= q.start {
                        continue;
                    }
                    let offer = || Offer {
                        by: q.report.unwrap_or(to),
                        queue: to,
                        view,
                        views,
                        at: i as usize,
                    };
                    if q.items.is_empty() && !q.closed && take.take(offer()) {
                        tally.count(&q.counters);
                        continue;
                    }
                    Delivery::Event(view.clone())
                }
            };
            let shown = match delivery {
                _ if q.behind => continue,
                // Without room, the watcher reads the window, which shows
                // the end of a resync too. The last place is kept for
                // `Behind`.
                shown @ (Delivery::Event(_) | Delivery::ResyncEnd(_))
                    if shown.revision() > q.start =>
                {
                    if q.items.len() + 1 >= q.capacity {
                        q.stall();
                        q.counters.fell_behind.inc();
                        Delivery::Behind
                    } else {
                        shown
                    }
                }
                Delivery::Bookmark(revision)
                    if revision > q.start && q.items.len() + 1 < q.capacity =>
                {
                    Delivery::Bookmark(revision)
                }
                // The history the watcher stands in is gone: it reads the
                // window, and learns so there.
                Delivery::Behind => {
                    q.stall();
                    Delivery::Behind
                }
                _ => continue,
            };
            if !matches!(shown, Delivery::Behind) {
                tally.count(&q.counters);
            }
            q.items.push_back(shown);
            if q.items.len() == 1 {
                name(q.report.unwrap_or(to));
            }
        }
        tally.flush();
        views.clear();
        if overflowed {
            for (place, q) in slots.iter_mut() {
                if q.behind || q.closed {
                    continue;
                }
                q.stall();
                q.counters.fell_behind.inc();
                q.items.push_back(Delivery::Behind);
                if q.items.len() == 1 {
                    name(q.report.unwrap_or(place));
                }
            }
        }
    }
}

/// Deliveries counted per run of queues of one resource, so that a sort
/// adds to a shared counter a few times rather than once per delivery.
#[derive(Default)]
struct Tally(Option<(Arc<Counters>, u64)>);

impl Tally {
    #[inline]
    fn count(&mut self, counter: &Arc<Counters>) {
        match &mut self.0 {
            Some((c, n)) if Arc::ptr_eq(c, counter) => *n += 1,
            _ => {
                self.flush();
                self.0 = Some((counter.clone(), 1));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((c, n)) = self.0.take() {
            c.deliveries.inc_by(n);
        }
    }
}
