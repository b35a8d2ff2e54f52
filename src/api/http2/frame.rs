//! HTTP/2 frames (RFC 9113 §4, §6): reading a frame's header, and writing
//! the frames the server sends into the connection's outgoing buffer,
//! within the peer's connection window.

use bytes::{BufMut, BytesMut};

/// What a client sends first, before its SETTINGS.
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame's header.
pub(super) const HEAD: usize = 9;

/// The largest frame either side may send before SETTINGS say otherwise,
/// and the largest this server accepts.
pub(super) const DEFAULT_MAX_FRAME: usize = 16_384;

/// Every window's size before SETTINGS or WINDOW_UPDATE change it.
pub(super) const DEFAULT_WINDOW: i64 = 65_535;

/// The largest a flow-control window may grow.
pub(super) const MAX_WINDOW: i64 = (1 << 31) - 1;

pub(super) mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

pub(super) mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

pub(super) mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    pub fn read(b: &[u8]) -> Head {
        Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// A frame's payload without its padding (RFC 9113 §6.1); `None` when the
/// padding is longer than the frame.
pub(super) fn unpad(head: &Head, payload: &[u8]) -> Option<std::ops::Range<usize>> {
    if !head.has(flag::PADDED) {
        return Some(0..payload.len());
    }
    let pad = *payload.first()? as usize;
    (pad < payload.len()).then(|| 1..payload.len() - pad)
}

/// The frames a connection sends, gathered until its next write, and the
/// room the peer's connection window leaves for DATA.
pub(super) struct Out {
    pub buf: BytesMut,
    /// The peer's connection window: what DATA frames may still carry.
    pub window: i64,
    /// The largest frame the peer accepts.
    pub max_frame: usize,
    /// Streams that wait for room in the connection window, each once.
    pub starved: Vec<u32>,
    /// Streams whose response ended in this pass.
    pub closed: Vec<u32>,
}

impl Default for Out {
    fn default() -> Self {
        Self {
            buf: BytesMut::new(),
            window: DEFAULT_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            starved: Vec::new(),
            closed: Vec::new(),
        }
    }
}

impl Out {
    pub fn head(&mut self, len: usize, kind: u8, flags: u8, stream: u32) {
        debug_assert!(len < 1 << 24);
        self.buf.put_uint(len as u64, 3);
        self.buf.put_u8(kind);
        self.buf.put_u8(flags);
        self.buf.put_u32(stream);
    }

    /// Names stream `id`, which found no room, among those waiting for the
    /// connection window, when that is what it lacks; `starved` is its
    /// flag for being named, cleared when the connection gets room.
    pub fn starve(&mut self, id: u32, window: i64, starved: &mut bool) {
        if window > 0 && !*starved {
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
        self.head(4, kind::RST_STREAM, 0, stream);
        self.buf.put_u32(reason.0);
    }

    pub fn goaway(&mut self, last_stream: u32, reason: Reason) {
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
        self.window -= len as i64;
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

    #[test]
    fn frames_read_back_as_written() {
        let mut out = Out::default();
        let at = out.begin_data(7);
        out.buf.put_slice(b"hello");
        assert_eq!(out.end_data(at, true), 5);
        assert_eq!(out.window, DEFAULT_WINDOW - 5);
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

    #[test]
    fn padding_is_taken_off_and_checked() {
        let padded = Head {
            len: 5,
            kind: kind::DATA,
            flags: flag::PADDED,
            stream: 1,
        };
        assert_eq!(unpad(&padded, &[2, b'a', b'b', 0, 0]), Some(1..3));
        assert_eq!(unpad(&padded, &[9, b'a']), None);
        assert_eq!(unpad(&padded, &[]), None);
    }
}
