//! A request's header block: a new stream, answered here (a Watch this
//! server serves itself) or by the routes (every other call), or the
//! trailers that end a request.

use bytes::BytesMut;
use futures::future::{AbortHandle, Abortable, BoxFuture};
use http::{Request, StatusCode};
use tokio::sync::{mpsc, oneshot};
use tonic::codec::Streaming;
use tonic::Status;
use tonic_prost::ProstDecoder;

use super::bridge::{self, Call};
use super::connection::Driver;
use super::feed::{start_watch, Feed};
use super::live_watch::{write_refusal, LiveWatch};
use super::protocol::frame::{Error, Reason};
use super::protocol::hpack::{read_request, read_trailers, Refused, RequestHead, MAX_HEADER_LIST};
use super::protocol::state::{Closed, Continuing, RecvSide};
use super::protocol::window::SendWindow;
use super::table::{Entry, Reading, State};
use super::Routes;
use crate::api::error::ApiError;
use crate::api::v1::WATCH_PATH;
use crate::etcd_api::{self, WATCH_PATH as ETCD_WATCH_PATH};
use crate::etcdpb::etcdserverpb::WatchRequest;

impl<S: Routes> Driver<S> {
    /// A whole header block: a new request, or a request's trailers.
    pub(super) fn on_block(&mut self, block: Continuing) -> Result<(), Error> {
        let Continuing {
            id,
            end_stream: end,
            self_dependent,
            block,
        } = block;
        if self.streams.contains_key(&id) {
            return self.on_trailers(id, end, self_dependent, &block);
        }
        let closed = self.h2.closed_state(id);
        if closed != Closed::Idle {
            // Read only to keep the table in step.
            taken(read_trailers(&mut self.h2.decoder, &block))?;
            // HEADERS on a closed stream is a connection error (RFC 9113
            // §5.1), unless the server reset it and this was in flight; on
            // one never opened, a stream number out of order (§5.1.1).
            return match closed {
                Closed::ResetHere => Ok(()),
                Closed::Ended => Err(Reason::STREAM_CLOSED.into()),
                Closed::Idle | Closed::Forgotten => Err(Reason::PROTOCOL_ERROR.into()),
            };
        }
        if id.is_multiple_of(2) {
            return Err(Reason::PROTOCOL_ERROR.into());
        }
        let request = read_request(&mut self.h2.decoder, &block);
        if request.as_ref().err() == Some(&Refused::Compression) {
            return Err(Reason::COMPRESSION_ERROR.into());
        }
        self.h2.last_stream = id;
        if self_dependent {
            return Err(Reason::PROTOCOL_ERROR.on(id));
        }
        if !self.h2.conn.accepts_streams() {
            self.reset_here(id, Reason::REFUSED_STREAM);
            return Ok(());
        }
        if self.streams.len() >= self.settings.max_concurrent_streams as usize {
            return Err(Reason::REFUSED_STREAM.on(id));
        }
        match request {
            Ok(head) => self.accept(id, head, end),
            Err(Refused::TooLarge) => {
                let refused = ApiError::HeadersTooLarge {
                    max: MAX_HEADER_LIST,
                };
                self.refuse_new(id, refused.into(), end);
                Ok(())
            }
            Err(_) => Err(Reason::PROTOCOL_ERROR.on(id)),
        }
    }

    /// The header block that ends a request: trailers, which must end the
    /// stream and hold no pseudo-fields.
    fn on_trailers(
        &mut self,
        id: u32,
        end: bool,
        self_dependent: bool,
        block: &[u8],
    ) -> Result<(), Error> {
        let taken = taken(read_trailers(&mut self.h2.decoder, block))?;
        let Some(entry) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        entry.recv.recv_trailers(end).map_err(|r| r.on(id))?;
        if self_dependent || !taken {
            return Err(Reason::PROTOCOL_ERROR.on(id));
        }
        let reading = match &mut entry.state {
            State::Call(call) => {
                call.request_ended(id, &mut self.out);
                false
            }
            State::Reading(..) => true,
            State::Session { requests, .. } => {
                *requests = None;
                false
            }
            State::Starting(_) | State::Watch(_) => false,
        };
        if reading {
            self.begin_watch(id);
        }
        Ok(())
    }

