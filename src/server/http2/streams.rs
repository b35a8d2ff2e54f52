//! The life of a connection's streams: a watch's start ending, responses
//! ending, streams reset by either side, and the windows of both sides.

use tokio::time::Instant;
use tonic::Status;

use super::connection::{Driver, Fail};
use super::feed::Feed;
use super::live_watch::{write_refusal, LiveWatch};
use super::protocol::frame::Reason;
use super::protocol::state::Closed;
use super::table::{Entry, Reading, State};
use super::watches::Drive;
use super::Routes;
use crate::api::WatchStream;
use crate::telemetry::Bound;

impl<S: Routes> Driver<S> {
    /// A watch's start ended: it streams, or its refusal is sent.
    pub(super) fn started(&mut self, id: u32, started: Result<WatchStream, Status>) {
        let Some(entry) = self.streams.get_mut(&id) else {
            return;
        };
        match started {
            Ok(events) => {
                let place = events.place();
                let mut watch =
                    LiveWatch::start(id, Feed::Watch(events), entry.send, &mut self.out);
                let mut lane = watch.lane();
                if self.h2.conn.aged() && watch.end_aged(&mut lane, &mut self.out).is_ready() {
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
                let how = if entry.recv.is_open() {
                    // The response is whole: the rest of the request is
                    // not wanted (RFC 9113 §8.1).
                    self.out.reset(id, Reason::NO_ERROR);
                    Closed::ResetHere
                } else {
                    Closed::Ended
                };
                self.h2.closed.insert(id, how);
                self.release(entry);
            }
        }
    }

    /// Resets a stream that is not kept, and remembers it did: what the
    /// client sent before it saw the reset is dropped.
    pub(super) fn reset_here(&mut self, id: u32, reason: Reason) {
        self.out.reset(id, reason);
        self.h2.closed.insert(id, Closed::ResetHere);
    }

    /// Answers a stream error: RST_STREAM, and the stream ends. Counted
    /// with the client's resets: a client that makes the server reset
    /// stream after stream (MadeYouReset, CVE-2025-8671) is sent away.
    pub(super) fn reset_stream(&mut self, id: u32, reason: Reason) -> Result<(), Fail> {
        self.out.reset(id, reason);
        self.drop_stream(id, Closed::ResetHere);
        if !self.h2.resets.allow(Instant::now()) {
            self.out.metrics.sent_away(Bound::resets);
            return Err(Fail::Protocol(Reason::ENHANCE_YOUR_CALM));
        }
        Ok(())
    }

    /// Ends a stream now: the client reset it, or it broke the protocol.
    /// False when it had ended already.
    pub(super) fn drop_stream(&mut self, id: u32, how: Closed) -> bool {
        self.h2.closed.insert(id, how);
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
                self.release_connection_window(body.len() as u32);
            }
            State::Starting(abort) => abort.abort(),
            State::Watch(place) | State::Session { place, .. } => {
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
    pub(super) fn release_stream_window(&mut self, id: u32, n: u32) {
        let Some(entry) = self.streams.get_mut(&id).filter(|e| e.recv.is_open()) else {
            return;
        };
        if let Some(increment) = entry.recv.window.release(n) {
            self.out.window_update(id, increment);
        }
    }

    pub(super) fn release_connection_window(&mut self, n: u32) {
        if let Some(increment) = self.h2.recv.release(n) {
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
                State::Watch(place) | State::Session { place, .. } => {
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
            State::Watch(place) | State::Session { place, .. } => {
                self.watches.grant(*place, |w| w.grant(n))
            }
            State::Call(call) => {
                if call.window.grant(n).is_err() {
                    return false;
                }
                call.flush(id, &mut self.out);
                true
            }
            State::Reading(..) | State::Starting(_) => entry.send.grant(n).is_ok(),
        }
    }
}
