//! The states of streams and of the connection, as RFC 9113 §5.1 draws
//! them for a server, and what a connection remembers of its past:
//!
//! ```text
//!                  +--------+
//!          recv H  |        |
//!      ,-----------|  idle  |
//!     /            |        |
//!    v             +--------+
//! +--------+   recv ES   +----------+
//! |        |------------>|   half   |
//! |  open  |             |  closed  |
//! |        |             | (remote) |
//! +--------+             +----------+
//!      |  send ES + RST,      |  send ES
//!      |  send R, recv R      |  send R, recv R
//!      v                      v
//! +---------------------------------+
//! |             closed              |
//! +---------------------------------+
//! ```
//!
//! The server never stays half-closed (local): a response that ends before
//! its request resets what remains of the request (§8.1). Idle and closed
//! streams are not kept: a stream above the highest opened is idle, and
//! one below it is closed, remembered for a while with how it closed
//! ([`RecentlyClosed`]).

use tokio::time::Instant;

use super::frame::{Reason, DEFAULT_WINDOW};
use super::window::RecvWindow;

/// Where the client's side of a kept stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    Open,
    /// The client sent END_STREAM: only WINDOW_UPDATE, PRIORITY and
    /// RST_STREAM may follow.
    HalfClosedRemote,
}

/// A kept stream's receiving side: its state, its window and its body's
/// length against what the request declared.
pub struct RecvSide {
    pub state: StreamState,
    pub window: RecvWindow,
    pub length: BodyLength,
}

impl RecvSide {
    /// A stream whose HEADERS arrived, ending it when `end`; a request
    /// that ends before the body its `content-length` names is a
    /// PROTOCOL_ERROR (§8.1.1).
    pub fn open(declared: Option<u64>, end: bool) -> Result<RecvSide, Reason> {
        let mut length = BodyLength::new(declared);
        if end && !length.take(0, true) {
            return Err(Reason::PROTOCOL_ERROR);
        }
        Ok(RecvSide {
            state: if end {
                StreamState::HalfClosedRemote
            } else {
                StreamState::Open
            },
            window: RecvWindow::default(),
            length,
        })
    }

    /// Whether the client may still send on it.
    pub fn is_open(&self) -> bool {
        self.state == StreamState::Open
    }

    /// A DATA frame of `len` flow-controlled bytes carrying `body` bytes:
    /// the stream error it is, if any (§5.1, §6.9.1, §8.1.1).
    pub fn recv_data(&mut self, len: u32, body: usize, end: bool) -> Result<(), Reason> {
        if self.state != StreamState::Open {
            return Err(Reason::STREAM_CLOSED);
        }
        if !self.window.take(len) {
            return Err(Reason::FLOW_CONTROL_ERROR);
        }
        if !self.length.take(body, end) {
            return Err(Reason::PROTOCOL_ERROR);
        }
        if end {
            self.state = StreamState::HalfClosedRemote;
        }
        Ok(())
    }

    /// The header block that ends a request: trailers (§8.1), which must
    /// end the stream.
    pub fn recv_trailers(&mut self, end: bool) -> Result<(), Reason> {
        if self.state != StreamState::Open {
            return Err(Reason::STREAM_CLOSED);
        }
        if !end || !self.length.take(0, true) {
            return Err(Reason::PROTOCOL_ERROR);
        }
        self.state = StreamState::HalfClosedRemote;
        Ok(())
    }
}

/// What the protocol keeps of a connection, apart from its streams.
pub struct Session {
    /// Where the connection is in its life.
    pub conn: ConnState,
    pub decoder: loona_hpack::Decoder<'static>,
    /// A header block whose CONTINUATION frames are still to come.
    pub continuing: Option<Continuing>,
    /// The highest stream the client opened.
    pub last_stream: u32,
    /// The window the client gives each new stream.
    pub peer_window: i64,
    /// What the client may still send on the connection.
    pub recv: RecvWindow,
    /// Resets by either side, bounded per period.
    pub resets: Resets,
    /// Streams that closed lately, and how.
    pub closed: RecentlyClosed,
}

