//! A watch sending its events on its HTTP/2 stream, driven by its
//! connection's task, which frames its ready events straight into the
//! connection's outgoing buffer, and the lane the connection keeps beside
//! it for the live changes it takes without reading the watch.

use std::task::{Context, Poll};

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, StatusCode};
use tonic::Status;

use super::feed::Feed;
use super::grpc_framing::{put_data_message, put_data_with, PREFIX};
use super::protocol::hpack::write_fields;
use super::protocol::out::Out;
use super::protocol::socket::WRITE_LIMIT;
use super::protocol::window::SendWindow;
use super::watches::Drive;
use crate::access::GrantEpoch;
use crate::api::wire::WatchMessage;
use crate::api::Steady;
use crate::dispatch::Offer;
use crate::telemetry::WatchApi;

/// Events ready together for one stream go out as one DATA frame of up to
/// this size.
const BATCH_BYTES: usize = 8 * 1024;

/// What one poll of a watch frames at most; a watch with more ready (an
/// initial state, a replay) is polled again in the next pass, after the
/// connection has written this one's frames. Without it a joining watch
/// framed as much as its client's window allowed, megabytes, in one pass.
const POLL_BYTES: usize = 2 * BATCH_BYTES;

/// What a direct delivery reads of a live watch, kept by its connection
/// beside the watch rather than in it: the connection's short records,
/// one per watch in a dense map, are read for every delivery, and the
/// watch itself only when it is polled.
pub(super) struct Lane {
    /// Set when a poll leaves a `watchproxy.v1` watch with nothing sent,
    /// held or due before its next live change ([`WatchStream::steady`]):
    /// until it is polled again, such a change is framed from here, and
    /// what it moved is given back to the watch then ([`Drive::settle`]).
    steady: Option<Steady>,
    /// What `steady` is judged against; none for an etcd stream.
    epoch: Option<GrantEpoch>,
    id: u32,
    /// The stream's window while `steady` is set (the watch's own is
    /// behind it until then).
    window: SendWindow,
}

/// A watch sending its events on its HTTP/2 stream.
pub(super) struct LiveWatch {
    id: u32,
    /// Named in `out.starved`.
    starved: bool,
    /// The peer's window for the stream.
    window: SendWindow,
    events: Feed,
    /// Messages cut but not sent: the windows had no room for them.
    held: BytesMut,
    /// How the watch ended, sent once `held` is.
    ended: Option<Status>,
}

impl LiveWatch {
    /// Sends the response's head and starts sending events.
    pub(super) fn start(id: u32, events: Feed, window: SendWindow, out: &mut Out) -> Self {
        let mut head = HeaderMap::new();
        head.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        if let Some(codec) = events.codec() {
            head.insert("grpc-encoding", HeaderValue::from_static(codec.name()));
        }
        let mut block = Vec::new();
        write_fields(Some(StatusCode::OK), &head, &mut block);
        out.headers(id, &block, false);
        Self {
            id,
            starved: false,
            window,
            events,
            held: BytesMut::new(),
            ended: None,
        }
    }

    /// The peer gave (or with new SETTINGS took) room on the stream;
    /// false when that takes the window past 2^31-1.
    pub(super) fn grant(&mut self, n: i64) -> bool {
        self.window.grant(n).is_ok()
    }

    /// The connection got room: the watch may be named again.
    pub(super) fn unstarve(&mut self) -> bool {
        self.starved = false;
        true
    }

    /// What the windows let the stream send now.
    fn room(&self, out: &Out) -> usize {
        room(self.window, out)
    }

    /// Frames a change an etcd Watch stream takes at once (see
    /// [`crate::etcd_api::EtcdStream::offer`]).
    fn offer_etcd(&mut self, offer: &Offer<'_>, out: &mut Out) -> bool {
        if !self.held.is_empty() || self.ended.is_some() {
            return false;
        }
        let room = self.room(out);
        let Feed::Etcd(session) = &mut self.events else {
            return false;
        };
        let fits = |len| PREFIX + len <= room;
        let Some(response) = session.offer(offer, fits) else {
            return false;
        };
        out.clock.note(WatchApi::etcd, response.received());
        let n = put_data_with(out, self.id, false, response.encoded_len(), |b| {
            response.encode_raw(b)
        });
        self.window.take(n);
        true
    }

    /// Frames what is ready (see [`Drive::poll_drive`]).
    fn drive(&mut self, cx: &mut Context<'_>, out: &mut Out) -> Poll<()> {
        self.events.begin_pass();
        let mut framed = 0;
        loop {
            if framed >= POLL_BYTES {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !self.send_held(out) {
                return Poll::Pending;
            }
            if let Some(status) = self.ended.take() {
                write_trailers(out, self.id, &status);
                out.closed.push(self.id);
                return Poll::Ready(());
            }
            let room = self.room(out);
            if room == 0 {
                out.starve(self.id, self.window, &mut self.starved);
                return Poll::Pending;
            }
            let at = out.begin_data(self.id);
            let start = out.buf.len();
            let limit = room.min(BATCH_BYTES);
            let mut waiting = false;
            while out.buf.len() - start < limit {
                match self.events.poll_put(cx, &mut out.buf, &mut out.clock) {
                    Poll::Ready(Some(Ok(()))) if self.events.emptied() => {
                        waiting = true;
                        break;
                    }
                    Poll::Ready(Some(Ok(()))) => {}
                    Poll::Ready(Some(Err(status))) => {
                        self.ended = Some(status);
                        break;
                    }
                    Poll::Ready(None) => {
                        self.ended = Some(Status::ok(""));
                        break;
                    }
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                }
            }
            if out.buf.len() - start > room {
                // Copied out rather than split off, which would pin the
                // connection's whole buffer while the client gives no room.
                self.held.extend_from_slice(&out.buf[start + room..]);
                out.buf.truncate(start + room);
            }
            if out.buf.len() == start {
                out.buf.truncate(at);
            } else {
                let n = out.end_data(at, false);
                self.window.take(n);
                framed += n;
            }
            if waiting && self.held.is_empty() {
                return Poll::Pending;
            }
        }
    }

    /// Sends what `held` has, as far as the windows allow: false while
    /// some is left.
    fn send_held(&mut self, out: &mut Out) -> bool {
        while !self.held.is_empty() {
            let n = self.room(out).min(self.held.len());
            if n == 0 {
                out.starve(self.id, self.window, &mut self.starved);
                return false;
            }
            out.data(self.id, &self.held.split_to(n), false);
            self.window.take(n);
        }
        true
    }
}

impl Drive for LiveWatch {
    type Lane = Lane;

