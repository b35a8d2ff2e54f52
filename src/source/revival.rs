//! How the reflectors of one origin learn that it answers again: the one
//! that gets through first (its retry, or a probe) tells the others, which
//! retry at once instead of waiting out backoffs grown to many seconds.

use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

/// The least time between two probes of one origin, whichever reflector
/// makes them; each is jittered up to twice as long.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Shared by the reflectors of one origin (every resource read from one
/// etcd client, or one upstream).
#[derive(Debug)]
pub struct Revival {
    /// Counts the times the origin was found answering after a failure.
    answered: watch::Sender<u64>,
    /// When the last probe started.
    probed: Mutex<Option<Instant>>,
}

impl Default for Revival {
    fn default() -> Self {
        Self {
            answered: watch::Sender::new(0),
            probed: Mutex::new(None),
        }
    }
}

impl Revival {
    /// The origin answered after a failure: wake every reflector waiting.
    pub fn announce(&self) {
        self.answered.send_modify(|n| *n += 1);
    }

    /// Tells of announcements made from now on.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.answered.subscribe()
    }

    /// Whether a probe may start now: none started within
    /// [`PROBE_EVERY`], so many resources and replicas do not storm an
    /// origin coming back.
    pub fn may_probe(&self) -> bool {
        let now = Instant::now();
        let mut probed = self.probed.lock();
        if probed.is_some_and(|at| now < at + PROBE_EVERY) {
            return false;
        }
        *probed = Some(now);
        true
    }

    /// How long to wait before the next probe: jittered, so the
    /// reflectors of many replicas spread out.
    pub fn probe_delay() -> Duration {
        PROBE_EVERY.mul_f64(rand::rng().random_range(1.0..=2.0))
    }

    /// How long a reflector woken by an announcement waits before its
    /// retry, so the woken ones do not all retry in one instant.
    pub fn wake_jitter() -> Duration {
        Duration::from_millis(rand::rng().random_range(0..=200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn probes_are_spaced_and_announcements_wake_subscribers() {
        let r = Revival::default();
        assert!(r.may_probe());
        assert!(!r.may_probe(), "a second probe at once is refused");
        tokio::time::advance(PROBE_EVERY).await;
        assert!(r.may_probe());
        let woken = r.subscribe();
        assert!(!woken.has_changed().unwrap());
        r.announce();
        assert!(woken.has_changed().unwrap());
        assert!(Revival::probe_delay() >= PROBE_EVERY);
        assert!(Revival::wake_jitter() <= Duration::from_millis(200));
    }
}
