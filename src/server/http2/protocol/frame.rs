//! HTTP/2 frames as a client sends them (RFC 9113 §4, §6): each frame's
//! header, and one type per frame whose `load` holds that frame's rules,
//! refusing what breaks them with the error RFC 9113 names, scoped to the
//! stream or to the connection (§5.4).

use bytes::{Buf, Bytes};

/// What a client sends first, before its SETTINGS.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame's header.
pub const HEAD: usize = 9;

/// The largest frame either side may send before SETTINGS say otherwise,
/// and the largest this server accepts.
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// Every window's size before SETTINGS or WINDOW_UPDATE change it.
pub const DEFAULT_WINDOW: i64 = 65_535;

/// The largest a flow-control window may grow.
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub mod kind {
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

pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub u32);

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
pub struct Head {
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

/// A protocol error (RFC 9113 §5.4): one stream's, answered with
/// RST_STREAM, or the connection's, answered with GOAWAY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    Stream(u32, Reason),
    Connection(Reason),
}

impl Reason {
    /// This reason as a stream error on `id`.
    pub fn on(self, id: u32) -> Error {
        Error::Stream(id, self)
    }
}

impl From<Reason> for Error {
    fn from(reason: Reason) -> Self {
        Error::Connection(reason)
    }
}

/// A frame's payload without its padding (RFC 9113 §6.1): padding as long
/// as the frame or longer is a connection PROTOCOL_ERROR.
fn unpad(head: &Head, mut payload: Bytes) -> Result<Bytes, Error> {
    if !head.has(flag::PADDED) {
        return Ok(payload);
    }
    let pad = *payload.first().ok_or(Reason::PROTOCOL_ERROR)? as usize;
    if pad >= payload.len() {
        return Err(Reason::PROTOCOL_ERROR.into());
    }
    payload.truncate(payload.len() - pad);
    payload.advance(1);
    Ok(payload)
}

/// DATA (§6.1).
pub struct Data {
    pub data: Bytes,
    pub end_stream: bool,
}

impl Data {
    pub fn load(head: &Head, payload: Bytes) -> Result<Data, Error> {
        if head.stream == 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        Ok(Data {
            data: unpad(head, payload)?,
            end_stream: head.has(flag::END_STREAM),
        })
    }
}

/// HEADERS (§6.2): the first fragment of a header block.
pub struct Headers {
    pub fragment: Bytes,
    pub end_stream: bool,
    pub end_headers: bool,
    /// The stream named itself as its dependency (§5.3.1): a stream
    /// PROTOCOL_ERROR, once the block is read to keep the HPACK table.
    pub self_dependent: bool,
}

impl Headers {
    pub fn load(head: &Head, payload: Bytes) -> Result<Headers, Error> {
        if head.stream == 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        let mut fragment = unpad(head, payload)?;
        let mut self_dependent = false;
        if head.has(flag::PRIORITY) {
            if fragment.len() < 5 {
                return Err(Reason::FRAME_SIZE_ERROR.into());
            }
            self_dependent = dependency(&fragment) == head.stream;
            fragment.advance(5);
        }
        Ok(Headers {
            fragment,
            end_stream: head.has(flag::END_STREAM),
            end_headers: head.has(flag::END_HEADERS),
            self_dependent,
        })
    }
}

/// The stream a priority field names, without its exclusive bit.
fn dependency(field: &[u8]) -> u32 {
    u32::from_be_bytes([field[0], field[1], field[2], field[3]]) & 0x7fff_ffff
}

/// PRIORITY (§6.3): advice this server does not take, but whose form is
/// checked.
pub struct Priority;

impl Priority {
    pub fn load(head: &Head, payload: &[u8]) -> Result<Priority, Error> {
        if head.stream == 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        if payload.len() != 5 {
            return Err(Reason::FRAME_SIZE_ERROR.on(head.stream));
        }
        if dependency(payload) == head.stream {
            return Err(Reason::PROTOCOL_ERROR.on(head.stream));
        }
        Ok(Priority)
    }
}

/// RST_STREAM (§6.4).
pub struct RstStream {
    pub reason: Reason,
}

impl RstStream {
    pub fn load(head: &Head, payload: &[u8]) -> Result<RstStream, Error> {
        if payload.len() != 4 {
            return Err(Reason::FRAME_SIZE_ERROR.into());
        }
        if head.stream == 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
        Ok(RstStream {
            reason: Reason(code),
        })
    }
}

/// SETTINGS (§6.5): the last value of each parameter the frame carries,
/// as the parameters are applied in order. An ACK is `None`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub header_table_size: Option<u32>,
    pub initial_window_size: Option<u32>,
    pub max_frame_size: Option<u32>,
}

