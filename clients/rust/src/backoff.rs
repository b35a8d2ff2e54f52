//! Waits between retries: doubling up to a ceiling, jittered so that many
//! clients a replica dropped at once do not come back at once, and never
//! shorter than the server asked for.

use std::time::Duration;

use rand::Rng;

/// Waits between retries, as a watcher takes them.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    ceiling: Duration,
    next: Duration,
}

impl Backoff {
    /// Starting at `first`, doubling up to `ceiling`.
    pub fn new(first: Duration, ceiling: Duration) -> Backoff {
        Backoff {
            first,
            ceiling,
            next: first,
        }
    }

    /// The next wait: a uniform pick in the upper half of the current
    /// step, at least `advised`.
    pub fn next(&mut self, advised: Option<Duration>) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.ceiling);
        let jittered = rand::rng().random_range(step / 2..=step);
        jittered.max(advised.unwrap_or_default())
    }

    /// After a success, the next failure waits the shortest again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_ceiling_within_jitter_and_honours_the_advice() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<_> = (0..6).map(|_| b.next(None)).collect();
        for (wait, step) in waits.iter().zip([100, 200, 400, 800, 1000, 1000]) {
            let step = Duration::from_millis(step);
            assert!(*wait >= step / 2 && *wait <= step, "{waits:?}");
        }
        assert_eq!(b.next(Some(Duration::from_secs(5))), Duration::from_secs(5));
        b.reset();
        assert!(b.next(None) <= Duration::from_millis(100));
    }
}
