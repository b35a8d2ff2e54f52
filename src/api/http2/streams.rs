//! A connection's streams, as its task keeps them: each one's state (a
//! watch's request arriving, its start, the live watch, a bridged call),
//! both sides' windows for it, and what ends it.

use bytes::BytesMut;
use futures::future::AbortHandle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::Status;

use super::bridge::Call;
use super::connection::Fail;
use super::connection::{Driver, RECEIVE_WINDOW};
use super::frame::{Reason, MAX_WINDOW};
use super::stream::{write_refusal, LiveWatch};
use super::watches::Drive;
use super::Routes;
use crate::api::WatchStream;
use crate::dispatch::Place;
use crate::telemetry::Bound;

/// Streams the client may reset, unanswered, in [`Resets::PERIOD`]: a
/// client that opens streams only to reset them makes the server start
/// and drop a call for each (CVE-2023-44487) and is sent away.
#[derive(Default)]
pub(super) struct Resets {
    since: Option<Instant>,
    count: u32,
}

impl Resets {
    const MAX: u32 = 1000;
    const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

    /// Counts one; false past the bound.
    pub(super) fn allow(&mut self, now: Instant) -> bool {
        match self.since {
            Some(since) if now.duration_since(since) < Self::PERIOD => self.count += 1,
            _ => (self.since, self.count) = (Some(now), 1),
        }
        self.count <= Self::MAX
    }
}

/// What the client may still send, on a stream or on the connection, and
/// what it sent that was read and not yet given back.
pub(super) struct RecvWindow {
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
    pub(super) fn take(&mut self, n: u32) -> bool {
        self.left -= n as i64;
        self.left >= 0
    }

    /// Gives `n` read bytes back: what to send in a WINDOW_UPDATE, once
    /// half the window is owed.
    pub(super) fn release(&mut self, n: u32) -> Option<u32> {
        self.owed += n;
        (self.owed >= RECEIVE_WINDOW / 2).then(|| {
            let increment = std::mem::take(&mut self.owed);
            self.left += increment as i64;
            increment
        })
    }
}

/// A Watch's request as it arrives; its start waits for it.
pub(super) struct Reading {
    /// What came so far. Its bytes hold their credit in the connection's
    /// window until the request is whole, so the window bounds what all
    /// the connection's unfinished requests hold.
    pub body: BytesMut,
    /// Where the whole body goes.
    pub whole: oneshot::Sender<BytesMut>,
    /// The start, which waits for the body.
    pub abort: AbortHandle,
}

/// A stream, as its connection keeps it: open, or half-closed (local or
/// remote) while `remote_open` says whether the client may still send
/// (RFC 9113 §5.1). A stream that is not kept is idle (above the highest
/// opened) or closed ([`Closed`]).
pub(super) struct Entry {
    pub state: State,
    /// The client may still send on it.
    pub remote_open: bool,
    pub recv: RecvWindow,
    /// The client's window for it, until a watch or call takes it.
    pub send: i64,
    pub length: BodyLength,
}

/// A request body's length against its `content-length`, when it has one
/// (RFC 9113 §8.1.1).
pub(super) struct BodyLength {
    declared: Option<u64>,
    received: u64,
}

impl BodyLength {
    pub(super) fn new(declared: Option<u64>) -> Self {
        Self {
            declared,
            received: 0,
        }
    }

    /// Counts `n` bytes of body; false once they are more than declared,
    /// or, at the end, fewer.
    pub(super) fn take(&mut self, n: usize, end: bool) -> bool {
        self.received += n as u64;
        self.declared.is_none_or(|d| {
            if end {
                self.received == d
            } else {
                self.received <= d
            }
        })
    }
}

/// A stream that is not kept: never opened, or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    Idle,
    /// Reset by the server lately: what the client sent before it saw the
    /// reset is dropped without a word (RFC 9113 §5.4.2).
    ResetHere,
    /// Ended lately: a frame other than PRIORITY, WINDOW_UPDATE or
    /// RST_STREAM on it is STREAM_CLOSED (§5.1).
    Ended,
    /// Below the highest stream opened, and not among those that ended
    /// lately: never opened (closed when a higher one was, §5.1.1), or long
    /// gone.
    Forgotten,
}

/// The streams that closed lately and how, the most recent kept: a fixed
/// bound on what a connection remembers of its past.
#[derive(Default)]
pub(super) struct RecentlyClosed {
    ids: std::collections::VecDeque<(u32, Closed)>,
}

impl RecentlyClosed {
    const KEPT: usize = 256;

    pub(super) fn insert(&mut self, id: u32, how: Closed) {
        if self.ids.len() == Self::KEPT {
            self.ids.pop_front();
        }
        self.ids.push_back((id, how));
    }

    /// How stream `id` closed, if it did lately.
    pub(super) fn get(&self, id: u32) -> Option<Closed> {
        self.ids
            .iter()
            .rev()
            .find(|(i, _)| *i == id)
            .map(|&(_, how)| how)
    }
}

/// A header block whose CONTINUATION frames are still to come.
pub(super) struct Continuing {
    pub id: u32,
    pub end_stream: bool,
    /// Its HEADERS named the stream as its own dependency.
    pub self_dependent: bool,
    pub block: Vec<u8>,
}

pub(super) enum State {
    /// A Watch whose request is still arriving.
    Reading(Reading),
    /// A Watch waiting for its start.
    Starting(AbortHandle),
    Watch(Place),
    Call(Call),
}

