//! The live watches of a connection and the ready list that says which to
//! poll: those the inbox named (deliveries arrived) and those the client
//! gave room.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use slotmap::SecondaryMap;

use super::protocol::out::Out;
use super::protocol::socket::WRITE_LIMIT;
use crate::dispatch::{Inbox, Offer, Place, Taker};

/// The live watches of a connection, each polled when its waker says it
/// is ready, and all that are ready in one pass. (`FuturesUnordered` ends
/// its pass early once two futures wake themselves while polled.)
pub(super) struct Watches<F: Drive> {
    /// By the place of each watch's queue in the inbox.
    slots: SecondaryMap<Place, Slot<F>>,
    /// Each watch's lane, by the same place.
    lanes: SecondaryMap<Place, F::Lane>,
    /// The deliveries of every watch, sorted into their queues at the
    /// start of each pass, which then polls the watches they went to.
    pub(super) inbox: Arc<Inbox>,
    /// Wakes the connection when deliveries arrive.
    mail: Waker,
    ready: Arc<ReadyList>,
    /// The places taken from `ready` for this pass; kept for its
    /// allocation.
    taking: Vec<Place>,
    /// Live changes are offered to their watches as the inbox is sorted
    /// (`watch.direct_delivery`); otherwise each is queued and polled.
    direct: bool,
}

struct Slot<F> {
    /// Boxed: the map's slots stay small, each one line with its version.
    watch: Box<F>,
    flag: Arc<WatchWaker>,
    waker: Waker,
}

#[derive(Default)]
struct ReadyList {
    ids: Mutex<Vec<Place>>,
    /// The connection's own futures (shutdown, keepalive) were woken.
    aside: AtomicBool,
    /// The socket may have bytes to read.
    readable: AtomicBool,
    /// The connection's task, woken when the list stops being empty or
    /// the aside futures are woken.
    conn: AtomicWaker,
}

/// A watch's waker: puts it on the ready list, once until it is polled.
struct WatchWaker {
    id: Place,
    queued: AtomicBool,
    ready: Arc<ReadyList>,
}

impl Wake for WatchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let was_empty = {
            let mut ids = self.ready.ids.lock();
            ids.push(self.id);
            ids.len() == 1
        };
        if was_empty {
            self.ready.conn.wake();
        }
    }
}

/// Wakes the connection's task for new deliveries.
struct MailWaker(Arc<ReadyList>);

impl Wake for MailWaker {
    fn wake(self: Arc<Self>) {
        self.0.conn.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.conn.wake();
    }
}

/// The waker of a connection's own futures, or of its socket's reads.
/// Polled on every pass, once per delivery, the shutdown token and the
/// keepalive timer took a few percent of the task's time, and a read that
/// finds nothing locks the socket's waiters; they are polled only after
/// their waker fired.
struct FlagWaker {
    ready: Arc<ReadyList>,
    flag: fn(&ReadyList) -> &AtomicBool,
}

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        (self.flag)(&self.ready).store(true, Ordering::Release);
        self.ready.conn.wake();
    }
}

impl<F: Drive> Watches<F> {
    /// The watches of a connection; `direct`: see `watch.direct_delivery`.
    pub(super) fn new(direct: bool) -> Self {
        let ready = Arc::<ReadyList>::default();
        Self {
            slots: SecondaryMap::new(),
            lanes: SecondaryMap::new(),
            inbox: Inbox::shared(),
            mail: Waker::from(Arc::new(MailWaker(ready.clone()))),
            ready,
            taking: Vec::new(),
            direct,
        }
    }
}

/// A stream driven by its connection's task.
pub(super) trait Drive {
    /// What the connection keeps of the stream beside it, for the changes
    /// [`Drive::offer`] takes without reading the stream.
    type Lane;

    /// Its lane, as it starts.
    fn lane(&self) -> Self::Lane;

