//! An HTTP/2 client written frame by frame, for what well-behaved clients
//! never send.
#![allow(dead_code)] // each test binary uses a different part of it

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PRIORITY_FLAG: u8 = 0x20;

/// A frame as read: kind, flags, stream and payload.
pub type Frame = (u8, u8, u32, Bytes);

pub struct Raw {
    pub tcp: TcpStream,
    buf: BytesMut,
}

impl Raw {
    /// Connects, sends the preface and an empty SETTINGS.
    pub async fn connect(addr: SocketAddr) -> Raw {
        Self::connect_with(addr, &[]).await
    }

    /// Connects, sends the preface and SETTINGS of `settings`.
    pub async fn connect_with(addr: SocketAddr, settings: &[(u16, u32)]) -> Raw {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Raw {
            tcp,
            buf: BytesMut::new(),
        };
        let mut payload = Vec::new();
        for (id, v) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&v.to_be_bytes());
        }
        raw.send(SETTINGS, 0, 0, &payload).await;
        raw
    }

    pub async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        self.tcp
            .write_all(&frame(kind, flags, stream, payload))
            .await
            .unwrap();
    }

    /// The next frame; `None` at the end of the connection or after `wait`
    /// with nothing.
    pub async fn frame_within(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let head = self.buf.split_to(9);
                    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                    return Some((head[3], head[4], stream, self.buf.split_to(len).freeze()));
                }
            }
            let read = tokio::time::timeout_at(deadline, self.tcp.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// The next frame; `None` at the end of the connection.
    pub async fn frame(&mut self) -> Option<Frame> {
        let frame = self.frame_within(Duration::from_secs(10)).await;
        frame
    }

    /// The error code of the GOAWAY that ends the connection.
    pub async fn goaway(&mut self) -> u32 {
        let mut reason = None;
        while let Some((kind, _, _, payload)) = self.frame().await {
            if kind == GOAWAY {
                reason = Some(code(&payload[4..]));
            }
        }
        reason.expect("a GOAWAY before the end")
    }
}

/// A frame's bytes.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A big-endian u32 at the front of `b`.
pub fn code(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A header block of `fields`, each a literal the decoder's table does not
/// keep, so that blocks need no shared state.
pub fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        for s in [name, value] {
            assert!(s.len() < 127, "short strings only");
            block.push(s.len() as u8);
            block.extend_from_slice(s.as_bytes());
        }
    }
    block
}

/// The fields of a gRPC request to `path`.
pub fn grpc_fields(path: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// A header block of a gRPC request to `path`, as a client's encoder
/// writes it.
pub fn request_block(path: &str) -> Vec<u8> {
    let fields = grpc_fields(path);
    loona_hpack::Encoder::new().encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
}
