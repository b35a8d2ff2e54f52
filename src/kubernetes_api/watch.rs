//! WATCH: the core's watch, its events written as the apiserver writes
//! them, one JSON line each (`{"type":…,"object":…}`). A change's line is
//! made once, by the first watch that sends it, for all of them. A
//! version too old to resume from is an `ERROR` event carrying a 410
//! Status, as informers expect, as is any end the server decides.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures::Stream;
use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;

use super::json::{self, EventType};
use super::respond::{self, Body, Shape};
use super::{KubernetesApi, Request};
use crate::api::error::{kubernetes_status, ApiError, Subject};
use crate::api::{CallInfo, Mark, Shown, WatchStream};
use crate::dispatch::{Encoded, Inbox, View};
use crate::object;
use crate::pb;
use crate::telemetry::{DeliveryLatency, ServePathLabel, WatchApi};

/// Bytes of lines gathered into one write when several are ready.
const WRITE_BYTES: usize = 32 * 1024;

impl KubernetesApi {
    pub(super) async fn watch(&self, request: Request<'_>) -> Response<Body> {
        let o = &request.options;
        let req = pb::WatchRequest {
            resource: request.entry.resource.clone(),
            namespace: request.namespace(),
            name: request.target.name.unwrap_or_default().to_owned(),
            label_selector: o.label_selector.clone(),
            field_selector: o.field_selector.clone(),
            resource_version: o.resource_version.clone(),
            allow_bookmarks: o.allow_watch_bookmarks,
            send_initial_events: o.send_initial_events == Some(true),
            timeout_seconds: o.timeout_seconds.unwrap_or_default().max(0),
            metadata_only: request.shape == Shape::Metadata,
            ..Default::default()
        };
        let info = CallInfo {
            method: "kubernetes.Watch",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        let call = self.core.watch_for(&request.meta, &req, Inbox::solo());
        let started = (self.core)
            .answer_with(&request.meta.metadata, info, call, |e| e)
            .await;
        let (api_version, kind) = request.type_meta();
        let framing = Framing {
            api_version: api_version.into(),
            kind: kind.into(),
            group: request.entry.kind.group.clone(),
            plural: request.entry.kind.plural.clone(),
            latency: (self.core.metrics()).delivery_latency(ServePathLabel::hyper),
        };
        let lines = match started {
            Ok(stream) => Lines {
                stream: Some(stream),
                framing,
                end: None,
            },
            // The apiserver starts a watch from a version it no longer
            // holds, then sends the error as its one event.
            Err(e @ (ApiError::TooOld { .. } | ApiError::FellBehind { .. })) => Lines {
                stream: None,
                end: Some(framing.error(e)),
                framing,
            },
            Err(e) => return respond::status(&Self::failed(&request, "watch", e)),
        };
        let mut response = Response::new(StreamBody::new(lines).boxed_unsync());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(respond::JSON),
        );
        response
    }
}

/// What a watch's lines say of the resource.
struct Framing {
    api_version: Arc<str>,
    kind: Arc<str>,
    group: String,
    plural: String,
    latency: DeliveryLatency,
}

impl Framing {
    /// The line of an end: an `ERROR` event with its Status.
    fn error(&self, e: ApiError) -> Vec<u8> {
        let subject = Subject {
            group: &self.group,
            plural: &self.plural,
            name: None,
            verb: "watch",
        };
        let status = kubernetes_status(e, &subject);
        let mut line = Vec::new();
        json::watch_line(EventType::Error, &status.to_json(), &mut line);
        line
    }

    /// A change's line, made once for every watch that sends it.
    fn change(&self, view: &View) -> Option<Bytes> {
        let line = view.kubernetes_line.get_or_init(|| {
            let kind = match view.kind {
                object::EventType::Added => EventType::Added,
                object::EventType::Modified => EventType::Modified,
                object::EventType::Deleted => EventType::Deleted,
            };
            let value = view.object.value();
            let shown = json::object(value, view.revision, &self.api_version, &self.kind);
            let Some(shown) = shown else {
                tracing::warn!(key = %view.object.key(), "a stored value is not a JSON object: its change is not shown on Kubernetes' API");
                return None;
            };
            let mut line = Vec::with_capacity(shown.len() + 32);
            json::watch_line(kind, &shown, &mut line);
            Some(line.into())
        });
        line.clone()
    }

    /// An initial object's line, from the message the core shares.
    fn initial(&self, encoded: &Encoded) -> Option<Vec<u8>> {
        let event = pb::WatchEvent::decode((&encoded.head[..]).chain(&encoded.body[..])).ok()?;
        let object = event.object?;
        let revision = object.resource_version.parse().ok()?;
        let shown = json::object(&object.value, revision, &self.api_version, &self.kind)?;
        let mut line = Vec::with_capacity(shown.len() + 32);
        json::watch_line(EventType::Added, &shown, &mut line);
        Some(line)
    }

    fn bookmark(&self, revision: object::Revision, mark: Mark) -> Vec<u8> {
        let end = mark == Mark::InitialEnd;
        let object = json::bookmark(&self.api_version, &self.kind, revision, end);
        let mut line = Vec::new();
        json::watch_line(EventType::Bookmark, &object, &mut line);
        line
    }
}

/// A watch's response body: its lines, those ready together in one write.
struct Lines {
    /// None once it ended.
    stream: Option<WatchStream>,
    framing: Framing,
    /// The last line, still to write.
    end: Option<Vec<u8>>,
}

impl Stream for Lines {
    type Item = Result<Frame<Bytes>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut out: Vec<u8> = Vec::new();
        let mut single: Option<Bytes> = None;
        while let Some(stream) = &mut this.stream {
            if out.len() >= WRITE_BYTES {
                break;
            }
            let line = match stream.poll_shown(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    this.stream = None;
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    this.stream = None;
                    this.end = Some(this.framing.error(e));
                    break;
                }
                Poll::Ready(Some(Ok(Shown::Change(view)))) => {
                    if let Some(received) = view.received {
                        this.framing.latency.observe(WatchApi::kubernetes, received);
                    }
                    match this.framing.change(&view) {
                        Some(line) => line,
                        None => continue,
                    }
                }
                Poll::Ready(Some(Ok(Shown::Initial(packed)))) => {
                    match this.framing.initial(&packed.encoded) {
                        Some(line) => line.into(),
                        None => continue,
                    }
                }
                Poll::Ready(Some(Ok(Shown::Bookmark(revision, mark)))) => {
                    this.framing.bookmark(revision, mark).into()
                }
            };
            // A lone line goes out as the shared bytes it is.
            match single.take() {
                None if out.is_empty() => single = Some(line),
                first => {
                    if let Some(first) = first {
                        out.extend_from_slice(&first);
                    }
                    out.extend_from_slice(&line);
                }
            }
        }
        if this.stream.is_none() {
            if let Some(end) = this.end.take() {
                if let Some(first) = single.take() {
                    out.extend_from_slice(&first);
                }
                out.extend_from_slice(&end);
            }
        }
        if let Some(line) = single {
            return Poll::Ready(Some(Ok(Frame::data(line))));
        }
        match (out.is_empty(), this.stream.is_some()) {
            (false, _) => Poll::Ready(Some(Ok(Frame::data(out.into())))),
            (true, true) => Poll::Pending,
            (true, false) => Poll::Ready(None),
        }
    }
}
