//! What a client sends on its connection: the frames read, checked as RFC
//! 9113 asks, and acted on. A frame that breaks the protocol for the whole
//! connection ends it with GOAWAY; one that breaks a stream resets it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::time::Instant;

use super::connection::{Driver, Fail};
use super::frame::{
    flag, kind, setting, unpad, Head, Reason, DEFAULT_MAX_FRAME, HEAD, MAX_WINDOW, PREFACE,
};
use super::hpack::MAX_HEADER_LIST;
use super::stream::request_limit;
use super::streams::State;
use super::Routes;
use crate::api::error::ApiError;

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
    /// client has closed the connection.
    pub(super) fn poll_frames(&mut self, cx: &mut Context<'_>) -> Result<Poll<()>, Fail> {
        for _ in 0..READS {
            self.rbuf.reserve(READ_SIZE);
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.socket.read), cx, &mut self.rbuf)
            {
                Poll::Pending => return Ok(Poll::Pending),
                Poll::Ready(Ok(0)) => return Ok(Poll::Ready(())),
                Poll::Ready(Ok(_)) => self.take_frames()?,
                Poll::Ready(Err(e)) => return Err(e.into()),
            }
        }
        // More may be waiting: read on in the next pass.
        cx.waker().wake_by_ref();
        Ok(Poll::Pending)
    }

    fn take_frames(&mut self) -> Result<(), Fail> {
        if !self.preface_read {
            let n = self.rbuf.len().min(PREFACE.len());
            if self.rbuf[..n] != PREFACE[..n] {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            self.rbuf.advance(PREFACE.len());
            self.preface_read = true;
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
        if !self.settings_read && (head.kind != kind::SETTINGS || head.has(flag::ACK)) {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        }
        if let Some((id, ..)) = &self.continuing {
            if head.kind != kind::CONTINUATION || head.stream != *id {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
        }
        match head.kind {
            kind::DATA => self.on_data(head, payload),
            kind::HEADERS => self.on_headers(head, payload),
            kind::CONTINUATION => {
                let Some((id, end, mut block)) = self.continuing.take() else {
                    return Err(protocol(Reason::PROTOCOL_ERROR));
                };
                block.extend_from_slice(&payload);
                if block.len() > 4 * MAX_HEADER_LIST {
                    return Err(protocol(Reason::ENHANCE_YOUR_CALM));
                }
                if head.has(flag::END_HEADERS) {
                    self.on_block(id, end, &block)
                } else {
                    self.continuing = Some((id, end, block));
                    Ok(())
                }
            }
            kind::PRIORITY if head.stream == 0 => Err(protocol(Reason::PROTOCOL_ERROR)),
            kind::RST_STREAM => {
                if head.len != 4 {
                    return Err(protocol(Reason::FRAME_SIZE_ERROR));
                }
                if head.stream == 0 || head.stream > self.last_stream {
                    return Err(protocol(Reason::PROTOCOL_ERROR));
                }
                if self.drop_stream(head.stream) && !self.resets.allow(Instant::now()) {
                    return Err(protocol(Reason::ENHANCE_YOUR_CALM));
                }
                Ok(())
            }
            kind::SETTINGS => self.on_settings(head, &payload),
            kind::PUSH_PROMISE => Err(protocol(Reason::PROTOCOL_ERROR)),
            kind::PING => {
                if head.len != 8 {
                    return Err(protocol(Reason::FRAME_SIZE_ERROR));
                }
                if head.stream != 0 {
                    return Err(protocol(Reason::PROTOCOL_ERROR));
                }
                if head.has(flag::ACK) {
                    self.keep_alive.pong(&payload);
                } else {
                    let mut opaque = [0; 8];
                    opaque.copy_from_slice(&payload);
                    self.out.ping(true, opaque);
                }
                Ok(())
            }
            kind::GOAWAY if head.stream != 0 => Err(protocol(Reason::PROTOCOL_ERROR)),
            kind::GOAWAY => {
                self.peer_gone = true;
                Ok(())
            }
            kind::WINDOW_UPDATE => self.on_window_update(head, &payload),
            // PRIORITY is advice this server does not take; unknown frames
            // are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    fn on_data(&mut self, head: Head, payload: Bytes) -> Result<(), Fail> {
        let id = head.stream;
        if id == 0 {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        }
        let len = head.len as u32;
        if !self.recv.take(len) {
            return Err(protocol(Reason::FLOW_CONTROL_ERROR));
        }
        let Some(range) = unpad(&head, &payload) else {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        };
        let data = payload.slice(range);
        let end = head.has(flag::END_STREAM);
        let Some(entry) = self.streams.get_mut(&id) else {
            if id > self.last_stream {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
            // A stream that ended: what was in flight is dropped.
            self.give_back_connection(len);
            return Ok(());
        };
        let overflow = !entry.recv.take(len);
        let broken = if !entry.remote_open {
            Some(Reason::STREAM_CLOSED)
        } else if overflow {
            Some(Reason::FLOW_CONTROL_ERROR)
        } else {
            None
        };
        if let Some(reason) = broken {
            self.out.reset(id, reason);
            self.drop_stream(id);
            self.give_back_connection(len);
            return Ok(());
        }
        entry.remote_open = !end;
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
                    call.body = None;
                }
            }
            State::Reading(_, body) => {
                body.extend_from_slice(&data);
                let max = self.settings.max_message_bytes;
                let declared = (body.len() >= 5)
                    .then(|| u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize);
                if let Some(declared) = declared.filter(|&d| d > max) {
                    refusal = Some(ApiError::RequestTooLarge { len: declared, max });
                } else if body.len() > request_limit(max) {
                    refusal = Some(ApiError::MalformedRequest(
                        "the request holds more than one message".into(),
                    ));
                } else {
                    whole = end;
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
        self.give_back(id, now);
        self.give_back_connection(now);
        Ok(())
    }

    fn on_headers(&mut self, head: Head, payload: Bytes) -> Result<(), Fail> {
        if head.stream == 0 {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        }
        let Some(range) = unpad(&head, &payload) else {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        };
        let mut fragment = payload.slice(range);
        if head.has(flag::PRIORITY) {
            if fragment.len() < 5 {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
            fragment.advance(5);
        }
        let end = head.has(flag::END_STREAM);
        if head.has(flag::END_HEADERS) {
            self.on_block(head.stream, end, &fragment)
        } else {
            self.continuing = Some((head.stream, end, fragment.to_vec()));
            Ok(())
        }
    }

    fn on_settings(&mut self, head: Head, payload: &[u8]) -> Result<(), Fail> {
        if head.stream != 0 {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        }
        if head.has(flag::ACK) {
            return if head.len == 0 {
                Ok(())
            } else {
                Err(protocol(Reason::FRAME_SIZE_ERROR))
            };
        }
        if !head.len.is_multiple_of(6) {
            return Err(protocol(Reason::FRAME_SIZE_ERROR));
        }
        self.settings_read = true;
        for s in payload.chunks(6) {
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match u16::from_be_bytes([s[0], s[1]]) {
                setting::INITIAL_WINDOW_SIZE => {
                    if v as i64 > MAX_WINDOW {
                        return Err(protocol(Reason::FLOW_CONTROL_ERROR));
                    }
                    let delta = v as i64 - self.peer_window;
                    self.peer_window = v as i64;
                    let ids: Vec<u32> = self.streams.keys().copied().collect();
                    for id in ids {
                        self.feed(id, delta);
                    }
                }
                setting::MAX_FRAME_SIZE => {
                    if !(DEFAULT_MAX_FRAME as u32..=(1 << 24) - 1).contains(&v) {
                        return Err(protocol(Reason::PROTOCOL_ERROR));
                    }
                    self.out.max_frame = v as usize;
                }
                // The server's header blocks never use the peer's table.
                setting::HEADER_TABLE_SIZE | setting::MAX_CONCURRENT_STREAMS => {}
                _ => {}
            }
        }
        self.out.settings_ack();
        Ok(())
    }

    fn on_window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), Fail> {
        if head.len != 4 {
            return Err(protocol(Reason::FRAME_SIZE_ERROR));
        }
        let n = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff)
            as i64;
        if head.stream == 0 {
            if n == 0 {
                return Err(protocol(Reason::PROTOCOL_ERROR));
            }
            self.out.window += n;
            if self.out.window > MAX_WINDOW {
                return Err(protocol(Reason::FLOW_CONTROL_ERROR));
            }
            self.feed_starved();
            return Ok(());
        }
        if head.stream > self.last_stream {
            return Err(protocol(Reason::PROTOCOL_ERROR));
        }
        if n == 0 {
            self.out.reset(head.stream, Reason::PROTOCOL_ERROR);
            self.drop_stream(head.stream);
            return Ok(());
        }
        self.feed(head.stream, n);
        Ok(())
    }
}