    /// Reads what [`Drive::offer`] would read of the stream (through
    /// `watch` only where its lane cannot decide), ahead of the offer.
    fn ahead<'w>(_lane: &Self::Lane, _watch: impl FnOnce() -> Option<&'w Self>) -> u64
    where
        Self: 'w,
    {
        0
    }

    /// Takes back what its lane did since it was last polled; the
    /// connection calls it before anything else reads the stream.
    fn settle(&mut self, lane: &mut Self::Lane);

    /// Frames what the stream has ready into `out`; `Ready` once the
    /// stream is over.
    fn poll_drive(
        &mut self,
        lane: &mut Self::Lane,
        cx: &mut Context<'_>,
        out: &mut Out,
    ) -> Poll<()>;

    /// Ends the stream: its connection reached its maximum age. `Ready`
    /// once it is over; until then it is driven as before.
    fn end_aged(&mut self, lane: &mut Self::Lane, out: &mut Out) -> Poll<()>;

    /// Frames the change `offer` brings for the stream at once when nothing
    /// of the stream waits before it; false leaves it to its queue. The
    /// stream itself (`watch`) is read only when its lane cannot decide.
    fn offer<'w>(
        _lane: &mut Self::Lane,
        _watch: impl FnOnce() -> Option<&'w mut Self>,
        _offer: &Offer<'_>,
        _out: &mut Out,
    ) -> bool
    where
        Self: 'w,
    {
        false
    }
}

impl<F: Drive> Watches<F> {
    /// A waker for the connection's other futures, which wakes the task as
    /// a watch does; it counts as fired at first, so they are polled to
    /// start.
    pub(super) fn aside_waker(&self) -> Waker {
        self.flag_waker(|r| &r.aside)
    }

    /// A waker for the socket's reads, which wakes the task as a watch
    /// does; it counts as fired at first, so the socket is read to start.
    pub(super) fn read_waker(&self) -> Waker {
        self.flag_waker(|r| &r.readable)
    }

    fn flag_waker(&self, flag: fn(&ReadyList) -> &AtomicBool) -> Waker {
        flag(&self.ready).store(true, Ordering::Release);
        let ready = self.ready.clone();
        Waker::from(Arc::new(FlagWaker { ready, flag }))
    }

    /// Has the ready list and the flag wakers wake `cx`'s task.
    pub(super) fn register(&self, cx: &Context<'_>) {
        self.ready.conn.register(cx.waker());
    }

    /// Whether the aside waker fired since the last call.
    pub(super) fn take_aside(&self) -> bool {
        self.ready.aside.swap(false, Ordering::AcqRel)
    }

    /// Whether the read waker fired since the last call.
    pub(super) fn take_readable(&self) -> bool {
        self.ready.readable.swap(false, Ordering::AcqRel)
    }
}

impl<F: Drive> Watches<F> {
    /// Adds a watch at `id`, the place of its queue in the inbox.
    pub(super) fn insert(&mut self, id: Place, watch: F) {
        debug_assert!(!self.slots.contains_key(id), "one watch per place");
        let flag = Arc::new(WatchWaker {
            id,
            queued: AtomicBool::new(false),
            ready: self.ready.clone(),
        });
        let waker = Waker::from(flag.clone());
        // Polled once to start, then whenever woken.
        waker.wake_by_ref();
        self.lanes.insert(id, watch.lane());
        let watch = Box::new(watch);
        self.slots.insert(id, Slot { watch, flag, waker });
    }

    /// Ends the watch at `id`: its client reset its stream.
    pub(super) fn remove(&mut self, id: Place) -> Option<F> {
        let mut watch = self.slots.remove(id)?.watch;
        if let Some(mut lane) = self.lanes.remove(id) {
            watch.settle(&mut lane);
        }
        Some(*watch)
    }

    /// Gives the watch at `id` room, and wakes it; what `grant` returns
    /// (true when the watch is gone).
    pub(super) fn grant(&mut self, id: Place, grant: impl FnOnce(&mut F) -> bool) -> bool {
        let (Some(slot), Some(lane)) = (self.slots.get_mut(id), self.lanes.get_mut(id)) else {
            return true;
        };
        slot.watch.settle(lane);
        let granted = grant(&mut slot.watch);
        slot.waker.wake_by_ref();
        granted
    }