impl<S: Routes> Driver<S> {
    /// A watch's start ended: it streams, or its refusal is sent.
    pub(super) fn started(&mut self, id: u32, started: Result<WatchStream, Status>) {
        let Some(entry) = self.streams.get_mut(&id) else {
            return;
        };
        match started {
            Ok(events) => {
                let place = events.place();
                let mut watch = LiveWatch::start(id, events, entry.send, &mut self.out);
                if self.aged_out && watch.end_aged(&mut self.out).is_ready() {
                    return self.close_ended();
                }
                entry.state = State::Watch(place);
                self.watches.insert(place, watch);
            }
            Err(status) => {
                write_refusal(&mut self.out, id, status);
                self.out.closed.push(id);
                self.close_ended();
            }
        }
    }

    /// Forgets the streams whose responses ended in this pass.
    pub(super) fn close_ended(&mut self) {
        for id in std::mem::take(&mut self.out.closed) {
            if let Some(entry) = self.streams.remove(&id) {
                let how = if entry.remote_open {
                    // The response is whole: the rest of the request is
                    // not wanted (RFC 9113 §8.1).
                    self.out.reset(id, Reason::NO_ERROR);
                    Closed::ResetHere
                } else {
                    Closed::Ended
                };
                self.closed.insert(id, how);
                self.release(entry);
            }
        }
    }

    /// What a stream that is not kept is: idle or closed.
    pub(super) fn closed_state(&self, id: u32) -> Closed {
        if id > self.last_stream {
            return Closed::Idle;
        }
        self.closed.get(id).unwrap_or(Closed::Forgotten)
    }

    /// Answers a stream error: RST_STREAM, and the stream ends. Counted
    /// with the client's resets: a client that makes the server reset
    /// stream after stream (MadeYouReset, CVE-2025-8671) is sent away.
    pub(super) fn reset_stream(&mut self, id: u32, reason: Reason) -> Result<(), Fail> {
        self.out.reset(id, reason);
        self.drop_stream(id, Closed::ResetHere);
        if !self.resets.allow(Instant::now()) {
            self.out.metrics.sent_away(Bound::resets);
            return Err(Fail::Protocol(Reason::ENHANCE_YOUR_CALM));
        }
        Ok(())
    }

    /// Ends a stream now: the client reset it, or it broke the protocol.
    /// False when it had ended already.
    pub(super) fn drop_stream(&mut self, id: u32, how: Closed) -> bool {
        self.closed.insert(id, how);
        let Some(entry) = self.streams.remove(&id) else {
            return false;
        };
        self.release(entry);
        true
    }

    /// Lets go of what a stream that ended held: its start or task, its
    /// watch, and the credit of a request that never came whole.
    fn release(&mut self, entry: Entry) {
        match entry.state {
            State::Reading(Reading { abort, body, .. }) => {
                abort.abort();
                self.give_back_connection(body.len() as u32);
            }
            State::Starting(abort) => abort.abort(),
            State::Watch(place) => {
                self.watches.remove(place);
            }
            State::Call(call) => {
                if let Some(task) = &call.task {
                    task.abort();
                }
            }
        }
    }

    /// Gives `n` bytes read on stream `id` back to the client's window for
    /// it, once half its window is owed.
    pub(super) fn give_back(&mut self, id: u32, n: u32) {
        let Some(entry) = self.streams.get_mut(&id).filter(|e| e.remote_open) else {
            return;
        };
        if let Some(increment) = entry.recv.release(n) {
            self.out.window_update(id, increment);
        }
    }

    pub(super) fn give_back_connection(&mut self, n: u32) {
        if let Some(increment) = self.recv.release(n) {
            self.out.window_update(0, increment);
        }
    }

    /// The client gave room on the connection: the streams that waited
    /// for it go on.
    pub(super) fn feed_starved(&mut self) {
        for id in std::mem::take(&mut self.out.starved) {
            let Some(entry) = self.streams.get_mut(&id) else {
                continue;
            };
            match &mut entry.state {
                State::Watch(place) => {
                    self.watches.grant(*place, LiveWatch::unstarve);
                }
                State::Call(call) => {
                    call.starved = false;
                    call.flush(id, &mut self.out);
                }
                State::Reading(..) | State::Starting(_) => {}
            }
        }
    }

    /// The client gave `n` bytes of room on stream `id` (negative: took);
    /// false when that takes its window past 2^31-1.
    pub(super) fn feed(&mut self, id: u32, n: i64) -> bool {
        let Some(entry) = self.streams.get_mut(&id) else {
            return true;
        };
        match &mut entry.state {
            State::Watch(place) => self.watches.grant(*place, |w| w.grant(n)),
            State::Call(call) => {
                call.window += n;
                if call.window > MAX_WINDOW {
                    return false;
                }
                call.flush(id, &mut self.out);
                true
            }
            State::Reading(..) | State::Starting(_) => {
                entry.send += n;
                entry.send <= MAX_WINDOW
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_past_the_bound_within_a_period_are_refused() {
        let mut resets = Resets::default();
        let start = Instant::now();
        for _ in 0..Resets::MAX {
            assert!(resets.allow(start));
        }
        assert!(!resets.allow(start + Resets::PERIOD / 2));
        assert!(resets.allow(start + Resets::PERIOD), "a new period");
    }
}
