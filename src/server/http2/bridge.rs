//! Every call the connection does not serve itself, answered by the tonic
//! routes in a task of its own: the request body streamed in as it
//! arrives, the response streamed back to the connection, which frames it
//! within the stream's flow control.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tonic::body::Body;
use tonic::Status;
use tower::{Service, ServiceExt};
use tracing::{debug, Instrument};

use super::grpc_framing::grpc_timeout;
use super::held::{HeldBytes, HeldResponses};
use super::protocol::frame::Reason;
use super::protocol::hpack::write_fields;
use super::protocol::out::Out;
use super::protocol::window::SendWindow;
use crate::api::error::ApiError;
use crate::api::v1::{GET_PATH, LIST_PATH, PROGRESS_PATH};

/// What a call's task sends its connection.
pub(super) enum Part {
    Head(http::response::Parts, bool),
    /// Data, counted in the connection's held bytes until it is sent or
    /// dropped.
    Data(
        Bytes,
        #[allow(dead_code, reason = "kept for its drop, which ends the count")] HeldBytes,
    ),
    Trailers(HeaderMap),
    End,
    Failed,
}

/// Where a connection's calls send their responses, and say how much of
/// their requests they have read.
#[derive(Clone)]
pub(super) struct Links {
    pub parts: mpsc::UnboundedSender<(u32, Part)>,
    pub released: mpsc::UnboundedSender<(u32, usize)>,
    pub held: Arc<HeldResponses>,
}

/// A call, as its connection keeps it.
pub(super) struct Call {
    /// Where its request's data goes; none once the request ended.
    pub body: Option<mpsc::UnboundedSender<Bytes>>,
    /// Its task; none for an answer the connection wrote itself.
    pub task: Option<AbortHandle>,
    /// The peer's window for the stream.
    pub window: SendWindow,
    /// What the task sent, waiting to be framed.
    pub queue: VecDeque<Part>,
    /// Named in the connection's starved streams.
    pub starved: bool,
    /// An answer the connection wrote itself, which ends once the request
    /// has: until then the stream is open both ways, as the client expects.
    answered: bool,
}

/// Starts answering a call with the routes, in a task of `calls`.
pub(super) fn spawn<S>(
    calls: &mut JoinSet<()>,
    routes: S,
    id: u32,
    request: Request<()>,
    links: &Links,
    window: SendWindow,
) -> Call
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    // Bounded by the receive windows: the client's bytes are given credit
    // again only as the call reads them.
    let (body_tx, body_rx) = mpsc::unbounded_channel();
    let body = RequestBody {
        id,
        data: body_rx,
        released: links.released.clone(),
        held: 0,
    };
    // A List or Get answer is produced whole as soon as it is polled;
    // a streamed one (reflection, a compressed Watch) waits on its client.
    let unary = matches!(request.uri().path(), LIST_PATH | GET_PATH | PROGRESS_PATH);
    let request = request.map(|()| Body::new(body));
    // The call's task ends with its answer, or is aborted with its stream
    // or its connection; it carries the connection's span.
    let answering = answer(
        routes,
        request,
        id,
        links.parts.clone(),
        links.held.clone(),
        unary,
    );
    let task = calls.spawn(answering.instrument(tracing::Span::current()));
    Call {
        body: Some(body_tx),
        task: Some(task),
        window,
        queue: VecDeque::new(),
        starved: false,
        answered: false,
    }
}

async fn answer<S>(
    routes: S,
    request: Request<Body>,
    id: u32,
    parts: mpsc::UnboundedSender<(u32, Part)>,
    held: Arc<HeldResponses>,
    unary: bool,
) where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let Ok(answer) = routes.oneshot(request).await;
    let (head, mut body) = answer.into_parts();
    let end = body.is_end_stream();
    if parts.send((id, Part::Head(head, end))).is_err() || end {
        return;
    }
    let last = loop {
        // Calls produce only while the connection holds less than its
        // bound, and List and Get answers one at a time: a client that
        // does not read makes the server hold at most the bound and one
        // answer (and a message of each streamed call). A streamed call
        // takes no turn, which it would keep while it waits on its client.
        let turn = match unary {
            true => Some(held.turn.lock().await),
            false => None,
        };
        held.below_bound().await;
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    let counted = held.hold(data.len());
                    if parts.send((id, Part::Data(data, counted))).is_err() {
                        return;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        break Part::Trailers(trailers);
                    }
                }
            },
            Some(Err(e)) => {
                debug!(error = %e, "response body failed");
                break Part::Failed;
            }
            None => break Part::End,
        }
        drop(turn);
    };
    let _ = parts.send((id, last));
}

