//! A watch sending its events on its HTTP/2 stream: started from the
//! request, then driven by its connection's task, its ready events cut
//! into DATA frames from a per-thread buffer.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use prost::Message;
use tonic::Status;

use super::framing::{grpc_timeout, put_compressed, put_message, read_message};
use super::watches::Drive;
use crate::api::compression::Codec;
use crate::api::error::ApiError;
use crate::api::{Api, WatchStream};
use crate::dispatch::{Inbox, Place};
use crate::pb;

/// Events ready together for one stream go out as one DATA frame of up to
/// this size.
const BATCH_BYTES: usize = 8 * 1024;

/// The frames of one pass are cut from allocations of this size (one per
/// frame was a tenth of the time spent per delivery). A frame HTTP/2 holds
/// for a client that stopped reading keeps its whole allocation: this
/// bounds what such a stream pins.
const PASS_BYTES: usize = 16 * 1024;

/// Reads the request and asks the API for the watch, with its deliveries
/// in the connection's `inbox`; answers a refusal itself. `None` when
/// there is nothing to stream.
pub(super) async fn start_watch(
    api: Api,
    inbox: Arc<Inbox>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    max_message_bytes: usize,
) -> Option<LiveWatch> {
    let (parts, mut body) = request.into_parts();
    let deadline = parts.headers.get("grpc-timeout").and_then(grpc_timeout);
    let codec = Codec::negotiate(
        parts.headers.get("grpc-accept-encoding"),
        api.watch_codecs(),
    );
    let started = async {
        let message = read_message(&mut body, max_message_bytes)
            .await
            .map_err(Status::from)?;
        let request = pb::WatchRequest::decode(message).map_err(|e| {
            Status::from(ApiError::MalformedRequest(format!(
                "failed to decode the request: {e}"
            )))
        })?;
        let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
        let mut extensions = parts.extensions;
        extensions.insert(inbox);
        let request = tonic::Request::from_parts(metadata, extensions, request);
        api.watch(request).await.map(tonic::Response::into_inner)
    };
    let started = async {
        match deadline {
            Some(d) => tokio::time::timeout(d, started)
                .await
                .unwrap_or_else(|_| Err(ApiError::DeadlineExceeded.into())),
            None => started.await,
        }
    };
    // A client that cancels while the watch waits (for the cache, say)
    // is not waited for.
    let started = {
        let reset = poll_fn(|cx| respond.poll_reset(cx));
        tokio::select! {
            started = started => started,
            _ = reset => return None,
        }
    };
    match started {
        Ok(mut events) => {
            let mut head =
                Response::builder().header(http::header::CONTENT_TYPE, "application/grpc");
            if let Some(codec) = codec {
                head = head.header("grpc-encoding", codec.name());
                events.compress_with(codec);
            }
            let head = head.body(()).expect("a valid response head");
            let tx = respond.send_response(head, false).ok()?;
            Some(LiveWatch {
                events,
                tx,
                awaiting_room: false,
            })
        }
        Err(status) => {
            let (head, _) = status.into_http::<()>().into_parts();
            let _ = respond.send_response(Response::from_parts(head, ()), true);
            None
        }
    }
}

/// A watch sending its events on its HTTP/2 stream.
pub(super) struct LiveWatch {
    events: WatchStream,
    tx: SendStream<Bytes>,
    /// h2 holds the watch's waker until the stream has room, and wakes it
    /// on a reset too.
    awaiting_room: bool,
}

impl LiveWatch {
    /// Where its deliveries wait in the connection's inbox.
    pub(super) fn place(&self) -> Place {
        self.events.place()
    }
}

impl Drive for LiveWatch {
    /// Sends what is ready, in frames of up to [`BATCH_BYTES`], while the
    /// stream has room. A stream without room is not asked for events: its
    /// watcher's queue fills and it reads the shared window later.
    ///
    /// h2 holds no waker for the stream while it has room: one that h2
    /// held would be woken whenever room is asked for, as it is below for
    /// each delivery, and replacing it on each poll moved the waker's count
    /// between cores. A reset is seen here when it fails a send, or by
    /// [`Watches::end_reset`].
    fn poll_drive(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<()> {
        loop {
            let room = poll_room(&mut self.tx, cx);
            self.awaiting_room = room.is_pending();
            if !std::task::ready!(room) {
                return Poll::Ready(());
            }
            if buf.capacity() < BATCH_BYTES {
                // The allocation the frames were cut from, when they are
                // all gone; a new one otherwise.
                buf.reserve(PASS_BYTES);
            }
            let ended = loop {
                match self.events.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(message))) => {
                        match self.events.codec().and_then(|c| message.compressed(c)) {
                            Some(packed) => put_compressed(buf, &packed),
                            None => put_message(buf, message.len_hint(), |b| message.write_to(b)),
                        }
                        if buf.len() >= BATCH_BYTES {
                            break None;
                        }
                    }
                    Poll::Ready(Some(Err(status))) => break Some(status),
                    Poll::Ready(None) => break Some(Status::ok("")),
                    Poll::Pending => {
                        if !buf.is_empty() && !send_frame(&mut self.tx, buf) {
                            return Poll::Ready(());
                        }
                        return Poll::Pending;
                    }
                }
            };
            if !buf.is_empty() && !send_frame(&mut self.tx, buf) {
                return Poll::Ready(());
            }
            if let Some(status) = ended {
                send_status(&mut self.tx, status);
                return Poll::Ready(());
            }
        }
    }

    /// Sends the trailers that end the watch, naming where to resume. What
    /// its stream yielded was sent already: frames go out as they are cut.
    fn end_aged(&mut self) {
        let status = self.events.connection_aged();
        send_status(&mut self.tx, status);
    }

    /// Asked with a waker that does nothing: the watch's own, left with
    /// h2, would be woken by the next request for room, an extra poll of
    /// every watch at every sweep. It must not replace the watch's waker
    /// while the watch waits for room, which would then never wake it.
    fn is_reset(&mut self) -> bool {
        !self.awaiting_room
            && self
                .tx
                .poll_reset(&mut Context::from_waker(Waker::noop()))
                .is_ready()
    }
}

/// Ends the response with `status` in its trailers.
fn send_status(tx: &mut SendStream<Bytes>, status: Status) {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        trailers.insert("grpc-status", HeaderValue::from_static("13"));
    }
    let _ = tx.send_trailers(trailers);
}

/// Waits until the stream has room for more of the response: `false` when
/// the client reset it or the connection is gone. Room left by the last
/// frame (see [`send_frame`]) is found without asking h2 for any.
pub(super) fn poll_room(tx: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<bool> {
    if tx.capacity() > 0 {
        return Poll::Ready(true);
    }
    loop {
        tx.reserve_capacity(1);
        if tx.capacity() > 0 {
            return Poll::Ready(true);
        }
        match std::task::ready!(tx.poll_capacity(cx)) {
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Poll::Ready(false),
        }
    }
}

/// Sends what `buf` holds as one DATA frame: `false` when the stream is
/// gone. Room for the frame and one byte more is asked for first, so that
/// h2 assigns it once rather than again inside `send_data`, and the byte
/// left once the frame is written is the room [`poll_room`] finds next.
fn send_frame(tx: &mut SendStream<Bytes>, buf: &mut BytesMut) -> bool {
    tx.reserve_capacity(buf.len() + 1);
    tx.send_data(buf.split().freeze(), false).is_ok()
}
