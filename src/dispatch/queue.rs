//! A watcher's queue: bounded, filled by the dispatcher and emptied by the
//! watcher's stream, usually on the other core.
//!
//! One small lock around the items and the waker, instead of a general
//! channel: every delivery crosses between cores, and what it costs is the
//! cache lines both sides touch. A channel's separate counters, semaphore
//! and waker cell each moved for every delivery, and made a third of the
//! fan-out's time. An idle queue allocates nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

pub use tokio::sync::mpsc::error::TryRecvError;

/// Creates a queue holding at most `capacity` items.
pub fn queue<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            waker: None,
            sender_gone: false,
            receiver_gone: false,
        }),
        capacity,
    });
    (Sender(shared.clone()), Receiver(shared))
}

struct Shared<T> {
    state: Mutex<State<T>>,
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing that can panic runs under the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why an item was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
    /// The receiver is gone.
    Closed,
}

pub struct Sender<T>(Arc<Shared<T>>);

impl<T> Sender<T> {
    /// Queues what `make` returns, given the free places (at least one),
    /// all under one lock. `Ok(false)` when it returns nothing. A receiver
    /// that was waiting is not woken here: its waker is added to `wakes`,
    /// for the caller to wake once its batch of sends is queued and its
    /// locks are released. Each receiver then runs once for the whole batch
    /// (and a connection once for all its streams), finding all of it.
    pub fn try_send_with(
        &self,
        wakes: &mut Vec<Waker>,
        make: impl FnOnce(usize) -> Option<T>,
    ) -> Result<bool, Refused> {
        let mut state = self.0.lock();
        if state.receiver_gone {
            return Err(Refused::Closed);
        }
        let free = self.0.capacity.saturating_sub(state.items.len());
        if free == 0 {
            return Err(Refused::Full);
        }
        let Some(item) = make(free) else {
            return Ok(false);
        };
        state.items.push_back(item);
        wakes.extend(state.waker.take());
        Ok(true)
    }

    #[cfg(test)]
    pub fn try_send(&self, item: T, wakes: &mut Vec<Waker>) -> Result<(), Refused> {
        self.try_send_with(wakes, |_| Some(item)).map(drop)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.0.lock();
            state.sender_gone = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

pub struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The next item; `None` once the sender is gone and the queue is
    /// empty. `Pending` keeps `cx`'s waker for the next item.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.lock();
        if let Some(item) = state.items.pop_front() {
            return Poll::Ready(Some(item));
        }
        if state.sender_gone {
            return Poll::Ready(None);
        }
        match &mut state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut state = self.0.lock();
        match state.items.pop_front() {
            Some(item) => Ok(item),
            None if state.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Refuses further items; those already queued can still be read.
    pub fn close(&mut self) {
        self.0.lock().receiver_gone = true;
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.receiver_gone = true;
        // Dropped here, not when the sender goes: they may hold much.
        state.items = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The free places `make` is given.
    fn free<T>(tx: &Sender<T>) -> usize {
        let mut free = 0;
        let sent = tx.try_send_with(&mut Vec::new(), |n| {
            free = n;
            None
        });
        assert_eq!(sent, Ok(false), "nothing made, nothing queued");
        free
    }

    #[test]
    fn items_come_out_in_order_and_a_waiting_receiver_is_woken_once_per_wait() {
        let (tx, mut rx) = queue(3);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert!(rx.poll_recv(&mut cx).is_pending());
        let mut wakes = Vec::new();
        tx.try_send(1, &mut wakes).unwrap();
        tx.try_send(2, &mut wakes).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "left to the sender");
        assert_eq!(wakes.len(), 1, "one wake for the batch");
        wakes.drain(..).for_each(Waker::wake);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(free(&tx), 1);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(free(&tx), 3);
        assert!(rx.poll_recv(&mut cx).is_pending());
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "the end wakes it");
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn what_was_queued_is_read_after_the_sender_goes_and_a_full_queue_or_gone_receiver_refuses() {
        let (tx, mut rx) = queue(2);
        tx.try_send("a", &mut Vec::new()).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Ok("a"));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));

        let (tx, mut rx) = queue(2);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.try_send("b", &mut Vec::new()).unwrap();
        tx.try_send("c", &mut Vec::new()).unwrap();
        assert_eq!(tx.try_send("d", &mut Vec::new()), Err(Refused::Full));
        rx.close();
        assert_eq!(rx.try_recv(), Ok("b"));
        assert_eq!(tx.try_send("e", &mut Vec::new()), Err(Refused::Closed));
        drop(rx);
        assert_eq!(tx.try_send("f", &mut Vec::new()), Err(Refused::Closed));
    }
}
