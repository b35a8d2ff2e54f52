//! One client connection's task: accepts its streams, starts the watches
//! it serves itself, drives the live ones, bridges every other call to the
//! routes, and keeps the connection alive.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use h2::server::{Connection, SendResponse};
use h2::RecvStream;
use http::{Request, Response};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tower::Service;
use tracing::debug;

use super::bridge::call;
use super::keepalive::{next_sweep, KeepAlive};
use super::repoll::Repoll;
use super::socket::{self, Flusher, Socket};
use super::stream::{start_watch, LiveWatch};
use super::watches::{Drive, Watches};
use super::Settings;
use crate::api::auth::PeerCerts;
use crate::api::service::WATCH_PATH;
use crate::api::Api;

/// The HTTP/2 receive window of each stream and of the connection.
const RECEIVE_WINDOW: u32 = 1024 * 1024;

/// Serves one accepted connection until the client leaves, or until
/// `stop`: then GOAWAY, and the connection ends once its calls have.
pub(super) async fn serve<S>(
    (socket, flusher): (Socket, Flusher),
    peer: Option<PeerCerts>,
    api: Api,
    routes: S,
    settings: Settings,
    stop: CancellationToken,
) where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let served = async move {
        let conn = h2::server::Builder::new()
            .max_concurrent_streams(settings.max_concurrent_streams)
            .max_send_buffer_size(settings.stream_send_buffer)
            .max_header_list_size(16 * 1024)
            // Receive windows (and with them h2's budget for small DATA
            // frames not yet read) as hyper sets them: with the protocol's
            // 64 KiB, a few hundred requests arriving at once end the
            // connection with ENHANCE_YOUR_CALM.
            .initial_window_size(RECEIVE_WINDOW)
            .initial_connection_window_size(RECEIVE_WINDOW)
            .handshake::<_, Bytes>(socket)
            .await?;
        let mut driver = Driver::new(conn, api, routes, settings, stop);
        driver.peer = peer;
        poll_fn(|cx| driver.poll(cx)).await
    };
    if let Err(e) = Repoll::new(socket::Gathered::new(served, flusher)).await {
        debug!(error = %e, "connection ended");
    }
}

type Start = futures::future::BoxFuture<'static, Option<LiveWatch>>;

/// The connection's task: accepts streams, starts watches, drives the
/// live ones, and keeps the connection alive.
struct Driver<S> {
    conn: Connection<Socket, Bytes>,
    /// The client's certificates, given to each of its calls.
    peer: Option<PeerCerts>,
    api: Api,
    routes: S,
    settings: Settings,
    /// Watches reading their request or waiting for the cache.
    starts: FuturesUnordered<Start>,
    /// Watches sending events; each is polled only when woken.
    watches: Watches<LiveWatch>,
    /// Every other call, each in its own task; aborted with the connection.
    calls: JoinSet<()>,
    keep_alive: Option<KeepAlive>,
    sweep: Pin<Box<Sleep>>,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    stopping: bool,
    /// When the connection reaches its maximum age, if it has one.
    aged: Option<Pin<Box<Sleep>>>,
    /// Past its age: its watches have ended, new ones end at once.
    aged_out: bool,
    /// After its age, when it closes whatever calls remain.
    closing: Option<Pin<Box<Sleep>>>,
    /// The waker of the shutdown and keepalive futures.
    aside_waker: Waker,
}