impl Default for Session {
    fn default() -> Self {
        Self {
            conn: ConnState::Preface,
            decoder: hpack_decoder(),
            continuing: None,
            last_stream: 0,
            peer_window: DEFAULT_WINDOW,
            recv: RecvWindow::default(),
            resets: Resets::default(),
            closed: RecentlyClosed::default(),
        }
    }
}

impl Session {
    /// What a stream that is not kept is: idle or closed.
    pub fn closed_state(&self, id: u32) -> Closed {
        if id > self.last_stream {
            return Closed::Idle;
        }
        self.closed.get(id).unwrap_or(Closed::Forgotten)
    }
}

/// The decoder of a connection's requests. Its table may grow to the
/// default SETTINGS_HEADER_TABLE_SIZE (4,096 bytes), which the server
/// never raises; a client's size update beyond it is a COMPRESSION_ERROR
/// (RFC 7541 §6.3), not a table that grows to what the client names.
pub fn hpack_decoder() -> loona_hpack::Decoder<'static> {
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
    decoder
}

/// SETTINGS_HEADER_TABLE_SIZE as the server keeps it: the default.
const HEADER_TABLE_SIZE: usize = 4096;

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// The client's preface is still to come (§3.4).
    Preface,
    /// Its first frame, SETTINGS, is still to come.
    Settings,
    Open,
    /// GOAWAY went one way or both: the streams opened before it are
    /// served, new ones refused.
    GoingAway {
        /// The server sent it: at shutdown or at the connection's age.
        sent: bool,
        /// The client sent it.
        received: bool,
        /// The connection reached its maximum age: its watches ended.
        aged: bool,
    },
}

impl ConnState {
    /// Whether a new stream may open.
    pub fn accepts_streams(self) -> bool {
        matches!(self, ConnState::Open)
    }

    pub fn goaway_sent(self) -> bool {
        matches!(self, ConnState::GoingAway { sent: true, .. })
    }

    pub fn aged(self) -> bool {
        matches!(self, ConnState::GoingAway { aged: true, .. })
    }

    /// The connection ends once its streams have.
    pub fn draining(self) -> bool {
        matches!(self, ConnState::GoingAway { .. })
    }

    /// The server sends GOAWAY (`aged`: at the connection's age); false
    /// when it had.
    pub fn send_goaway(&mut self, aged: bool) -> bool {
        let (was_sent, received, was_aged) = match *self {
            ConnState::GoingAway {
                sent,
                received,
                aged,
            } => (sent, received, aged),
            _ => (false, false, false),
        };
        *self = ConnState::GoingAway {
            sent: true,
            received,
            aged: was_aged || aged,
        };
        !was_sent
    }

    /// The client sent GOAWAY.
    pub fn recv_goaway(&mut self) {
        let (sent, aged) = match *self {
            ConnState::GoingAway { sent, aged, .. } => (sent, aged),
            _ => (false, false),
        };
        *self = ConnState::GoingAway {
            sent,
            received: true,
            aged,
        };
    }
}

/// Streams the client may reset, unanswered, in [`Resets::PERIOD`]: a
/// client that opens streams only to reset them makes the server start
/// and drop a call for each (CVE-2023-44487) and is sent away.
#[derive(Default)]
pub struct Resets {
    since: Option<Instant>,
    count: u32,
}

impl Resets {
    const MAX: u32 = 1000;
    const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

    /// Counts one; false past the bound.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.since {
            Some(since) if now.duration_since(since) < Self::PERIOD => self.count += 1,
            _ => (self.since, self.count) = (Some(now), 1),
        }
        self.count <= Self::MAX
    }
}

