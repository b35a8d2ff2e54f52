//! A watch sending its events on its HTTP/2 stream: started from the
//! request, then driven by its connection's task, which frames its ready
//! events straight into the connection's outgoing buffer.

use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use prost::Message;
use tonic::Status;

use super::grpc_framing::{
    grpc_timeout, put_compressed, put_data_message, put_data_with, put_message, request_message,
    PREFIX,
};
use super::protocol::hpack::{write_fields, RequestHead};
use super::protocol::out::Out;
use super::protocol::socket::WRITE_LIMIT;
use super::protocol::window::SendWindow;
use super::watches::Drive;
use crate::access::GrantEpoch;
use crate::api::compression::Codec;
use crate::api::error::{etcd_status, ApiError};
use crate::api::wire::WatchMessage;
use crate::api::{Api, Steady, WatchStream};
use crate::dispatch::{Inbox, Offer};
use crate::etcd_api::EtcdStream;
use crate::pb;
use crate::telemetry::{WatchApi, WriteClock};

/// Events ready together for one stream go out as one DATA frame of up to
/// this size.
const BATCH_BYTES: usize = 8 * 1024;

/// What one poll of a watch frames at most; a watch with more ready (an
/// initial state, a replay) is polled again in the next pass, after the
/// connection has written this one's frames. Without it a joining watch
/// framed as much as its client's window allowed, megabytes, in one pass.
const POLL_BYTES: usize = 2 * BATCH_BYTES;

/// Asks the API for the watch a request's `body` names, its deliveries in
/// the connection's `inbox`.
pub(super) async fn start_watch(
    api: Api,
    inbox: Arc<Inbox>,
    head: RequestHead,
    extensions: http::Extensions,
    mut body: BytesMut,
    max_request_bytes: usize,
) -> Result<WatchStream, Status> {
    let deadline = head.headers.get("grpc-timeout").and_then(grpc_timeout);
    let codec = Codec::negotiate(head.headers.get("grpc-accept-encoding"), api.watch_codecs());
    let started = async {
        let message = request_message(&mut body, max_request_bytes).map_err(Status::from)?;
        let request = pb::WatchRequest::decode(message).map_err(|e| {
            Status::from(ApiError::MalformedRequest(format!(
                "failed to decode the request: {e}"
            )))
        })?;
        let metadata = tonic::metadata::MetadataMap::from_headers(head.headers);
        let mut extensions = extensions;
        extensions.insert(inbox);
        let request = tonic::Request::from_parts(metadata, extensions, request);
        api.watch(request).await.map(tonic::Response::into_inner)
    };
    let mut events = match deadline {
        Some(d) => tokio::time::timeout(d, started)
            .await
            .unwrap_or_else(|_| Err(ApiError::DeadlineExceeded.into()))?,
        None => started.await?,
    };
    if let Some(codec) = codec {
        events.compress_with(codec);
    }
    Ok(events)
}

/// What a live stream sends: a `watchproxy.v1` watch's events, or the
/// responses of an etcd Watch stream (its several watches' changes).
#[allow(
    clippy::large_enum_variant,
    reason = "the watchproxy.v1 watch, polled once per delivery, stays inline"
)]
pub(super) enum Feed {
    Watch(WatchStream),
    Etcd(Box<EtcdStream>),
}

impl Feed {
    fn codec(&self) -> Option<Codec> {
        match self {
            Feed::Watch(events) => events.codec(),
            Feed::Etcd(_) => None,
        }
    }

    /// Frames its next message into `dst`.
    fn poll_put(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut BytesMut,
        clock: &mut WriteClock,
    ) -> Poll<Option<Result<(), Status>>> {
        match self {
            Feed::Watch(events) => match ready!(events.poll_next_unpin(cx)) {
                Some(Ok(message)) => {
                    clock.note(WatchApi::watchproxy, message.received());
                    match events.codec().and_then(|c| message.compressed(c)) {
                        Some(packed) => put_compressed(dst, &packed),
                        None => put_message(dst, message.len_hint(), |b| message.write_to(b)),
                    }
                    Poll::Ready(Some(Ok(())))
                }
                Some(Err(status)) => Poll::Ready(Some(Err(status))),
                None => Poll::Ready(None),
            },
            Feed::Etcd(session) => match ready!(session.poll_in_pass(cx)) {
                Some(Ok(response)) => {
                    clock.note(WatchApi::etcd, response.received());
                    put_message(dst, response.len_hint(), |b| response.encode_raw(b));
                    Poll::Ready(Some(Ok(())))
                }
                Some(Err(status)) => Poll::Ready(Some(Err(status))),
                None => Poll::Ready(None),
            },
        }
    }