impl<S> Driver<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    fn new(
        mut conn: Connection<Socket, Bytes>,
        api: Api,
        routes: S,
        settings: Settings,
        stop: CancellationToken,
    ) -> Self {
        let watches = Watches::default();
        let aside_waker = watches.aside_waker();
        let max_age = settings.max_connection_age;
        let keep_alive = conn.ping_pong().map(|ping_pong| {
            KeepAlive::new(
                ping_pong,
                settings.keep_alive_interval,
                settings.keep_alive_timeout,
            )
        });
        Self {
            conn,
            peer: None,
            api,
            routes,
            settings,
            starts: FuturesUnordered::new(),
            watches,
            calls: JoinSet::new(),
            keep_alive,
            sweep: Box::pin(tokio::time::sleep_until(next_sweep(Instant::now()))),
            stop: Box::pin(stop.cancelled_owned()),
            stopping: false,
            // A tenth either way, so that connections made together do not
            // all end together.
            aged: max_age.map(|age| {
                let age = age.mul_f64(rand::random_range(0.9..1.1));
                Box::pin(tokio::time::sleep(age))
            }),
            aged_out: false,
            closing: None,
            aside_waker,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        // Bounded: a client that keeps opening streams yields to the others.
        for _ in 0..16 {
            while let Poll::Ready(Some(started)) = self.starts.poll_next_unpin(cx) {
                match started {
                    Some(mut watch) if self.aged_out => watch.end_aged(),
                    Some(watch) => self.watches.insert(watch.place(), watch),
                    None => {}
                }
            }
            self.watches.poll_ready(cx);
            // Checked once `poll_ready` has registered the task's waker,
            // which the aside waker wakes as well.
            if self.watches.take_aside() {
                let mut aside_cx = Context::from_waker(&self.aside_waker);
                if !self.stopping && self.stop.as_mut().poll(&mut aside_cx).is_ready() {
                    self.stopping = true;
                    self.conn.graceful_shutdown();
                }
                if let Some(keep_alive) = &mut self.keep_alive {
                    if let Err(e) = keep_alive.poll(&mut aside_cx) {
                        debug!(error = %e, "keepalive failed; closing the connection");
                        return Poll::Ready(Ok(()));
                    }
                }
                if self
                    .aged
                    .as_mut()
                    .is_some_and(|aged| aged.as_mut().poll(&mut aside_cx).is_ready())
                {
                    self.aged = None;
                    self.aged_out = true;
                    if !self.stopping {
                        self.stopping = true;
                        self.conn.graceful_shutdown();
                    }
                    self.watches.end_aged();
                    let grace = self.settings.max_connection_age_grace;
                    self.closing = Some(Box::pin(tokio::time::sleep(grace)));
                }
                if self
                    .closing
                    .as_mut()
                    .is_some_and(|c| c.as_mut().poll(&mut aside_cx).is_ready())
                {
                    debug!("the connection's age and grace are over; closing it");
                    return Poll::Ready(Ok(()));
                }
                if self.sweep.as_mut().poll(&mut aside_cx).is_ready() {
                    self.watches.end_reset();
                    self.sweep.as_mut().reset(next_sweep(Instant::now()));
                    let _ = self.sweep.as_mut().poll(&mut aside_cx);
                }
            }
            while let Poll::Ready(Some(_)) = self.calls.poll_join_next(cx) {}
            // Last, so that what the watches sent is written in this pass.
            let mut accepted = false;
            loop {
                match self.conn.poll_accept(cx) {
                    Poll::Ready(Some(Ok((request, respond)))) => {
                        self.accept(request, respond);
                        accepted = true;
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                    Poll::Pending => break,
                }
            }
            if !accepted {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn accept(&mut self, mut request: Request<RecvStream>, respond: SendResponse<Bytes>) {
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        if is_plain_watch(&request) {
            let start = start_watch(
                self.api.clone(),
                self.watches.inbox.clone(),
                request,
                respond,
                self.settings.max_message_bytes,
            );
            self.starts.push(start.boxed());
        } else {
            self.calls
                .spawn(call(self.routes.clone(), request, respond));
        }
    }
}

/// A Watch call this module can serve itself: gRPC with an uncompressed
/// request. Anything else goes to the routes, which answer it in full.
fn is_plain_watch(request: &Request<RecvStream>) -> bool {
    let headers = request.headers();
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    let uncompressed = headers.get("grpc-encoding").is_none_or(|v| v == "identity");
    request.method() == http::Method::POST
        && request.uri().path() == WATCH_PATH
        && grpc
        && uncompressed
}