impl Settings {
    pub fn load(head: &Head, payload: &[u8]) -> Result<Option<Settings>, Error> {
        if head.stream != 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        if head.has(flag::ACK) {
            return match payload.is_empty() {
                true => Ok(None),
                false => Err(Reason::FRAME_SIZE_ERROR.into()),
            };
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Reason::FRAME_SIZE_ERROR.into());
        }
        let mut settings = Settings::default();
        for s in payload.chunks(6) {
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match u16::from_be_bytes([s[0], s[1]]) {
                setting::HEADER_TABLE_SIZE => settings.header_table_size = Some(v),
                setting::ENABLE_PUSH if v > 1 => return Err(Reason::PROTOCOL_ERROR.into()),
                setting::INITIAL_WINDOW_SIZE if v as i64 > MAX_WINDOW => {
                    return Err(Reason::FLOW_CONTROL_ERROR.into())
                }
                setting::INITIAL_WINDOW_SIZE => settings.initial_window_size = Some(v),
                setting::MAX_FRAME_SIZE
                    if !(DEFAULT_MAX_FRAME as u32..=(1 << 24) - 1).contains(&v) =>
                {
                    return Err(Reason::PROTOCOL_ERROR.into())
                }
                setting::MAX_FRAME_SIZE => settings.max_frame_size = Some(v),
                // The server never pushes, and its header blocks never
                // use the peer's table; unknown parameters are ignored.
                _ => {}
            }
        }
        Ok(Some(settings))
    }
}

/// PING (§6.7).
pub struct Ping {
    pub ack: bool,
    pub opaque: [u8; 8],
}

impl Ping {
    pub fn load(head: &Head, payload: &[u8]) -> Result<Ping, Error> {
        if payload.len() != 8 {
            return Err(Reason::FRAME_SIZE_ERROR.into());
        }
        if head.stream != 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        let mut opaque = [0; 8];
        opaque.copy_from_slice(payload);
        Ok(Ping {
            ack: head.has(flag::ACK),
            opaque,
        })
    }
}

/// GOAWAY (§6.8).
pub struct GoAway {
    pub reason: Reason,
}