    /// Ends every watch: the connection reached its maximum age.
    pub(super) fn end_aged(&mut self, out: &mut Out) {
        let lanes = &mut self.lanes;
        self.slots.retain(|id, s| {
            let lane = lanes.get_mut(id).expect("a lane for every watch");
            let ended = s.watch.end_aged(lane, out).is_ready();
            if ended {
                lanes.remove(id);
            }
            !ended
        });
    }

    /// Polls every watch that was ready when the pass began, until the
    /// pass has framed [`WRITE_LIMIT`] bytes; those woken meanwhile, and
    /// those past the limit, wait for the next pass, for which the task
    /// [`Watches::register`]ed at the start of this one is woken.
    pub(super) fn poll_ready(&mut self, out: &mut Out) {
        std::mem::swap(&mut *self.ready.ids.lock(), &mut self.taking);
        if self.direct {
            let taker = Taking {
                slots: &mut self.slots,
                lanes: &mut self.lanes,
                out,
            };
            (self.inbox).collect_taking(&self.mail, &mut self.taking, taker);
        } else {
            self.inbox.collect(&self.mail, &mut self.taking);
        }
        for i in 0..self.taking.len() {
            if out.buf.len() >= WRITE_LIMIT {
                // The rest go first in the next pass, once this one's
                // frames are written.
                let rest = &self.taking[i..];
                self.ready.ids.lock().splice(0..0, rest.iter().copied());
                self.ready.conn.wake();
                break;
            }
            let id = self.taking[i];
            // A place can be stale: its watch ended (another in the same
            // slot has a place of another version).
            let (Some(slot), Some(lane)) = (self.slots.get_mut(id), self.lanes.get_mut(id)) else {
                continue;
            };
            slot.flag.queued.store(false, Ordering::Release);
            let mut cx = Context::from_waker(&slot.waker);
            if slot.watch.poll_drive(lane, &mut cx, out).is_ready() {
                self.slots.remove(id);
                self.lanes.remove(id);
            }
        }
        self.taking.clear();
    }
}

/// The watches of a connection taking live changes as its inbox is sorted.
struct Taking<'a, F: Drive> {
    slots: &'a mut SecondaryMap<Place, Slot<F>>,
    lanes: &'a mut SecondaryMap<Place, F::Lane>,
    out: &'a mut Out,
}