    /// A new request: a Watch this connection serves itself, or a call
    /// for the routes.
    fn accept(&mut self, id: u32, head: RequestHead, end: bool) -> Result<(), Error> {
        let recv = RecvSide::open(head.content_length, end).map_err(|r| r.on(id))?;
        let send = SendWindow::new(self.h2.peer_window);
        let mut extensions = http::Extensions::new();
        if let Some(peer) = &self.peer {
            extensions.insert(peer.clone());
        }
        let state = if !is_grpc(&head) {
            // gRPC's answer to another client (PROTOCOL-HTTP2.md): 415,
            // with a body that says what this port serves.
            State::Call(Call::answered(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                NOT_GRPC,
                send,
            ))
        } else if is_plain_watch(&head) {
            // Identified from its headers: one who is not is answered
            // before a byte of its body is read.
            match self.api.identify(&head.headers, &extensions) {
                Ok(caller) => {
                    tracing::Span::current()
                        .record("identity", caller.identity.caller.user.as_str());
                    extensions.insert(caller)
                }
                Err(refused) => {
                    self.refuse_new(id, refused.into(), end);
                    return Ok(());
                }
            };
            State::Reading(self.read_watch(id, head, extensions))
        } else if self.etcd.is_some() && is_plain(&head, ETCD_WATCH_PATH) {
            match self.etcd_session(id, head, extensions, send, end) {
                Ok(state) => state,
                Err(refused) => {
                    self.refuse_new(id, refused, end);
                    return Ok(());
                }
            }
        } else {
            let Some(call) = self.call(id, head, extensions) else {
                return Err(Reason::PROTOCOL_ERROR.on(id));
            };
            State::Call(call)
        };
        let reading = matches!(state, State::Reading(..));
        let entry = Entry { state, recv, send };
        self.streams.insert(id, entry);
        if reading && end {
            self.begin_watch(id);
        }
        if let Some(Entry {
            state: State::Call(call),
            ..
        }) = self.streams.get_mut(&id)
        {
            match end {
                true => call.request_ended(id, &mut self.out),
                false => call.flush(id, &mut self.out),
            }
        }
        Ok(())
    }

    /// Starts answering a call with the routes; `None` when its path is
    /// not a URI.
    fn call(&mut self, id: u32, head: RequestHead, extensions: http::Extensions) -> Option<Call> {
        let uri = head.path.parse::<http::Uri>().ok()?;
        let mut request = Request::new(());
        *request.method_mut() = head.method;
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_2;
        *request.headers_mut() = head.headers;
        *request.extensions_mut() = extensions;
        let call = bridge::spawn(
            &mut self.calls,
            self.routes.clone(),
            id,
            request,
            &self.links,
            SendWindow::new(self.h2.peer_window),
        );
        Some(call)
    }

    /// A Watch whose request is to come: its start waits for the body,
    /// within `limits.request_body_timeout`, then asks the API.
    fn read_watch(&mut self, id: u32, head: RequestHead, extensions: http::Extensions) -> Reading {
        let (whole, body) = oneshot::channel();
        let (abort, registration) = AbortHandle::new_pair();
        let (api, inbox) = (self.api.clone(), self.watches.inbox.clone());
        let (max, timeout) = (
            self.settings.max_request_bytes,
            self.settings.request_body_timeout,
        );
        let started = async move {
            let body = match tokio::time::timeout(timeout, body).await {
                Ok(Ok(body)) => body,
                // The stream ended first: the start is aborted with it.
                Ok(Err(_)) => {
                    let reset = ApiError::RequestAborted("the request was reset".into());
                    return (id, Err(reset.into()));
                }
                Err(_) => return (id, Err(ApiError::RequestTooSlow { after: timeout }.into())),
            };
            (
                id,
                start_watch(api, inbox, head, extensions, body, max).await,
            )
        };
        let started: BoxFuture<'static, _> = Box::pin(started);
        self.starts.push(Abortable::new(started, registration));
        Reading {
            body: BytesMut::new(),
            whole,
            abort,
        }
    }