impl GoAway {
    pub fn load(head: &Head, payload: &[u8]) -> Result<GoAway, Error> {
        if head.stream != 0 {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        if payload.len() < 8 {
            return Err(Reason::FRAME_SIZE_ERROR.into());
        }
        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
        Ok(GoAway {
            reason: Reason(code),
        })
    }
}

/// WINDOW_UPDATE (§6.9): the increment, never 0.
pub struct WindowUpdate {
    pub increment: u32,
}

impl WindowUpdate {
    pub fn load(head: &Head, payload: &[u8]) -> Result<WindowUpdate, Error> {
        if payload.len() != 4 {
            return Err(Reason::FRAME_SIZE_ERROR.into());
        }
        let increment = dependency(payload);
        if increment == 0 {
            return Err(match head.stream {
                0 => Reason::PROTOCOL_ERROR.into(),
                id => Reason::PROTOCOL_ERROR.on(id),
            });
        }
        Ok(WindowUpdate { increment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(kind: u8, flags: u8, stream: u32, len: usize) -> Head {
        Head {
            len,
            kind,
            flags,
            stream,
        }
    }

    #[test]
    fn padding_is_taken_off_and_checked() {
        let padded = head(kind::DATA, flag::PADDED, 1, 5);
        let data = Data::load(&padded, Bytes::from_static(&[2, b'a', b'b', 0, 0])).unwrap();
        assert_eq!(&data.data[..], b"ab");
        for bad in [&[9, b'a'][..], &[1], &[]] {
            let e = Data::load(&padded, Bytes::copy_from_slice(bad)).err();
            assert_eq!(e, Some(Error::Connection(Reason::PROTOCOL_ERROR)));
        }
    }

    /// One row per rule: the frame, and the error RFC 9113 names for it.
    #[test]
    fn each_frame_is_refused_as_its_section_says() {
        use Reason as R;
        type Load = fn(&Head, &[u8]) -> Result<(), Error>;
        let priority: Load = |h, p| Priority::load(h, p).map(drop);
        let rst: Load = |h, p| RstStream::load(h, p).map(drop);
        let settings: Load = |h, p| Settings::load(h, p).map(drop);
        let ping: Load = |h, p| Ping::load(h, p).map(drop);
        let goaway: Load = |h, p| GoAway::load(h, p).map(drop);
        let window: Load = |h, p| WindowUpdate::load(h, p).map(drop);
        let headers: Load = |h, p| Headers::load(h, Bytes::copy_from_slice(p)).map(drop);
        let conn = Error::Connection;
        type Row<'a> = (&'a str, Load, Head, &'a [u8], Option<Error>);
        let rows: [Row; 17] = [
            (
                "6.2 HEADERS on stream 0",
                headers,
                head(1, 4, 0, 1),
                &[0x82],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.2 priority field cut short",
                headers,
                head(1, 0x24, 1, 2),
                &[0, 0],
                Some(conn(R::FRAME_SIZE_ERROR)),
            ),
            (
                "5.3.1 HEADERS depending on itself",
                headers,
                head(1, 0x24, 3, 6),
                &[0, 0, 0, 3, 0, 0x82],
                None,
            ),
            (
                "6.3 PRIORITY on stream 0",
                priority,
                head(2, 0, 0, 5),
                &[0, 0, 0, 1, 0],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.3 PRIORITY of 4 octets",
                priority,
                head(2, 0, 1, 4),
                &[0, 0, 0, 3],
                Some(R::FRAME_SIZE_ERROR.on(1)),
            ),
            (
                "5.3.1 PRIORITY depending on itself",
                priority,
                head(2, 0, 5, 5),
                &[0, 0, 0, 5, 0],
                Some(R::PROTOCOL_ERROR.on(5)),
            ),
            (
                "6.4 RST_STREAM of 3 octets",
                rst,
                head(3, 0, 1, 3),
                &[0, 0, 8],
                Some(conn(R::FRAME_SIZE_ERROR)),
            ),
            (
                "6.4 RST_STREAM on stream 0",
                rst,
                head(3, 0, 0, 4),
                &[0, 0, 0, 8],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.5 SETTINGS on a stream",
                settings,
                head(4, 0, 1, 0),
                &[],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.5 SETTINGS ACK with a payload",
                settings,
                head(4, 1, 0, 6),
                &[0, 3, 0, 0, 0, 1],
                Some(conn(R::FRAME_SIZE_ERROR)),
            ),
            (
                "6.5 SETTINGS of 5 octets",
                settings,
                head(4, 0, 0, 5),
                &[0, 3, 0, 0, 0],
                Some(conn(R::FRAME_SIZE_ERROR)),
            ),
            (
                "6.5.2 ENABLE_PUSH of 2",
                settings,
                head(4, 0, 0, 6),
                &[0, 2, 0, 0, 0, 2],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.5.2 INITIAL_WINDOW_SIZE past 2^31-1",
                settings,
                head(4, 0, 0, 6),
                &[0, 4, 0x80, 0, 0, 0],
                Some(conn(R::FLOW_CONTROL_ERROR)),
            ),
            (
                "6.5.2 MAX_FRAME_SIZE below 2^14",
                settings,
                head(4, 0, 0, 6),
                &[0, 5, 0, 0, 0x3f, 0xff],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.7 PING on a stream",
                ping,
                head(6, 0, 1, 8),
                &[0; 8],
                Some(conn(R::PROTOCOL_ERROR)),
            ),
            (
                "6.8 GOAWAY of 7 octets",
                goaway,
                head(7, 0, 0, 7),
                &[0; 7],
                Some(conn(R::FRAME_SIZE_ERROR)),
            ),
            (
                "6.9 WINDOW_UPDATE of 0 on a stream",
                window,
                head(8, 0, 3, 4),
                &[0; 4],
                Some(R::PROTOCOL_ERROR.on(3)),
            ),
        ];
        for (section, load, head, payload, want) in rows {
            assert_eq!(load(&head, payload).err(), want, "{section}");
        }
        assert_eq!(
            WindowUpdate::load(&head(8, 0, 0, 4), &[0; 4]).err(),
            Some(conn(R::PROTOCOL_ERROR)),
            "6.9 WINDOW_UPDATE of 0 on the connection"
        );
        let h = Headers::load(
            &head(1, 0x24, 3, 6),
            Bytes::from_static(&[0, 0, 0, 3, 0, 0x82]),
        );
        assert!(h.unwrap().self_dependent);
    }

    #[test]
    fn settings_keep_the_last_value_of_each_parameter() {
        let payload = [0, 4, 0, 0, 0, 1, 0, 4, 0, 0, 0, 9, 0, 5, 0, 0, 0x40, 0];
        let s = Settings::load(&head(4, 0, 0, 18), &payload)
            .unwrap()
            .unwrap();
        assert_eq!(s.initial_window_size, Some(9));
        assert_eq!(s.max_frame_size, Some(16_384));
        assert_eq!(Settings::load(&head(4, 1, 0, 0), &[]).unwrap(), None);
    }
}
