//! A watcher's handle on its queue in an inbox: what it reads, and the
//! place it gives up when dropped.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::{Inbox, Offer, Place, Queue, Queues};
use crate::dispatch::Delivery;
use crate::object::Revision;

/// One watcher's queue in an inbox; dropping it gives up the place.
pub struct Mailbox {
    pub(super) inbox: Arc<Inbox>,
    pub(super) at: Place,
}

impl Mailbox {
    pub(in crate::dispatch) fn address(&self) -> Place {
        self.at
    }

    /// Something that makes the queue's reader look at it at once, from
    /// outside the flow of deliveries: the queue is ended after what it
    /// holds, for a watch that ends for a reason of its own (its grant).
    pub fn alarm(&self) -> impl Fn() + Send + Sync + 'static {
        let (inbox, at) = (Arc::downgrade(&self.inbox), self.at);
        move || {
            if let Some(inbox) = inbox.upgrade() {
                let mut wakes = Vec::new();
                inbox.post_end(at, &mut wakes);
                wakes.into_iter().for_each(Waker::wake);
            }
        }
    }

    /// Where the queue is in its inbox, unique among the inbox's open
    /// queues: how [`Inbox::collect`] names it.
    pub fn place(&self) -> Place {
        self.at
    }

    /// Has [`Inbox::collect`] name `place` for this queue from now on:
    /// the place of the stream (reserved in the same inbox) that reads it.
    pub fn report_as(&self, place: Place) {
        let mut queues = self.inbox.queues.lock();
        self.queue(&mut queues).report = Some(place);
    }

    /// The next delivery; `None` once the queue is ended and empty. On
    /// `Pending`, a lone watcher's `cx` is woken by the next post; in a
    /// shared inbox, the reader's collection names the queue instead.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        self.poll_take(cx).map(|taken| taken.map(|(d, _)| d))
    }

    /// [`Mailbox::poll_recv`], and whether the delivery emptied a queue of
    /// a shared inbox: nothing is queued there again before its reader's
    /// next collection, so the reader need not ask again until then.
    pub fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Option<(Delivery, bool)>> {
        let mut queues = self.inbox.queues.lock();
        if self.inbox.solo && self.queue(&mut queues).items.is_empty() {
            self.inbox
                .sort(&mut queues, Some(cx.waker()), None, |_: Offer<'_>| false);
        }
        let solo = self.inbox.solo;
        let q = self.queue(&mut queues);
        match q.items.pop_front() {
            Some(d) => Poll::Ready(Some((d, !solo && q.items.is_empty() && !q.closed))),
            None if q.closed => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    /// The next delivery, if one is queued.
    pub fn try_recv(&self) -> Option<Delivery> {
        match self.poll_recv(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(d) => d,
            Poll::Pending => None,
        }
    }

    /// Resumes live delivery after the watcher read the window through
    /// `after`, which holds every event dispatched so far: later ones are
    /// queued, those up to `after` still on their way are skipped.
    pub(in crate::dispatch) fn rejoin(&self, after: Revision) {
        let mut queues = self.inbox.queues.lock();
        let q = self.queue(&mut queues);
        q.start = q.start.max(after);
        q.behind = false;
        if std::mem::take(&mut q.stalled) {
            q.counters.behind.dec();
            q.counters.caught_up.inc();
        }
    }

    fn queue<'q>(&self, queues: &'q mut Queues) -> &'q mut Queue {
        queues
            .slots
            .get_mut(self.at)
            .expect("a mailbox's queue lives as long as it")
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        let mut queues = self.inbox.queues.lock();
        let removed = queues.slots.remove(self.at);
        let capacity = removed.as_ref().map_or(0, |q| q.capacity);
        if let Some(q) = removed.filter(|q| q.stalled) {
            q.counters.behind.dec();
            q.counters.ended_behind.inc();
        }
        let mut incoming = self.inbox.incoming.lock();
        incoming.room = incoming.room.saturating_sub(capacity);
    }
}