/// A request body's length against its `content-length`, when it has one
/// (RFC 9113 §8.1.1).
pub struct BodyLength {
    declared: Option<u64>,
    received: u64,
}

impl BodyLength {
    pub fn new(declared: Option<u64>) -> Self {
        Self {
            declared,
            received: 0,
        }
    }

    /// Counts `n` bytes of body; false once they are more than declared,
    /// or, at the end, fewer.
    pub fn take(&mut self, n: usize, end: bool) -> bool {
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
pub enum Closed {
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
pub struct RecentlyClosed {
    ids: std::collections::VecDeque<(u32, Closed)>,
}

impl RecentlyClosed {
    const KEPT: usize = 256;

    pub fn insert(&mut self, id: u32, how: Closed) {
        if self.ids.len() == Self::KEPT {
            self.ids.pop_front();
        }
        self.ids.push_back((id, how));
    }

    /// How stream `id` closed, if it did lately.
    pub fn get(&self, id: u32) -> Option<Closed> {
        self.ids
            .iter()
            .rev()
            .find(|(i, _)| *i == id)
            .map(|&(_, how)| how)
    }
}

/// A header block whose CONTINUATION frames are still to come.
pub struct Continuing {
    pub id: u32,
    pub end_stream: bool,
    /// Its HEADERS named the stream as its own dependency.
    pub self_dependent: bool,
    pub block: Vec<u8>,
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

    /// Each transition of the receiving side, and the error RFC 9113 names
    /// for a frame its state does not take.
    #[test]
    fn a_stream_moves_as_section_5_1_draws_it() {
        let mut s = RecvSide::open(None, false).unwrap();
        assert_eq!(s.recv_data(10, 10, false), Ok(()));
        assert_eq!(s.recv_data(10, 10, true), Ok(()));
        assert_eq!(s.state, StreamState::HalfClosedRemote);
        assert_eq!(s.recv_data(1, 1, false), Err(Reason::STREAM_CLOSED));
        assert_eq!(s.recv_trailers(true), Err(Reason::STREAM_CLOSED));

        let mut s = RecvSide::open(Some(4), false).unwrap();
        assert_eq!(
            s.recv_data(5, 5, false),
            Err(Reason::PROTOCOL_ERROR),
            "past content-length"
        );
        let mut s = RecvSide::open(Some(4), false).unwrap();
        assert_eq!(s.recv_data(3, 3, false), Ok(()));
        assert_eq!(
            s.recv_trailers(true),
            Err(Reason::PROTOCOL_ERROR),
            "short of it"
        );
        assert!(RecvSide::open(Some(1), true).is_err());

        let mut s = RecvSide::open(None, false).unwrap();
        assert_eq!(
            s.recv_trailers(false),
            Err(Reason::PROTOCOL_ERROR),
            "trailers end the stream"
        );
        let mut s = RecvSide::open(None, false).unwrap();
        assert_eq!(
            s.recv_data(2 * 1024 * 1024, 0, false),
            Err(Reason::FLOW_CONTROL_ERROR)
        );
    }

    #[test]
    fn goaway_either_way_stops_new_streams_and_says_who_sent_it() {
        let mut c = ConnState::Open;
        assert!(c.accepts_streams());
        c.recv_goaway();
        assert!(!c.accepts_streams() && !c.goaway_sent() && c.draining());
        assert!(c.send_goaway(false));
        assert!(!c.send_goaway(true), "sent once");
        assert!(c.goaway_sent() && c.aged());
    }

    #[test]
    fn recently_closed_streams_are_remembered_within_a_bound() {
        let mut r = RecentlyClosed::default();
        r.insert(1, Closed::ResetHere);
        assert_eq!(r.get(1), Some(Closed::ResetHere));
        for id in 0..RecentlyClosed::KEPT as u32 {
            r.insert(3 + 2 * id, Closed::Ended);
        }
        assert_eq!(r.get(1), None, "the oldest is forgotten");
    }
}