impl Call {
    /// A short answer the connection gives itself, with no task: `status`
    /// and a plain-text `body`, sent as the stream's window allows, and
    /// ended once the request has. What the request sends is dropped.
    pub(super) fn answered(status: StatusCode, body: &'static str, window: SendWindow) -> Call {
        let mut head = Response::new(());
        *head.status_mut() = status;
        head.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let (head, ()) = head.into_parts();
        let queue = [
            Part::Head(head, false),
            Part::Data(
                Bytes::from_static(body.as_bytes()),
                Arc::new(HeldResponses::default()).hold(0),
            ),
        ];
        Call {
            body: None,
            task: None,
            window,
            queue: queue.into(),
            starved: false,
            answered: true,
        }
    }

    /// The client ended its request: its task reads no more, and an answer
    /// the connection wrote itself may end.
    pub(super) fn request_ended(&mut self, id: u32, out: &mut Out) {
        self.body = None;
        if std::mem::take(&mut self.answered) {
            self.queue.push_back(Part::End);
            self.flush(id, out);
        }
    }

    /// Frames what the task sent, as far as the windows allow; names the
    /// stream in `out.closed` once the response is over.
    pub(super) fn flush(&mut self, id: u32, out: &mut Out) {
        while let Some(part) = self.queue.front_mut() {
            let over = match part {
                Part::Head(head, end) => {
                    let mut block = Vec::new();
                    write_fields(Some(head.status), &head.headers, &mut block);
                    out.headers(id, &block, *end);
                    *end
                }
                Part::Data(data, _) => {
                    let room = (self.window.room())
                        .min(out.window.room())
                        .min(out.max_frame as i64);
                    if room <= 0 {
                        out.starve(id, self.window, &mut self.starved);
                        return;
                    }
                    let n = (room as usize).min(data.len());
                    out.data(id, &data.split_to(n), false);
                    self.window.take(n);
                    if !data.is_empty() {
                        continue;
                    }
                    false
                }
                Part::Trailers(trailers) => {
                    let mut block = Vec::new();
                    write_fields(None, trailers, &mut block);
                    out.headers(id, &block, true);
                    true
                }
                Part::End => {
                    out.data(id, &[], true);
                    true
                }
                Part::Failed => {
                    out.reset(id, Reason::INTERNAL_ERROR);
                    true
                }
            };
            if over {
                // Nothing after it is framed again.
                self.queue.clear();
                return out.closed.push(id);
            }
            self.queue.pop_front();
        }
    }
}

/// Request bytes a call's body holds before their credit is given back
/// as they are read.
const STREAMING_BODY: usize = 64 * 1024;

/// A request body as its stream's DATA frames arrive. What is read holds
/// its credit in the peer's window until the body ends (or is dropped, or
/// passes [`STREAMING_BODY`]), so the connection's window bounds what all
/// its unfinished requests hold.
pub(super) struct RequestBody {
    id: u32,
    data: mpsc::UnboundedReceiver<Bytes>,
    released: mpsc::UnboundedSender<(u32, usize)>,
    /// Read, and not yet given back.
    held: usize,
}

impl RequestBody {
    /// The body of request `id`, its data arriving on `data`, each byte
    /// given back to the client's windows once read.
    pub(super) fn new(id: u32, data: mpsc::UnboundedReceiver<Bytes>, links: &Links) -> Self {
        Self {
            id,
            data,
            released: links.released.clone(),
            held: 0,
        }
    }

    fn release_read(&mut self) {
        if self.held > 0 {
            let _ = self
                .released
                .send((self.id, std::mem::take(&mut self.held)));
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.release_read();
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match std::task::ready!(self.data.poll_recv(cx)) {
            Some(data) => {
                self.held += data.len();
                // A body that streams past a request's size (reflection's
                // requests, one after another) gets its credit back as it
                // goes; an unfinished request holds at most this much.
                if self.held >= STREAMING_BODY {
                    self.release_read();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => {
                self.release_read();
                Poll::Ready(None)
            }
        }
    }
}

/// Ends a call that has not answered by the client's `grpc-timeout` with
/// DEADLINE_EXCEEDED (a Watch stream, once started, is not cut by it).
#[derive(Clone)]
pub(super) struct Deadlines<S>(pub S);

impl<S> Service<Request<Body>> for Deadlines<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let deadline = req.headers().get("grpc-timeout").and_then(grpc_timeout);
        let answer = self.0.call(req);
        Box::pin(async move {
            let Some(deadline) = deadline else {
                return answer.await;
            };
            match tokio::time::timeout(deadline, answer).await {
                Ok(answer) => answer,
                Err(_) => Ok(Status::from(ApiError::DeadlineExceeded).into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_outlives_its_deadline_is_answered_deadline_exceeded() {
        let never = tower::service_fn(|_: Request<Body>| {
            futures::future::pending::<Result<Response<Body>, Infallible>>()
        });
        let mut deadlines = Deadlines(never);
        let mut req = Request::new(Body::default());
        req.headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static("50m"));
        let answer = deadlines.call(req).await.unwrap();
        let status = Status::from_header_map(answer.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }
}
