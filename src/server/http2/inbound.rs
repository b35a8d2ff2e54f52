//! What a client sends on its connection: the frames read, checked as RFC
//! 9113 asks, and acted on. A frame that breaks the protocol for the whole
//! connection ends it with GOAWAY; one that breaks a stream resets it.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::telemetry::{Bound, Direction};
use bytes::{Buf, Bytes};
use tokio::time::Instant;

use super::connection::{Driver, Fail};
use super::protocol::frame::{
    flag, kind, Data, Error, GoAway, Head, Headers, Ping, Priority, Reason, RstStream, Settings,
    WindowUpdate, DEFAULT_MAX_FRAME, HEAD, PREFACE,
};
use super::protocol::hpack::MAX_HEADER_BLOCK;
use super::protocol::state::{Closed, ConnState, Continuing};
use super::table::State;
use super::Routes;
use crate::server::admission::check_partial;

/// Reads of the socket in one pass; then the others get their turn.
const READS: usize = 4;

/// Room made in the read buffer before each read: a whole frame of the
/// largest size this server takes.
const READ_SIZE: usize = HEAD + DEFAULT_MAX_FRAME;

fn protocol(reason: Reason) -> Fail {
    Fail::Protocol(reason)
}

impl<S: Routes> Driver<S> {
    /// Reads what the socket has and acts on its frames: `Ready` once the
    /// client has closed the connection. The reads wake the read waker,
    /// which the connection's passes check before reading again.
    pub(super) fn poll_frames(&mut self, cx: &mut Context<'_>) -> Result<Poll<()>, Fail> {
        let waker = self.read_waker.clone();
        let mut read_cx = Context::from_waker(&waker);
        for _ in 0..READS {
            self.rbuf.reserve(READ_SIZE);
            let socket = Pin::new(&mut self.socket.read);
            match tokio_util::io::poll_read_buf(socket, &mut read_cx, &mut self.rbuf) {
                Poll::Pending => return Ok(Poll::Pending),
                Poll::Ready(Ok(0)) => return Ok(Poll::Ready(())),
                Poll::Ready(Ok(_)) => self.take_frames()?,
                Poll::Ready(Err(e)) => return Err(e.into()),
            }
        }
        // More may be waiting: read on in the next pass.
        waker.wake_by_ref();
        cx.waker().wake_by_ref();
        Ok(Poll::Pending)
    }