impl<F: Drive> Taker for Taking<'_, F> {
    fn ahead(&mut self, place: Place) {
        if let Some(lane) = self.lanes.get(place) {
            let slots = &*self.slots;
            let watch = || slots.get(place).map(|slot| &*slot.watch);
            std::hint::black_box(F::ahead(lane, watch));
        }
    }

    fn take(&mut self, offer: Offer<'_>) -> bool {
        let Some(lane) = self.lanes.get_mut(offer.by) else {
            return false;
        };
        let slots = &mut *self.slots;
        let watch = move || {
            let slots = slots;
            slots.get_mut(offer.by).map(|slot| &mut *slot.watch)
        };
        F::offer(lane, watch, &offer, self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Poll;

    use super::super::tests::Count;

    /// A connection's pass over its watches: its task registered, then
    /// the ready ones polled.
    fn pass(watches: &mut Watches<Probe>, cx: &mut Context<'_>, out: &mut Out) {
        watches.register(cx);
        watches.poll_ready(out);
    }

    /// Counts its polls; frames `frames` bytes and wakes itself while
    /// polled; ends at its `end`-th poll.
    struct Probe {
        polls: Arc<AtomicUsize>,
        end: usize,
        frames: usize,
    }

    impl Drive for Probe {
        type Lane = ();

        fn lane(&self) {}

        fn settle(&mut self, _: &mut ()) {}

        fn poll_drive(&mut self, _: &mut (), cx: &mut Context<'_>, out: &mut Out) -> Poll<()> {
            out.buf.extend_from_slice(&vec![0; self.frames]);
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.end {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn end_aged(&mut self, _: &mut (), _: &mut Out) -> Poll<()> {
            Poll::Ready(())
        }
    }

    #[test]
    fn one_pass_polls_every_ready_watch_even_when_they_wake_themselves() {
        let mut watches = Watches::new(true);
        // The places an inbox would give the watches' queues.
        let mut places = slotmap::SlotMap::<Place, ()>::with_key();
        let ids: Vec<Place> = (0..10).map(|_| places.insert(())).collect();
        let polls: Vec<_> = (0..10).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        for (i, p) in polls.iter().enumerate() {
            let end = if i < 5 { 2 } else { usize::MAX };
            watches.insert(
                ids[i],
                Probe {
                    polls: p.clone(),
                    end,
                    frames: 0,
                },
            );
        }
        let count = |polls: &[Arc<AtomicUsize>]| -> Vec<usize> {
            polls.iter().map(|p| p.load(Ordering::SeqCst)).collect()
        };
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&waker);
        let mut out = Out::default();
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(count(&polls), [1; 10], "all in one pass, once each");
        assert_eq!(
            woken.load(Ordering::SeqCst),
            1,
            "the connection is woken for the next"
        );
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(count(&polls), [2; 10], "self-woken: again in the next pass");
        assert_eq!(watches.slots.len(), 5, "the ended ones are gone");
        // A new one in the slot of one that ended.
        places.remove(ids[0]);
        let reused = places.insert(());
        let fresh = Arc::new(AtomicUsize::new(0));
        watches.insert(
            reused,
            Probe {
                polls: fresh.clone(),
                end: usize::MAX,
                frames: 0,
            },
        );
        assert_eq!(watches.slots.len(), 6);
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(count(&polls), [2, 2, 2, 2, 2, 3, 3, 3, 3, 3]);
        assert_eq!(fresh.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_flag_waker_sets_its_flag_and_wakes_the_task_registered() {
        let watches = Watches::<Probe>::new(true);
        let (aside, read) = (watches.aside_waker(), watches.read_waker());
        assert!(
            watches.take_aside() && watches.take_readable(),
            "fired at first"
        );
        assert!(!watches.take_aside() && !watches.take_readable());
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        watches.register(&Context::from_waker(&waker));
        read.wake_by_ref();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(watches.take_readable() && !watches.take_aside());
        watches.register(&Context::from_waker(&waker));
        aside.wake_by_ref();
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert!(watches.take_aside() && !watches.take_readable());
    }

    #[test]
    fn a_pass_stops_at_the_write_limit_and_the_rest_go_next() {
        let mut watches = Watches::new(true);
        let mut places = slotmap::SlotMap::<Place, ()>::with_key();
        let polls: Vec<_> = (0..10).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        for p in &polls {
            let probe = Probe {
                polls: p.clone(),
                end: usize::MAX,
                frames: WRITE_LIMIT / 4,
            };
            watches.insert(places.insert(()), probe);
        }
        let total = || {
            polls
                .iter()
                .map(|p| p.load(Ordering::SeqCst))
                .sum::<usize>()
        };
        let waker = Waker::from(Arc::new(Count(Arc::new(AtomicUsize::new(0)))));
        let mut cx = Context::from_waker(&waker);
        let mut out = Out::default();
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(total(), 4, "four fill the pass");
        assert_eq!(out.buf.len(), WRITE_LIMIT);
        // Written out; the next pass takes the six left, not the four again.
        out.buf.clear();
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(total(), 8);
        assert!(polls[..4].iter().all(|p| p.load(Ordering::SeqCst) == 1));
        out.buf.clear();
        pass(&mut watches, &mut cx, &mut out);
        assert_eq!(total(), 12);
        assert!(
            polls.iter().all(|p| p.load(Ordering::SeqCst) >= 1),
            "every one in turn"
        );
    }
}
