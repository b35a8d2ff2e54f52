//! Flow-control windows (RFC 9113 §6.9): what the client may still send,
//! and what the server may still send it, each with its overflow check.

use super::frame::{Reason, MAX_WINDOW};

/// The HTTP/2 receive window of each stream and of the connection.
pub const RECEIVE_WINDOW: u32 = 1024 * 1024;

/// What the client may still send, on a stream or on the connection, and
/// what it sent that was read and not yet given back.
pub struct RecvWindow {
    left: i64,
    owed: u32,
}

impl Default for RecvWindow {
    fn default() -> Self {
        Self {
            left: RECEIVE_WINDOW as i64,
            owed: 0,
        }
    }
}

impl RecvWindow {
    /// Takes `n` bytes the client sent: false when they overflow it.
    pub fn take(&mut self, n: u32) -> bool {
        self.left -= n as i64;
        self.left >= 0
    }

    /// Gives `n` read bytes back: what to send in a WINDOW_UPDATE, once
    /// half the window is owed.
    pub fn release(&mut self, n: u32) -> Option<u32> {
        self.owed += n;
        (self.owed >= RECEIVE_WINDOW / 2).then(|| {
            let increment = std::mem::take(&mut self.owed);
            self.left += increment as i64;
            increment
        })
    }
}

/// What the server may still send, on a stream or on the connection: the
/// client's window for it. It goes below zero when the client takes room
/// back with SETTINGS (§6.9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWindow(i64);

impl SendWindow {
    pub fn new(initial: i64) -> Self {
        SendWindow(initial)
    }

    /// The client gave `n` bytes (negative: took them back); a window past
    /// 2^31-1 is a FLOW_CONTROL_ERROR (§6.9.1).
    pub fn grant(&mut self, n: i64) -> Result<(), Reason> {
        self.0 += n;
        match self.0 > MAX_WINDOW {
            true => Err(Reason::FLOW_CONTROL_ERROR),
            false => Ok(()),
        }
    }

    /// `n` bytes were sent.
    pub fn take(&mut self, n: usize) {
        self.0 -= n as i64;
    }

    /// What may be sent now.
    pub fn room(self) -> i64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_window_past_its_maximum_is_a_flow_control_error() {
        let mut w = SendWindow::new(65_535);
        assert_eq!(w.grant(MAX_WINDOW - 65_535), Ok(()));
        assert_eq!(w.grant(1), Err(Reason::FLOW_CONTROL_ERROR));
        let mut w = SendWindow::new(10);
        w.take(30);
        assert_eq!(w.room(), -20);
        assert_eq!(w.grant(-5), Ok(()), "SETTINGS may take room back");
    }

    #[test]
    fn credit_is_given_back_once_half_the_window_is_owed() {
        let mut w = RecvWindow::default();
        assert!(w.take(RECEIVE_WINDOW));
        assert!(!w.take(1), "past the window");
        let mut w = RecvWindow::default();
        assert!(w.take(1000));
        assert_eq!(w.release(1000), None);
        assert!(w.take(RECEIVE_WINDOW / 2));
        assert_eq!(
            w.release(RECEIVE_WINDOW / 2),
            Some(RECEIVE_WINDOW / 2 + 1000)
        );
    }
}