    /// An etcd Watch stream, identified from its headers and served by
    /// this connection from now on: its requests go to it as they arrive,
    /// given back to the client's windows as it reads them.
    fn etcd_session(
        &mut self,
        id: u32,
        head: RequestHead,
        mut extensions: http::Extensions,
        window: SendWindow,
        end: bool,
    ) -> Result<State, Status> {
        let mut headers = head.headers;
        etcd_api::bearer_from_token(&mut headers);
        // Bounded by the receive windows: the client's bytes are given
        // credit again only as the stream reads them.
        let (tx, rx) = mpsc::unbounded_channel();
        let body = bridge::RequestBody::new(id, rx, &self.links);
        let requests = Streaming::new_request(
            ProstDecoder::<WatchRequest>::default(),
            tonic::body::Body::new(body),
            None,
            Some(self.settings.max_request_bytes),
        );
        extensions.insert(self.watches.inbox.clone());
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        let request = tonic::Request::from_parts(metadata, extensions, requests);
        let Some(etcd) = self.etcd.as_ref() else {
            let path = ETCD_WATCH_PATH.to_owned();
            return Err(ApiError::UnknownMethod { path }.into());
        };
        let session = etcd.etcd_session(request, self.settings.max_message_bytes)?;
        let place = session.place().expect("given the connection's inbox");
        let watch = LiveWatch::start(id, Feed::Etcd(Box::new(session)), window, &mut self.out);
        self.watches.insert(place, watch);
        Ok(State::Session {
            place,
            requests: (!end).then_some(tx),
        })
    }

    /// The request of a Watch arrived whole: its start goes on, and the
    /// credit its bytes held returns to the connection.
    pub(super) fn begin_watch(&mut self, id: u32) {
        let Some(entry) = self.streams.get_mut(&id) else {
            return;
        };
        let State::Reading(reading) = &entry.state else {
            return;
        };
        let abort = reading.abort.clone();
        let State::Reading(reading) = std::mem::replace(&mut entry.state, State::Starting(abort))
        else {
            unreachable!("matched above");
        };
        let held = reading.body.len() as u32;
        let _ = reading.whole.send(reading.body);
        self.release_connection_window(held);
    }

    /// Answers a stream that is not kept with `status` alone; a request
    /// still to come is not wanted.
    fn refuse_new(&mut self, id: u32, status: Status, end: bool) {
        write_refusal(&mut self.out, id, status);
        if !end {
            self.reset_here(id, Reason::NO_ERROR);
        }
    }

    /// Answers stream `id` with `status` alone.
    pub(super) fn refuse(&mut self, id: u32, status: Status) {
        write_refusal(&mut self.out, id, status);
        self.out.closed.push(id);
    }
}

/// What a request that is not gRPC is told.
const NOT_GRPC: &str = "watchproxy serves gRPC (content-type: application/grpc) on this port\n";

/// A gRPC request: its content type says so.
fn is_grpc(head: &RequestHead) -> bool {
    head.headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Whether a block was taken; the table stays in step when it is refused,
/// and only a block that cannot be decoded loses it (a connection error).
fn taken(read: Result<(), Refused>) -> Result<bool, Error> {
    match read {
        Ok(()) => Ok(true),
        Err(Refused::Compression) => Err(Reason::COMPRESSION_ERROR.into()),
        Err(_) => Ok(false),
    }
}

/// A Watch call this connection can serve itself: gRPC with an
/// uncompressed request. Anything else goes to the routes, which answer it
/// in full.
fn is_plain_watch(head: &RequestHead) -> bool {
    is_plain(head, WATCH_PATH)
}

/// A gRPC call of `path` whose messages are not compressed.
fn is_plain(head: &RequestHead, path: &str) -> bool {
    let grpc = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    let uncompressed = head
        .headers
        .get("grpc-encoding")
        .is_none_or(|v| v == "identity");
    head.method == http::Method::POST && head.path == path && grpc && uncompressed
}
