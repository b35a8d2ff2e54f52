//! What a live HTTP/2 stream sends, and how it is asked for: a
//! `watchproxy.v1` watch started from its request, or an etcd Watch
//! stream's responses, each framed as gRPC messages.

use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use futures::StreamExt;
use prost::Message;
use tonic::Status;

use super::grpc_framing::{grpc_timeout, put_compressed, put_message, request_message};
use super::protocol::hpack::RequestHead;
use crate::api::compression::Codec;
use crate::api::error::{etcd_status, ApiError};
use crate::api::{Api, WatchStream};
use crate::dispatch::Inbox;
use crate::etcd_api::EtcdStream;
use crate::pb;
use crate::telemetry::{WatchApi, WriteClock};

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
    pub(super) fn codec(&self) -> Option<Codec> {
        match self {
            Feed::Watch(events) => events.codec(),
            Feed::Etcd(_) => None,
        }
    }

    /// Frames its next message into `dst`.
    pub(super) fn poll_put(
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
    pub(super) fn emptied(&self) -> bool {
        match self {
            Feed::Watch(events) => events.emptied(),
            Feed::Etcd(_) => false,
        }
    }

    /// A pass of its connection's task begins: what it found waiting in
    /// the last one is worth asking again.
    pub(super) fn begin_pass(&mut self) {
        if let Feed::Etcd(session) = self {
            session.begin_pass();
        }
    }

    /// The status that ends it when its connection reached its maximum
    /// age.
    pub(super) fn connection_aged(&mut self) -> Status {
        match self {
            Feed::Watch(events) => events.connection_aged(),
            Feed::Etcd(_) => etcd_status(ApiError::ConnectionAged { last: None }),
        }
    }
}
