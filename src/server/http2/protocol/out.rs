//! The frames a connection sends (RFC 9113 §6), written into its outgoing
//! buffer, DATA within the peer's connection window.

use bytes::{BufMut, BytesMut};

use super::frame::{flag, kind, Reason, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, HEAD};
use super::window::SendWindow;
use crate::telemetry::{Direction, Http2Metrics, WriteClock};

/// A frame's head: its payload's length, type, flags and stream.
pub fn frame_head(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; HEAD] {
    debug_assert!(len < 1 << 24);
    let [_, l0, l1, l2] = (len as u32).to_be_bytes();
    let [s0, s1, s2, s3] = stream.to_be_bytes();
    [l0, l1, l2, kind, flags, s0, s1, s2, s3]
}

/// The frames a connection sends, gathered until its next write, and the
/// room the peer's connection window leaves for DATA.
pub struct Out {
    pub buf: BytesMut,
    /// The peer's connection window: what DATA frames may still carry.
    pub window: SendWindow,
    /// The largest frame the peer accepts.
    pub max_frame: usize,
    /// Streams that wait for room in the connection window, each once.
    pub starved: Vec<u32>,
    /// Streams whose response ended in this pass.
    pub closed: Vec<u32>,
    /// Where the RST_STREAM and GOAWAY frames sent are counted.
    pub metrics: Http2Metrics,
    /// The oldest change in `buf`, for the delivery latency.
    pub clock: WriteClock,
}

impl Default for Out {
    fn default() -> Self {
        Self {
            buf: BytesMut::new(),
            window: SendWindow::new(DEFAULT_WINDOW),
            max_frame: DEFAULT_MAX_FRAME,
            starved: Vec::new(),
            closed: Vec::new(),
            metrics: Http2Metrics::default(),
            clock: WriteClock::default(),
        }
    }
}

impl Out {
    pub fn head(&mut self, len: usize, kind: u8, flags: u8, stream: u32) {
        // One write, not five: a frame's head is written for every delivery.
        self.buf.put_slice(&frame_head(len, kind, flags, stream));
    }

    /// Names stream `id`, which found no room, among those waiting for the
    /// connection window, when that is what it lacks; `starved` is its
    /// flag for being named, cleared when the connection gets room.
    pub fn starve(&mut self, id: u32, window: SendWindow, starved: &mut bool) {
        if window.room() > 0 && !*starved {
            *starved = true;
            self.starved.push(id);
        }
    }

    pub fn settings(&mut self, values: &[(u16, u32)]) {
        self.head(6 * values.len(), kind::SETTINGS, 0, 0);
        for &(id, v) in values {
            self.buf.put_u16(id);
            self.buf.put_u32(v);
        }
    }

    pub fn settings_ack(&mut self) {
        self.head(0, kind::SETTINGS, flag::ACK, 0);
    }

    pub fn window_update(&mut self, stream: u32, increment: u32) {
        self.head(4, kind::WINDOW_UPDATE, 0, stream);
        self.buf.put_u32(increment);
    }

    pub fn ping(&mut self, ack: bool, opaque: [u8; 8]) {
        self.head(8, kind::PING, if ack { flag::ACK } else { 0 }, 0);
        self.buf.put_slice(&opaque);
    }

    pub fn reset(&mut self, stream: u32, reason: Reason) {
        self.metrics.reset(Direction::sent, reason.0);
        self.head(4, kind::RST_STREAM, 0, stream);
        self.buf.put_u32(reason.0);
    }

    pub fn goaway(&mut self, last_stream: u32, reason: Reason) {
        self.metrics.goaway(Direction::sent, reason.0);
        self.head(8, kind::GOAWAY, 0, 0);
        self.buf.put_u32(last_stream);
        self.buf.put_u32(reason.0);
    }

    /// A header block, in CONTINUATION frames after the first when it is
    /// larger than a frame.
    pub fn headers(&mut self, stream: u32, block: &[u8], end_stream: bool) {
        let mut chunks = block.chunks(self.max_frame).peekable();
        let mut kind = kind::HEADERS;
        let mut flags = if end_stream { flag::END_STREAM } else { 0 };
        loop {
            let chunk = chunks.next().unwrap_or_default();
            let last = chunks.peek().is_none();
            self.head(
                chunk.len(),
                kind,
                flags | if last { flag::END_HEADERS } else { 0 },
                stream,
            );
            self.buf.put_slice(chunk);
            if last {
                return;
            }
            kind = kind::CONTINUATION;
            flags = 0;
        }
    }

    /// Starts a DATA frame whose payload is written after it; returns where
    /// its header is, for [`Out::end_data`].
    pub fn begin_data(&mut self, stream: u32) -> usize {
        let at = self.buf.len();
        self.head(0, kind::DATA, 0, stream);
        at
    }

    /// Sets the length of the DATA frame begun at `at` to what was written
    /// after its header, and takes it from the connection window.
    pub fn end_data(&mut self, at: usize, end_stream: bool) -> usize {
        let len = self.buf.len() - at - HEAD;
        let b = &mut self.buf[at..at + HEAD];
        b[..3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        if end_stream {
            b[4] |= flag::END_STREAM;
        }
        self.window.take(len);
        len
    }

    /// One DATA frame carrying `data`, which must fit the windows.
    pub fn data(&mut self, stream: u32, data: &[u8], end_stream: bool) {
        let at = self.begin_data(stream);
        self.buf.put_slice(data);
        self.end_data(at, end_stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::http2::protocol::frame::Head;

    #[test]
    fn frames_read_back_as_written() {
        let mut out = Out::default();
        let at = out.begin_data(7);
        out.buf.put_slice(b"hello");
        assert_eq!(out.end_data(at, true), 5);
        assert_eq!(out.window.room(), DEFAULT_WINDOW - 5);
        let head = Head::read(&out.buf);
        assert_eq!(
            head,
            Head {
                len: 5,
                kind: kind::DATA,
                flags: flag::END_STREAM,
                stream: 7
            }
        );
        assert_eq!(&out.buf[HEAD..], b"hello");
    }

    #[test]
    fn a_large_header_block_is_continued() {
        let mut out = Out {
            max_frame: 4,
            ..Out::default()
        };
        out.headers(3, b"abcdefghij", true);
        let mut at = 0;
        let mut seen = Vec::new();
        while at < out.buf.len() {
            let h = Head::read(&out.buf[at..]);
            seen.push((
                h.kind,
                h.flags,
                out.buf[at + HEAD..at + HEAD + h.len].to_vec(),
            ));
            at += HEAD + h.len;
        }
        assert_eq!(
            seen,
            [
                (kind::HEADERS, flag::END_STREAM, b"abcd".to_vec()),
                (kind::CONTINUATION, 0, b"efgh".to_vec()),
                (kind::CONTINUATION, flag::END_HEADERS, b"ij".to_vec()),
            ]
        );
    }
}
