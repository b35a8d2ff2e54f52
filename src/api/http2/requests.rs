//! A request's header block: a new stream, answered here (a Watch this
//! server serves itself) or by the routes (every other call), or the
//! trailers that end a request.

use bytes::BytesMut;
use futures::future::{AbortHandle, Abortable, BoxFuture};
use http::Request;
use tonic::Status;

use super::bridge::{self, Call};
use super::connection::{Driver, Fail};
use super::frame::Reason;
use super::hpack::{read_request, Refused, RequestHead, MAX_HEADER_LIST};
use super::stream::{start_watch, write_refusal};
use super::streams::{Entry, RecvWindow, State};
use super::Routes;
use crate::api::service::WATCH_PATH;

impl<S: Routes> Driver<S> {
    /// A whole header block: a new request, or a request's trailers.
    pub(super) fn on_block(&mut self, id: u32, end: bool, block: &[u8]) -> Result<(), Fail> {
        if let Some(entry) = self.streams.get_mut(&id) {
            self.decoder
                .decode_with_cb(block, |_, _| {})
                .map_err(|_| Fail::Protocol(Reason::COMPRESSION_ERROR))?;
            if !end || !entry.remote_open {
                self.out.reset(id, Reason::PROTOCOL_ERROR);
                self.drop_stream(id);
                return Ok(());
            }
            entry.remote_open = false;
            let reading = match &mut entry.state {
                State::Call(call) => {
                    call.body = None;
                    false
                }
                State::Reading(..) => true,
                State::Starting(_) | State::Watch(_) => false,
            };
            if reading {
                self.begin_watch(id);
            }
            return Ok(());
        }
        let reused = id <= self.last_stream || id.is_multiple_of(2);
        let request = read_request(&mut self.decoder, block);
        if reused || request.as_ref().err() == Some(&Refused::Compression) {
            return Err(Fail::Protocol(if reused {
                Reason::PROTOCOL_ERROR
            } else {
                Reason::COMPRESSION_ERROR
            }));
        }
        self.last_stream = id;
        if self.stopping
            || self.peer_gone
            || self.streams.len() >= self.settings.max_concurrent_streams as usize
        {
            self.out.reset(id, Reason::REFUSED_STREAM);
            return Ok(());
        }
        match request {
            Ok(head) => self.accept(id, head, end),
            Err(Refused::TooLarge) => {
                let status = Status::resource_exhausted(format!(
                    "the request's headers are larger than {MAX_HEADER_LIST} bytes"
                ));
                write_refusal(&mut self.out, id, status);
                if !end {
                    self.out.reset(id, Reason::NO_ERROR);
                }
            }
            Err(_) => self.out.reset(id, Reason::PROTOCOL_ERROR),
        }
        Ok(())
    }

    /// A new request: a Watch this connection serves itself, or a call
    /// for the routes.
    fn accept(&mut self, id: u32, head: RequestHead, end: bool) {
        let mut extensions = http::Extensions::new();
        if let Some(peer) = &self.peer {
            extensions.insert(peer.clone());
        }
        let state = if is_plain_watch(&head) {
            State::Reading(Box::new((head, extensions)), BytesMut::new())
        } else {
            let Some(call) = self.call(id, head, extensions, end) else {
                self.out.reset(id, Reason::PROTOCOL_ERROR);
                return;
            };
            State::Call(call)
        };
        let reading = matches!(state, State::Reading(..));
        let entry = Entry {
            state,
            remote_open: !end,
            recv: RecvWindow::default(),
            send: self.peer_window,
        };
        self.streams.insert(id, entry);
        if reading && end {
            self.begin_watch(id);
        }
    }

    /// Starts answering a call with the routes; `None` when its path is
    /// not a URI.
    fn call(
        &mut self,
        id: u32,
        head: RequestHead,
        extensions: http::Extensions,
        end: bool,
    ) -> Option<Call> {
        let uri = head.path.parse::<http::Uri>().ok()?;
        let mut request = Request::new(());
        *request.method_mut() = head.method;
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_2;
        *request.headers_mut() = head.headers;
        *request.extensions_mut() = extensions;
        let mut call = bridge::spawn(
            &mut self.calls,
            self.routes.clone(),
            id,
            request,
            &self.links,
            self.peer_window,
        );
        if end {
            call.body = None;
        }
        Some(call)
    }

    /// The request of a Watch arrived whole: its start begins.
    pub(super) fn begin_watch(&mut self, id: u32) {
        let Some(entry) = self.streams.get_mut(&id) else {
            return;
        };
        if !matches!(entry.state, State::Reading(..)) {
            return;
        }
        let (abort, registration) = AbortHandle::new_pair();
        let State::Reading(request, body) =
            std::mem::replace(&mut entry.state, State::Starting(abort))
        else {
            unreachable!("matched above");
        };
        let (head, extensions) = *request;
        let started = start_watch(
            self.api.clone(),
            self.watches.inbox.clone(),
            head,
            extensions,
            body,
            self.settings.max_message_bytes,
        );
        let started: BoxFuture<'static, _> = Box::pin(async move { (id, started.await) });
        self.starts.push(Abortable::new(started, registration));
    }

    /// Answers stream `id` with `status` alone.
    pub(super) fn refuse(&mut self, id: u32, status: Status) {
        write_refusal(&mut self.out, id, status);
        self.out.closed.push(id);
    }
}

/// A Watch call this connection can serve itself: gRPC with an
/// uncompressed request. Anything else goes to the routes, which answer it
/// in full.
fn is_plain_watch(head: &RequestHead) -> bool {
    let grpc = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    let uncompressed = head
        .headers
        .get("grpc-encoding")
        .is_none_or(|v| v == "identity");
    head.method == http::Method::POST && head.path == WATCH_PATH && grpc && uncompressed
}