    /// Whether what it framed last was all it has in this pass of its
    /// connection's task (asked again, it would only be found waiting).
    fn emptied(&self) -> bool {
        match self {
            Feed::Watch(events) => events.emptied(),
            Feed::Etcd(_) => false,
        }
    }

    /// A pass of its connection's task begins: what it found waiting in
    /// the last one is worth asking again.
    fn begin_pass(&mut self) {
        if let Feed::Etcd(session) = self {
            session.begin_pass();
        }
    }

    /// The status that ends it when its connection reached its maximum
    /// age.
    fn connection_aged(&mut self) -> Status {
        match self {
            Feed::Watch(events) => events.connection_aged(),
            Feed::Etcd(_) => etcd_status(ApiError::ConnectionAged { last: None }),
        }
    }
}

/// A watch sending its events on its HTTP/2 stream. What a direct
/// delivery reads of it comes first, on one cache line (`repr(C)`): the
/// connection's task offers it a change with the other watches' state,
/// and the dispatcher's, in between.
#[repr(C, align(64))]
pub(super) struct LiveWatch {
    /// Set when a poll leaves the stream with nothing sent, held or due
    /// before its next live change (a `watchproxy.v1` watch's
    /// [`WatchStream::steady`]): until it is polled again, such a change
    /// is framed without reading the watch.
    steady: Option<Steady>,
    /// What `steady` is judged against (a `watchproxy.v1` watch's).
    epoch: Option<GrantEpoch>,
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
        let epoch = match &events {
            Feed::Watch(events) => Some(events.grant_epoch()),
            Feed::Etcd(_) => None,
        };
        Self {
            steady: None,
            epoch,
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
        (self.window.room())
            .min(out.window.room())
            .min(out.max_frame as i64)
            .max(0) as usize
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
    /// Frames what is ready, up to [`BATCH_BYTES`] a frame, while the
    /// windows have room. A stream without room is not asked for events:
    /// its watcher's queue fills and it reads the shared window later. It
    /// is woken when the peer gives room: by a WINDOW_UPDATE for it, or,
    /// named in `out.starved`, by one for the connection.
    fn poll_drive(&mut self, cx: &mut Context<'_>, out: &mut Out) -> Poll<()> {
        self.steady = None;
        let polled = self.drive(cx, out);
        if let (Poll::Pending, Feed::Watch(events)) = (polled, &self.events) {
            if self.held.is_empty() && self.ended.is_none() {
                self.steady = events.steady();
            }
        }
        polled
    }

    /// Frames a live change taken straight from the connection's inbox
    /// when nothing of this stream waits before it and the windows have
    /// room for it whole, in a DATA frame of its own: the change skips the
    /// watch's queue, the ready list and the polls between them, the most
    /// of a delivery's cost besides the copy. False: it is queued.
    fn offer(&mut self, offer: &Offer<'_>, out: &mut Out) -> bool {
        if out.buf.len() >= WRITE_LIMIT {
            return false;
        }
        let view = offer.view;
        let room = self.room(out);
        if let (Some(steady), Some(epoch)) = (self.steady, &self.epoch) {
            // A change read back from the window has no shared encoding.
            let Some(encoded) = &view.encoded else {
                return false;
            };
            let packed = (steady.codec).and_then(|c| WatchMessage::compressed_change(view, c));
            let len = PREFIX + packed.map_or_else(|| encoded.size(), |p| p.len());
            let Feed::Watch(events) = &mut self.events else {
                return false;
            };
            if len > room || !epoch.unchanged_since(steady.seen) {
                return false;
            }
            events.take_steady(view);
            out.clock.note(WatchApi::watchproxy, view.received);
            let n = match packed {
                Some(p) => put_data_message(out, self.id, true, [p, &[]]),
                None => put_data_message(out, self.id, false, [&encoded.head, &encoded.body]),
            };
            self.window.take(n);
            return true;
        }
        if !self.held.is_empty() || self.ended.is_some() {
            return false;
        }
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

    /// Ends the watch with a status naming where to resume, once what it
    /// framed already is sent.
    fn end_aged(&mut self, out: &mut Out) -> Poll<()> {
        self.steady = None;
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
