//! Polls the connection again, within the same poll of its task, when it
//! was woken while being polled.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Polls the connection again, within the same poll of its task, when it
/// was woken while being polled. Tokio reschedules a task woken during its
/// own poll and wakes an idle worker to take it, and a pass wakes its own
/// connection whenever it readies a watch (one it starts, one the client
/// gives room, one woken by its queue while the pass runs): a thread
/// wake-up and a second poll, often on the other worker.
pub struct Repoll<F> {
    inner: F,
    wake: Arc<RepollWake>,
    waker: Waker,
}

struct RepollWake {
    state: AtomicU8,
    task: AtomicWaker,
}

impl RepollWake {
    const IDLE: u8 = 0;
    const POLLING: u8 = 1;
    const WOKEN: u8 = 2;
}

impl<F> Repoll<F> {
    /// Polls in one task poll at most; then the task yields, as it would
    /// to a runtime's cooperative budget.
    const MAX_POLLS: usize = 4;

    pub fn new(inner: F) -> Self {
        let wake = Arc::new(RepollWake {
            state: AtomicU8::new(RepollWake::IDLE),
            task: AtomicWaker::new(),
        });
        Self {
            inner,
            waker: Waker::from(wake.clone()),
            wake,
        }
    }
}

impl Wake for RepollWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self.state.compare_exchange(
            Self::POLLING,
            Self::WOKEN,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) | Err(Self::WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future + Unpin> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.wake.task.register(cx.waker());
        for _ in 0..Self::MAX_POLLS {
            this.wake
                .state
                .store(RepollWake::POLLING, Ordering::Release);
            let mut inner_cx = Context::from_waker(&this.waker);
            if let Poll::Ready(out) = Pin::new(&mut this.inner).poll(&mut inner_cx) {
                return Poll::Ready(out);
            }
            if this
                .wake
                .state
                .compare_exchange(
                    RepollWake::POLLING,
                    RepollWake::IDLE,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Poll::Pending;
            }
        }
        this.wake.state.store(RepollWake::IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    use crate::server::http2::tests::Count;

    /// Wakes itself in its first `self_wakes` polls; keeps the last waker.
    struct WakesItself {
        polls: usize,
        self_wakes: usize,
        waker: Option<Waker>,
    }

    impl Future for WakesItself {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.polls <= self.self_wakes {
                cx.waker().wake_by_ref();
            }
            self.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_connection_woken_while_polled_is_polled_again_without_waking_its_task() {
        let woken = Arc::new(AtomicUsize::new(0));
        let task = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&task);
        let mut conn = Repoll::new(WakesItself {
            polls: 0,
            self_wakes: 2,
            waker: None,
        });
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 3, "until a poll did not wake it");
        assert_eq!(woken.load(Ordering::SeqCst), 0);

        // Woken from outside a poll: the task is.
        conn.inner.waker.take().unwrap().wake();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 4);

        // One that always wakes itself yields after a bounded number.
        conn.inner.self_wakes = usize::MAX;
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 4 + Repoll::<WakesItself>::MAX_POLLS);
        assert_eq!(woken.load(Ordering::SeqCst), 2, "and its task is woken");
    }
}
