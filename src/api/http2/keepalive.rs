//! Keeping a connection alive: HTTP/2 pings, and the clock of the sweep
//! that finds reset watches.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use h2::{Ping, PingPong};
use tokio::time::{Instant, Sleep};

/// How often the connection looks for watches the client reset. A watch
/// sees a reset at its next delivery; one that gets none is ended within
/// this time.
const RESET_SWEEP: Duration = Duration::from_secs(1);

/// When the next sweep is due: on the same ticks for every connection of
/// the process, so that their sweeps wake a worker once rather than once
/// per connection.
pub(super) fn next_sweep(now: Instant) -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| now);
    let sweeps = now.saturating_duration_since(origin).as_nanos() / RESET_SWEEP.as_nanos();
    origin + RESET_SWEEP * (sweeps as u32 + 1)
}

/// HTTP/2 pings at an interval; a peer that does not answer within the
/// timeout is dead and its connection is closed.
pub(super) struct KeepAlive {
    ping_pong: PingPong,
    timer: Pin<Box<Sleep>>,
    awaiting_pong: bool,
    interval: Duration,
    timeout: Duration,
}

impl KeepAlive {
    pub(super) fn new(ping_pong: PingPong, interval: Duration, timeout: Duration) -> Self {
        Self {
            ping_pong,
            timer: Box::pin(tokio::time::sleep(interval)),
            awaiting_pong: false,
            interval,
            timeout,
        }
    }

    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Result<(), h2::Error> {
        if self.awaiting_pong {
            if let Poll::Ready(pong) = self.ping_pong.poll_pong(cx) {
                pong?;
                self.awaiting_pong = false;
                self.timer.as_mut().reset(Instant::now() + self.interval);
            }
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            if self.awaiting_pong {
                return Err(h2::Error::from(h2::Reason::NO_ERROR));
            }
            self.ping_pong.send_ping(Ping::opaque())?;
            self.awaiting_pong = true;
            self.timer.as_mut().reset(Instant::now() + self.timeout);
            let _ = self.timer.as_mut().poll(cx);
            if let Poll::Ready(pong) = self.ping_pong.poll_pong(cx) {
                pong?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_sweeps_on_the_same_ticks() {
        let start = Instant::now();
        let first = next_sweep(start);
        assert!(first > start && first <= start + RESET_SWEEP);
        // A connection that starts or sweeps later in the same period is
        // due at the same instant, the one after that a period later.
        for later in [1, 400, 999] {
            let now = first - RESET_SWEEP + Duration::from_millis(later);
            if now >= start {
                assert_eq!(next_sweep(now), first);
            }
        }
        assert_eq!(next_sweep(first), first + RESET_SWEEP);
        assert_eq!(next_sweep(first + RESET_SWEEP / 2), first + RESET_SWEEP);
    }
}
