//! What a connection holds of its calls' answers for a client that has
//! not read them, and the bound on it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

/// Response bytes a connection's calls may have waiting for the client's
/// windows before another is produced: a List page is produced as fast as
/// the client takes it, no faster. What a connection holds of its calls'
/// responses is at most this and one message (`limits.max_message_bytes`).
pub(super) const HELD_RESPONSES: usize = 1024 * 1024;

/// The response bytes a connection's calls hold, unsent, and the turn to
/// produce more, which one call at a time takes.
#[derive(Default)]
pub(super) struct HeldResponses {
    bytes: AtomicUsize,
    sent: Notify,
    /// One call at a time produces while the bound is reached.
    pub(super) turn: tokio::sync::Mutex<()>,
    /// The bytes every connection holds.
    all: Gauge<u64, AtomicU64>,
}

impl HeldResponses {
    pub(super) fn new(all: Gauge<u64, AtomicU64>) -> Self {
        Self {
            all,
            ..Self::default()
        }
    }

    /// Counts `n` bytes held until the guard it returns is dropped: when
    /// they are sent, or dropped unsent with their stream or connection.
    pub(super) fn hold(self: &Arc<Self>, n: usize) -> HeldBytes {
        self.bytes.fetch_add(n, Ordering::AcqRel);
        self.all.inc_by(n as u64);
        HeldBytes {
            held: self.clone(),
            n,
        }
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.bytes.fetch_sub(n, Ordering::AcqRel);
            self.all.dec_by(n as u64);
            self.sent.notify_waiters();
        }
    }

    /// Waits until the connection holds less than [`HELD_RESPONSES`].
    pub(super) async fn below_bound(&self) {
        loop {
            let sent = self.sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            if self.bytes.load(Ordering::Acquire) < HELD_RESPONSES {
                return;
            }
            sent.await;
        }
    }
}

/// Bytes of an answer the connection holds, counted until dropped.
pub(super) struct HeldBytes {
    held: Arc<HeldResponses>,
    n: usize,
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.held.release(self.n);
    }
}