    fn lane(&self) -> Lane {
        Lane {
            steady: None,
            epoch: match &self.events {
                Feed::Watch(events) => Some(events.grant_epoch()),
                Feed::Etcd(_) => None,
            },
            id: self.id,
            window: self.window,
        }
    }

    fn ahead<'w>(lane: &Lane, watch: impl FnOnce() -> Option<&'w Self>) -> u64 {
        match lane.epoch {
            Some(_) => u64::from(lane.steady.is_some()),
            None => watch().map_or(0, |w| match &w.events {
                Feed::Etcd(session) => session.ahead(),
                Feed::Watch(_) => 0,
            }),
        }
    }

    fn settle(&mut self, lane: &mut Lane) {
        if let (Some(steady), Feed::Watch(events)) = (lane.steady.take(), &mut self.events) {
            events.took_steady(&steady);
            self.window = lane.window;
        }
    }

    /// Frames what is ready, up to [`BATCH_BYTES`] a frame, while the
    /// windows have room. A stream without room is not asked for events:
    /// its watcher's queue fills and it reads the shared window later. It
    /// is woken when the peer gives room: by a WINDOW_UPDATE for it, or,
    /// named in `out.starved`, by one for the connection.
    fn poll_drive(&mut self, lane: &mut Lane, cx: &mut Context<'_>, out: &mut Out) -> Poll<()> {
        self.settle(lane);
        let polled = self.drive(cx, out);
        if let (Poll::Pending, Feed::Watch(events)) = (polled, &self.events) {
            if self.held.is_empty() && self.ended.is_none() {
                lane.steady = events.steady();
                lane.window = self.window;
            }
        }
        polled
    }

    /// Frames a live change taken straight from the connection's inbox
    /// when nothing of this stream waits before it and the windows have
    /// room for it whole, in a DATA frame of its own: the change skips the
    /// watch's queue, the ready list and the polls between them, the most
    /// of a delivery's cost besides the copy. A steady `watchproxy.v1`
    /// watch takes it from its lane alone. False: it is queued.
    fn offer<'w>(
        lane: &mut Lane,
        watch: impl FnOnce() -> Option<&'w mut Self>,
        offer: &Offer<'_>,
        out: &mut Out,
    ) -> bool {
        if out.buf.len() >= WRITE_LIMIT {
            return false;
        }
        let Some(epoch) = &lane.epoch else {
            return watch().is_some_and(|w| w.offer_etcd(offer, out));
        };
        let Some(steady) = &mut lane.steady else {
            return false;
        };
        let view = offer.view;
        // A change read back from the window has no shared encoding.
        let Some(encoded) = &view.encoded else {
            return false;
        };
        let packed = (steady.codec).and_then(|c| WatchMessage::compressed_change(view, c));
        let len = PREFIX + packed.map_or_else(|| encoded.size(), |p| p.len());
        if len > room(lane.window, out) || !epoch.unchanged_since(steady.seen) {
            return false;
        }
        steady.at.delivered(view);
        out.clock.note(WatchApi::watchproxy, view.received);
        let n = match packed {
            Some(p) => put_data_message(out, lane.id, true, [p, &[]]),
            None => put_data_message(out, lane.id, false, [&encoded.head, &encoded.body]),
        };
        lane.window.take(n);
        true
    }

    /// Ends the watch with a status naming where to resume, once what it
    /// framed already is sent.
    fn end_aged(&mut self, lane: &mut Lane, out: &mut Out) -> Poll<()> {
        self.settle(lane);
        self.ended = Some(self.events.connection_aged());
        if !self.send_held(out) {
            return Poll::Pending;
        }
        let status = self.ended.take().expect("just set");
        write_trailers(out, self.id, &status);
        out.closed.push(self.id);
        Poll::Ready(())
    }
}

/// What a stream with `window` may send now.
fn room(window: SendWindow, out: &Out) -> usize {
    (window.room())
        .min(out.window.room())
        .min(out.max_frame as i64)
        .max(0) as usize
}

/// Ends a response with `status` in its trailers.
pub(super) fn write_trailers(out: &mut Out, id: u32, status: &Status) {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        trailers.insert("grpc-status", HeaderValue::from_static("13"));
    }
    let mut block = Vec::new();
    write_fields(None, &trailers, &mut block);
    out.headers(id, &block, true);
}

/// Answers a request with `status` alone (a response without a body).
pub(super) fn write_refusal(out: &mut Out, id: u32, status: Status) {
    let (head, _) = status.into_http::<()>().into_parts();
    let mut block = Vec::new();
    write_fields(Some(head.status), &head.headers, &mut block);
    out.headers(id, &block, true);
}