    fn take_frames(&mut self) -> Result<(), Fail> {
        let _entered = self.span.clone().entered();
        if self.h2.conn == ConnState::Preface {
            let n = self.rbuf.len().min(PREFACE.len());
            if self.rbuf[..n] != PREFACE[..n] {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            self.rbuf.advance(PREFACE.len());
            self.h2.conn = ConnState::Settings;
        }
        while self.rbuf.len() >= HEAD {
            let head = Head::read(&self.rbuf);
            if head.len > DEFAULT_MAX_FRAME {
                return Err(protocol(Reason::FRAME_SIZE_ERROR));
            }
            if self.rbuf.len() < HEAD + head.len {
                break;
            }
            self.rbuf.advance(HEAD);
            let payload = self.rbuf.split_to(head.len).freeze();
            self.frame(head, payload)?;
        }
        Ok(())
    }

    fn frame(&mut self, head: Head, payload: Bytes) -> Result<(), Fail> {
        match self.load(head, payload) {
            Ok(()) => Ok(()),
            Err(Error::Connection(reason)) => Err(protocol(reason)),
            Err(Error::Stream(id, reason)) => self.reset_stream(id, reason),
        }
    }

    /// Acts on one frame, each checked by its type's `load`.
    fn load(&mut self, head: Head, payload: Bytes) -> Result<(), Error> {
        if self.h2.conn == ConnState::Settings
            && (head.kind != kind::SETTINGS || head.has(flag::ACK))
        {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        if let Some(c) = &self.h2.continuing {
            if head.kind != kind::CONTINUATION || head.stream != c.id {
                return Err(Reason::PROTOCOL_ERROR.into());
            }
        }
        match head.kind {
            kind::DATA => self.on_data(head, Data::load(&head, payload)?),
            kind::HEADERS => self.on_headers(head.stream, Headers::load(&head, payload)?),
            kind::CONTINUATION => {
                let Some(mut c) = self.h2.continuing.take() else {
                    return Err(Reason::PROTOCOL_ERROR.into());
                };
                c.block.extend_from_slice(&payload);
                if c.block.len() > MAX_HEADER_BLOCK {
                    self.out.metrics.sent_away(Bound::header_block);
                    return Err(Reason::ENHANCE_YOUR_CALM.into());
                }
                if head.has(flag::END_HEADERS) {
                    self.on_block(c)
                } else {
                    self.h2.continuing = Some(c);
                    Ok(())
                }
            }
            // Advice this server does not take, on any stream in any
            // state, once its form is checked.
            kind::PRIORITY => Priority::load(&head, &payload).map(drop),
            kind::RST_STREAM => {
                let reset = RstStream::load(&head, &payload)?;
                self.out.metrics.reset(Direction::received, reset.reason.0);
                if self.is_idle(head.stream) {
                    return Err(Reason::PROTOCOL_ERROR.into());
                }
                // Closed by the client: what it sends next is its error,
                // even after a reset of the server's.
                let dropped = self.drop_stream(head.stream, Closed::Ended);
                if dropped && !self.h2.resets.allow(Instant::now()) {
                    self.out.metrics.sent_away(Bound::resets);
                    return Err(Reason::ENHANCE_YOUR_CALM.into());
                }
                Ok(())
            }
            kind::SETTINGS => match Settings::load(&head, &payload)? {
                Some(settings) => self.on_settings(settings),
                None => Ok(()),
            },
            kind::PUSH_PROMISE => Err(Reason::PROTOCOL_ERROR.into()),
            kind::PING => {
                let ping = Ping::load(&head, &payload)?;
                if ping.ack {
                    self.keep_alive.pong(&ping.opaque);
                } else {
                    self.out.ping(true, ping.opaque);
                }
                Ok(())
            }
            kind::GOAWAY => {
                let goaway = GoAway::load(&head, &payload)?;
                self.out
                    .metrics
                    .goaway(Direction::received, goaway.reason.0);
                self.h2.conn.recv_goaway();
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let update = WindowUpdate::load(&head, &payload)?;
                self.on_window_update(head.stream, update.increment)
            }
            // Unknown frames are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    /// Whether stream `id` was never opened: only HEADERS and PRIORITY may
    /// name it (RFC 9113 §5.1).
    fn is_idle(&self, id: u32) -> bool {
        self.h2.closed_state(id) == Closed::Idle
    }

    fn on_data(&mut self, head: Head, frame: Data) -> Result<(), Error> {
        let id = head.stream;
        // Padding counts against the windows too (RFC 9113 §6.9.1).
        let len = head.len as u32;
        if !self.h2.recv.take(len) {
            return Err(Reason::FLOW_CONTROL_ERROR.into());
        }
        let Some(entry) = self.streams.get_mut(&id) else {
            self.release_connection_window(len);
            return match self.h2.closed_state(id) {
                Closed::Idle => Err(Reason::PROTOCOL_ERROR.into()),
                // In flight when the server reset it: dropped.
                Closed::ResetHere => Ok(()),
                Closed::Ended | Closed::Forgotten => Err(Reason::STREAM_CLOSED.on(id)),
            };
        };
        if let Err(reason) = entry
            .recv
            .recv_data(len, frame.data.len(), frame.end_stream)
        {
            self.release_connection_window(len);
            return Err(reason.on(id));
        }
        let (data, end) = (frame.data, frame.end_stream);
        let data_len = data.len() as u32;
        // What is given back now; the rest as the call reads it.
        let mut now = len;
        let mut refusal = None;
        let mut whole = false;
        match &mut entry.state {
            State::Call(call) => {
                if let Some(body) = &call.body {
                    if data_len > 0 && body.send(data).is_ok() {
                        now = len - data_len;
                    }
                }
                if end {
                    call.request_ended(id, &mut self.out);
                }
            }
            State::Reading(reading) => {
                let body = &mut reading.body;
                body.extend_from_slice(&data);
                // HeldResponses until the request is whole.
                now = len - data_len;
                match check_partial(body, self.settings.max_request_bytes) {
                    Ok(()) => whole = end,
                    Err(refused) => refusal = Some(refused),
                }
            }
            State::Session { requests, .. } => {
                if let Some(tx) = requests {
                    if data_len > 0 && tx.send(data).is_ok() {
                        now = len - data_len;
                    }
                }
                if end {
                    *requests = None;
                }
            }
            // A watch has read its request: more is not wanted.
            State::Starting(_) | State::Watch(_) => {}
        }
        if let Some(refusal) = refusal {
            self.refuse(id, refusal.into());
        } else if whole {
            self.begin_watch(id);
        }
        self.release_stream_window(id, now);
        self.release_connection_window(now);
        Ok(())
    }

    fn on_headers(&mut self, id: u32, frame: Headers) -> Result<(), Error> {
        let block = Continuing {
            id,
            end_stream: frame.end_stream,
            self_dependent: frame.self_dependent,
            block: frame.fragment.to_vec(),
        };
        if frame.end_headers {
            self.on_block(block)
        } else {
            self.h2.continuing = Some(block);
            Ok(())
        }
    }

    fn on_settings(&mut self, settings: Settings) -> Result<(), Error> {
        if self.h2.conn == ConnState::Settings {
            self.h2.conn = ConnState::Open;
        }
        if let Some(v) = settings.initial_window_size {
            // Only the frame's last value is applied, so one frame of many
            // entries costs one walk of the streams, not one per entry.
            let delta = v as i64 - self.h2.peer_window;
            self.h2.peer_window = v as i64;
            if delta != 0 {
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                for id in ids {
                    if !self.feed(id, delta) {
                        // RFC 9113 §6.9.2: a window past 2^31-1.
                        return Err(Reason::FLOW_CONTROL_ERROR.into());
                    }
                }
            }
        }
        if let Some(v) = settings.max_frame_size {
            self.out.max_frame = v as usize;
        }
        self.out.settings_ack();
        Ok(())
    }

    fn on_window_update(&mut self, id: u32, n: u32) -> Result<(), Error> {
        if id == 0 {
            self.out.window.grant(n as i64)?;
            self.feed_starved();
            return Ok(());
        }
        if self.is_idle(id) {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        // A closed stream's may still come (RFC 9113 §6.9): ignored.
        if !self.feed(id, n as i64) {
            return Err(Reason::FLOW_CONTROL_ERROR.on(id));
        }
        Ok(())
    }
}
