//! The waker an etcd Watch stream reads its requests with: the stream's
//! watches wake it far more often than its requests do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use parking_lot::Mutex;

/// Set when the requests' waker fires, and the stream woken.
pub(super) struct Woken {
    pub(super) woken: AtomicBool,
    /// Kept, not taken, by a wake: requests come seldom, and the stream
    /// hands its waker over only when it changes.
    pub(super) stream: Mutex<Option<Waker>>,
}

impl Default for Woken {
    fn default() -> Self {
        Self {
            woken: AtomicBool::new(true),
            stream: Mutex::new(None),
        }
    }
}

impl Woken {
    /// Whether it was woken since the last take. Read first: the stream
    /// asks on every poll, and a swap would write the line each time.
    pub(super) fn take(&self) -> bool {
        self.woken.load(Ordering::Acquire) && self.woken.swap(false, Ordering::AcqRel)
    }
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(stream) = &*self.stream.lock() {
            stream.wake_by_ref();
        }
    }
}
