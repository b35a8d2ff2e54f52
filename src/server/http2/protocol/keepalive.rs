//! Keeping a connection alive: an HTTP/2 PING at an interval; a peer that
//! does not answer within the timeout is dead and its connection closed.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::out::Out;

/// The payload of the server's pings, which their acknowledgements echo.
pub const OPAQUE: [u8; 8] = *b"wp-alive";

pub struct KeepAlive {
    timer: Pin<Box<Sleep>>,
    awaiting_pong: bool,
    interval: Duration,
    timeout: Duration,
}

/// The peer did not answer a ping in time.
#[derive(Debug)]
pub struct Dead;

impl KeepAlive {
    pub fn new(interval: Duration, timeout: Duration) -> Self {
        Self {
            timer: Box::pin(tokio::time::sleep(interval)),
            awaiting_pong: false,
            interval,
            timeout,
        }
    }

    /// Sends a ping when one is due.
    pub fn poll(&mut self, cx: &mut Context<'_>, out: &mut Out) -> Result<(), Dead> {
        if self.timer.as_mut().poll(cx).is_ready() {
            if self.awaiting_pong {
                return Err(Dead);
            }
            out.ping(false, OPAQUE);
            self.awaiting_pong = true;
            self.timer.as_mut().reset(Instant::now() + self.timeout);
            let _ = self.timer.as_mut().poll(cx);
        }
        Ok(())
    }

    /// The peer acknowledged a ping with `opaque`.
    pub fn pong(&mut self, opaque: &[u8]) {
        if self.awaiting_pong && opaque == OPAQUE {
            self.awaiting_pong = false;
            self.timer.as_mut().reset(Instant::now() + self.interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_answer_is_dead() {
        let mut alive = KeepAlive::new(Duration::from_secs(10), Duration::from_secs(5));
        let mut out = Out::default();
        let mut cx = Context::from_waker(Waker::noop());
        alive.poll(&mut cx, &mut out).unwrap();
        assert!(out.buf.is_empty(), "nothing before the interval");
        tokio::time::advance(Duration::from_secs(10)).await;
        alive.poll(&mut cx, &mut out).unwrap();
        assert_eq!(&out.buf[9..], &OPAQUE, "a ping");
        tokio::time::advance(Duration::from_secs(4)).await;
        alive.pong(b"other!!!");
        alive.poll(&mut cx, &mut out).unwrap();
        alive.pong(&OPAQUE);
        tokio::time::advance(Duration::from_secs(9)).await;
        alive.poll(&mut cx, &mut out).unwrap();
        assert_eq!(out.buf.len(), 17, "answered: no second ping yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        alive.poll(&mut cx, &mut out).unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(alive.poll(&mut cx, &mut out).is_err(), "unanswered");
    }
}
