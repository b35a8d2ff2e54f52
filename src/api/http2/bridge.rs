//! Every call the connection does not serve itself, answered by the tonic
//! routes as any HTTP/2 server would: the request body streamed in, the
//! response body streamed out within the stream's flow control.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::Status;
use tower::{Service, ServiceExt};
use tracing::debug;

use super::framing::grpc_timeout;
use super::stream::poll_room;
use crate::api::error::ApiError;

/// Answers a call with the routes.
pub(super) async fn call<S>(
    routes: S,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let request = request.map(|body| Body::new(RequestBody(body)));
    let answer = {
        let reset = poll_fn(|cx| respond.poll_reset(cx));
        tokio::select! {
            answer = routes.oneshot(request) => answer,
            _ = reset => return,
        }
    };
    let Ok(answer) = answer;
    let (head, mut body) = answer.into_parts();
    let end = body.is_end_stream();
    let Ok(mut tx) = respond.send_response(Response::from_parts(head, ()), end) else {
        return;
    };
    if !end {
        poll_fn(|cx| pipe(&mut body, &mut tx, cx)).await;
    }
}

/// Copies a response body to its stream, waiting for room before each
/// frame.
fn pipe(body: &mut Body, tx: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<()> {
    loop {
        if !std::task::ready!(poll_room(tx, cx)) || tx.poll_reset(cx).is_ready() {
            return Poll::Ready(());
        }
        let frame = match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                debug!(error = %e, "response body failed");
                tx.send_reset(h2::Reason::INTERNAL_ERROR);
                return Poll::Ready(());
            }
            None => {
                let _ = tx.send_data(Bytes::new(), true);
                return Poll::Ready(());
            }
        };
        match frame.into_data() {
            Ok(data) => {
                let end = body.is_end_stream();
                if tx.send_data(data, end).is_err() || end {
                    return Poll::Ready(());
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    tx.reserve_capacity(0);
                    let _ = tx.send_trailers(trailers);
                }
                return Poll::Ready(());
            }
        }
    }
}

/// A request body read from its HTTP/2 stream, giving the flow-control
/// window back as it is read.
struct RequestBody(RecvStream);

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let body = &mut self.0;
        match std::task::ready!(body.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = body.flow_control().release_capacity(data.len());
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            None => {}
        }
        match std::task::ready!(body.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
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
