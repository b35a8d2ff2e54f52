//! One client connection, served on HTTP/2 directly. Watch streams are
//! driven in place by the connection's own task: their deliveries arrive
//! in the connection's inbox, and one pass of the task polls the streams
//! they went to (and those h2 woke) and writes what they have ready.
//! Every other call (List, Get, health, reflection, and a Watch whose
//! request is compressed) goes to the gRPC routes in a task of its own, as
//! a general-purpose server would run it.
//!
//! A general-purpose server runs each stream in a task of its own, woken
//! and polled through several body layers for every message: with
//! thousands of watches that wake together for each event, that per-stream
//! work was most of the server's CPU.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use futures::FutureExt;
use h2::server::{Connection, SendResponse};
use h2::{Ping, PingPong, RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use prost::Message;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::Status;
use tower::{Service, ServiceExt};
use tracing::debug;

use super::server::grpc_timeout;
use super::socket::{self, Socket};
use super::{Api, WatchMessage, WatchStream};
use crate::dispatch::Inbox;
use crate::lock;
use crate::pb;

/// The path of the calls this module serves itself.
const WATCH_PATH: &str = "/watchproxy.v1.WatchProxy/Watch";

/// Events ready together for one stream go out as one DATA frame of up to
/// this size.
const BATCH_BYTES: usize = 8 * 1024;

/// The frames of one pass are cut from allocations of this size (one per
/// frame was a tenth of the time spent per delivery). A frame HTTP/2 holds
/// for a client that stopped reading keeps its whole allocation: this
/// bounds what such a stream pins.
const PASS_BYTES: usize = 16 * 1024;

thread_local! {
    /// Where the passes run on this thread cut their frames. Once HTTP/2
    /// has written the frames of a pass, as it has by the next one nearly
    /// always, the same memory is used again, still in the CPU's cache.
    static FRAMES: std::cell::Cell<BytesMut> = std::cell::Cell::new(BytesMut::new());
}

/// The HTTP/2 receive window of each stream and of the connection.
const RECEIVE_WINDOW: u32 = 1024 * 1024;

/// How often the connection looks for watches the client reset. A watch
/// sees a reset at its next delivery; one that gets none is ended within
/// this time.
const RESET_SWEEP: Duration = Duration::from_secs(1);

/// When the next sweep is due: on the same ticks for every connection of
/// the process, so that their sweeps wake a worker once rather than once
/// per connection.
fn next_sweep(now: Instant) -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| now);
    let sweeps = now.saturating_duration_since(origin).as_nanos() / RESET_SWEEP.as_nanos();
    origin + RESET_SWEEP * (sweeps as u32 + 1)
}

/// How one connection is served.
#[derive(Clone)]
pub struct Settings {
    pub max_concurrent_streams: u32,
    pub max_message_bytes: usize,
    /// How much of one stream's response HTTP/2 may hold unwritten before
    /// the stream is asked for no more.
    pub stream_send_buffer: usize,
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
}

/// Serves one accepted connection until the client leaves, or until
/// `stop`: then GOAWAY, and the connection ends once its calls have.
pub async fn serve<S>(
    tcp: TcpStream,
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
    let (socket, flusher) = socket::split(tcp);
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
        poll_fn(|cx| driver.poll(cx)).await
    };
    if let Err(e) = Repoll::new(socket::Gathered::new(served, flusher)).await {
        debug!(error = %e, "connection ended");
    }
}

/// Polls the connection again, within the same poll of its task, when it
/// was woken while being polled. Tokio reschedules a task woken during its
/// own poll and wakes an idle worker to take it, and h2 wakes the
/// connection for the first frame a pass queues: a thread wake-up and a
/// second poll, often on the other worker, for every event a connection
/// sent.
struct Repoll<F> {
    inner: F,
    wake: Arc<RepollWake>,
    waker: Waker,
}

struct RepollWake {
    state: AtomicU8,
    task: AtomicWaker,
}

impl RepollWake {
    const IDLE: u8 = 0;
    const POLLING: u8 = 1;
    const WOKEN: u8 = 2;
}

impl<F> Repoll<F> {
    /// Polls in one task poll at most; then the task yields, as it would
    /// to a runtime's cooperative budget.
    const MAX_POLLS: usize = 4;

    fn new(inner: F) -> Self {
        let wake = Arc::new(RepollWake {
            state: AtomicU8::new(RepollWake::IDLE),
            task: AtomicWaker::new(),
        });
        Self {
            inner,
            waker: Waker::from(wake.clone()),
            wake,
        }
    }
}

impl Wake for RepollWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self.state.compare_exchange(
            Self::POLLING,
            Self::WOKEN,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) | Err(Self::WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future + Unpin> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.wake.task.register(cx.waker());
        for _ in 0..Self::MAX_POLLS {
            this.wake
                .state
                .store(RepollWake::POLLING, Ordering::Release);
            let mut inner_cx = Context::from_waker(&this.waker);
            if let Poll::Ready(out) = Pin::new(&mut this.inner).poll(&mut inner_cx) {
                return Poll::Ready(out);
            }
            if this
                .wake
                .state
                .compare_exchange(
                    RepollWake::POLLING,
                    RepollWake::IDLE,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Poll::Pending;
            }
        }
        this.wake.state.store(RepollWake::IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

type Start = futures::future::BoxFuture<'static, Option<LiveWatch>>;

/// The connection's task: accepts streams, starts watches, drives the
/// live ones, and keeps the connection alive.
struct Driver<S> {
    conn: Connection<Socket, Bytes>,
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
        let keep_alive = conn.ping_pong().map(|ping_pong| KeepAlive {
            ping_pong,
            timer: Box::pin(tokio::time::sleep(settings.keep_alive_interval)),
            awaiting_pong: false,
            interval: settings.keep_alive_interval,
            timeout: settings.keep_alive_timeout,
        });
        Self {
            conn,
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
            aside_waker,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        // Bounded: a client that keeps opening streams yields to the others.
        for _ in 0..16 {
            while let Poll::Ready(Some(started)) = self.starts.poll_next_unpin(cx) {
                if let Some(watch) = started {
                    self.watches.insert(watch.events.place(), watch);
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

    fn accept(&mut self, request: Request<RecvStream>, respond: SendResponse<Bytes>) {
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

/// Reads the request and asks the API for the watch, with its deliveries
/// in the connection's `inbox`; answers a refusal itself. `None` when
/// there is nothing to stream.
async fn start_watch(
    api: Api,
    inbox: Arc<Inbox>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    max_message_bytes: usize,
) -> Option<LiveWatch> {
    let (parts, mut body) = request.into_parts();
    let deadline = parts.headers.get("grpc-timeout").and_then(grpc_timeout);
    let started = async {
        let message = read_message(&mut body, max_message_bytes).await?;
        let request = pb::WatchRequest::decode(message)
            .map_err(|e| Status::internal(format!("failed to decode the request: {e}")))?;
        let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
        let mut extensions = parts.extensions;
        extensions.insert(inbox);
        let request = tonic::Request::from_parts(metadata, extensions, request);
        api.watch_encoded(request)
            .await
            .map(tonic::Response::into_inner)
    };
    let started = async {
        match deadline {
            Some(d) => tokio::time::timeout(d, started)
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("the call's deadline passed"))),
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
        Ok(events) => {
            let head = Response::builder()
                .header(http::header::CONTENT_TYPE, "application/grpc")
                .body(())
                .expect("a valid response head");
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

/// Reads one gRPC message from a request body.
async fn read_message(body: &mut RecvStream, max: usize) -> Result<Bytes, Status> {
    let mut buf = BytesMut::new();
    let mut want = None;
    loop {
        if want.is_none() && buf.len() >= 5 {
            if buf[0] != 0 {
                return Err(Status::internal(
                    "the request is marked compressed but names no grpc-encoding",
                ));
            }
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > max {
                return Err(Status::resource_exhausted(format!(
                    "the request is {len} bytes; the limit is {max}"
                )));
            }
            want = Some(5 + len);
        }
        if let Some(want) = want {
            if buf.len() >= want {
                return Ok(buf.split_to(want).freeze().split_off(5));
            }
        }
        let Some(chunk) = body.data().await else {
            return Err(Status::internal("the request ended before its message"));
        };
        let chunk = chunk.map_err(|e| Status::cancelled(format!("reading the request: {e}")))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
    }
}

/// The live watches of a connection, each polled when its waker says it
/// is ready, and all that are ready in one pass. (`FuturesUnordered` ends
/// its pass early once two futures wake themselves while polled, and h2
/// wakes a stream whenever it gets more room, as it does when one is
/// polled: passes of two watches, each followed by a write.)
struct Watches<F = LiveWatch> {
    /// By the place of each watch's queue in the inbox.
    slots: Vec<Option<Slot<F>>>,
    /// The deliveries of every watch, sorted into their queues at the
    /// start of each pass, which then polls the watches they went to.
    inbox: Arc<Inbox>,
    /// Wakes the connection when deliveries arrive.
    mail: Waker,
    ready: Arc<ReadyList>,
    /// The ids taken from `ready` for this pass; kept for its allocation.
    taking: Vec<usize>,
}

struct Slot<F> {
    watch: F,
    flag: Arc<WatchWaker>,
    waker: Waker,
}

#[derive(Default)]
struct ReadyList {
    ids: Mutex<Vec<usize>>,
    /// The connection's own futures (shutdown, keepalive) were woken.
    aside: AtomicBool,
    /// The connection's task, woken when the list stops being empty or
    /// the aside futures are woken.
    conn: AtomicWaker,
}

/// A watch's waker: puts it on the ready list, once until it is polled.
struct WatchWaker {
    id: usize,
    queued: AtomicBool,
    ready: Arc<ReadyList>,
}

impl Wake for WatchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let was_empty = {
            let mut ids = lock(&self.ready.ids);
            ids.push(self.id);
            ids.len() == 1
        };
        if was_empty {
            self.ready.conn.wake();
        }
    }
}

/// Wakes the connection's task for new deliveries.
struct MailWaker(Arc<ReadyList>);

impl Wake for MailWaker {
    fn wake(self: Arc<Self>) {
        self.0.conn.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.conn.wake();
    }
}

/// The waker of a connection's own futures. Polled on every pass, once per
/// delivery, the shutdown token and the keepalive timer took a few percent
/// of the task's time; they are polled only after this fired.
struct AsideWaker(Arc<ReadyList>);

impl Wake for AsideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.aside.store(true, Ordering::Release);
        self.0.conn.wake();
    }
}

impl<F> Default for Watches<F> {
    fn default() -> Self {
        let ready = Arc::<ReadyList>::default();
        Self {
            slots: Vec::new(),
            inbox: Inbox::shared(),
            mail: Waker::from(Arc::new(MailWaker(ready.clone()))),
            ready,
            taking: Vec::new(),
        }
    }
}

/// A stream driven by its connection's task.
trait Drive {
    /// Sends what the stream has ready, cutting its frames from `buf`;
    /// `Ready` once the stream is over.
    fn poll_drive(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<()>;

    /// Whether the client reset the stream. Wakes nothing later: a stream
    /// that h2 will wake for room anyway is not asked.
    fn is_reset(&mut self) -> bool;
}

impl<F> Watches<F> {
    /// A waker for the connection's other futures, which wakes the task as
    /// a watch does; it counts as fired at first, so they are polled to
    /// start.
    fn aside_waker(&self) -> Waker {
        self.ready.aside.store(true, Ordering::Release);
        Waker::from(Arc::new(AsideWaker(self.ready.clone())))
    }

    /// Whether the aside waker fired since the last call.
    fn take_aside(&self) -> bool {
        self.ready.aside.swap(false, Ordering::AcqRel)
    }
}

impl<F: Drive> Watches<F> {
    /// Adds a watch at `id`, the place of its queue in the inbox.
    fn insert(&mut self, id: usize, watch: F) {
        if id >= self.slots.len() {
            self.slots.resize_with(id + 1, || None);
        }
        debug_assert!(self.slots[id].is_none(), "one watch per place");
        let flag = Arc::new(WatchWaker {
            id,
            queued: AtomicBool::new(false),
            ready: self.ready.clone(),
        });
        let waker = Waker::from(flag.clone());
        // Polled once to start, then whenever woken.
        waker.wake_by_ref();
        self.slots[id] = Some(Slot { watch, flag, waker });
    }

    /// Ends the watches whose client reset their stream.
    fn end_reset(&mut self) {
        for slot in &mut self.slots {
            if slot.as_mut().is_some_and(|s| s.watch.is_reset()) {
                *slot = None;
            }
        }
    }

    /// Polls every watch that was ready when the pass began; those woken
    /// meanwhile wait for the next pass, for which `cx` is woken.
    fn poll_ready(&mut self, cx: &mut Context<'_>) {
        self.ready.conn.register(cx.waker());
        std::mem::swap(&mut *lock(&self.ready.ids), &mut self.taking);
        self.inbox.collect(&self.mail, &mut self.taking);
        let mut buf = FRAMES.take();
        for i in 0..self.taking.len() {
            let id = self.taking[i];
            // An id can be stale: its watch ended, and the slot may hold
            // another one now, which is then polled for nothing.
            let Some(Some(slot)) = self.slots.get_mut(id) else {
                continue;
            };
            slot.flag.queued.store(false, Ordering::Release);
            let mut cx = Context::from_waker(&slot.waker);
            if slot.watch.poll_drive(&mut cx, &mut buf).is_ready() {
                self.slots[id] = None;
            }
        }
        FRAMES.set(buf);
        self.taking.clear();
    }
}

/// A watch sending its events on its HTTP/2 stream.
struct LiveWatch {
    events: WatchStream,
    tx: SendStream<Bytes>,
    /// h2 holds the watch's waker until the stream has room, and wakes it
    /// on a reset too.
    awaiting_room: bool,
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
                        put_message(buf, &message);
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
                let mut trailers = HeaderMap::new();
                if status.add_header(&mut trailers).is_err() {
                    trailers.insert("grpc-status", HeaderValue::from_static("13"));
                }
                let _ = self.tx.send_trailers(trailers);
                return Poll::Ready(());
            }
        }
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

/// Waits until the stream has room for more of the response: `false` when
/// the client reset it or the connection is gone. Room left by the last
/// frame (see [`send_frame`]) is found without asking h2 for any.
fn poll_room(tx: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<bool> {
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

/// Appends one length-prefixed gRPC message.
fn put_message(dst: &mut BytesMut, message: &WatchMessage) {
    let at = dst.len();
    // One allocation for the message rather than growth while writing it.
    dst.reserve(5 + message.len_hint());
    dst.put_bytes(0, 5);
    message.write_to(dst);
    let len = (dst.len() - at - 5) as u32;
    dst[at + 1..at + 5].copy_from_slice(&len.to_be_bytes());
}

/// HTTP/2 pings at an interval; a peer that does not answer within the
/// timeout is dead and its connection is closed.
struct KeepAlive {
    ping_pong: PingPong,
    timer: Pin<Box<Sleep>>,
    awaiting_pong: bool,
    interval: Duration,
    timeout: Duration,
}

impl KeepAlive {
    fn poll(&mut self, cx: &mut Context<'_>) -> Result<(), h2::Error> {
        if self.awaiting_pong {
            if let Poll::Ready(pong) = self.ping_pong.poll_pong(cx) {
                pong?;
                self.awaiting_pong = false;
                self.timer.as_mut().reset(Instant::now() + self.interval);
            }
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            if self.awaiting_pong {
                return Err(h2::Error::from(h2::Reason::NO_ERROR));
            }
            self.ping_pong.send_ping(Ping::opaque())?;
            self.awaiting_pong = true;
            self.timer.as_mut().reset(Instant::now() + self.timeout);
            let _ = self.timer.as_mut().poll(cx);
            if let Poll::Ready(pong) = self.ping_pong.poll_pong(cx) {
                pong?;
            }
        }
        Ok(())
    }
}

/// Answers a call with the routes, as any HTTP/2 server would: the
/// request body streamed in, the response body streamed out within the
/// stream's flow control.
async fn call<S>(routes: S, request: Request<RecvStream>, mut respond: SendResponse<Bytes>)
where
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; wakes itself while polled, as h2 makes a stream
    /// do when it gets room; ends at its `end`-th poll.
    struct Probe {
        polls: Arc<AtomicUsize>,
        end: usize,
    }

    impl Drive for Probe {
        fn poll_drive(&mut self, cx: &mut Context<'_>, _: &mut BytesMut) -> Poll<()> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.end {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn is_reset(&mut self) -> bool {
            false
        }
    }

    struct Count(Arc<AtomicUsize>);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself in its first `self_wakes` polls; keeps the last waker.
    struct WakesItself {
        polls: usize,
        self_wakes: usize,
        waker: Option<Waker>,
    }

    impl Future for WakesItself {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.polls <= self.self_wakes {
                cx.waker().wake_by_ref();
            }
            self.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn every_connection_sweeps_on_the_same_ticks() {
        let start = Instant::now();
        let first = next_sweep(start);
        assert!(first > start && first <= start + RESET_SWEEP);
        // A connection that starts or sweeps later in the same period is
        // due at the same instant, the one after that a period later.
        for later in [1, 400, 999] {
            let now = first - RESET_SWEEP + Duration::from_millis(later);
            if now >= start {
                assert_eq!(next_sweep(now), first);
            }
        }
        assert_eq!(next_sweep(first), first + RESET_SWEEP);
        assert_eq!(next_sweep(first + RESET_SWEEP / 2), first + RESET_SWEEP);
    }

    #[test]
    fn a_connection_woken_while_polled_is_polled_again_without_waking_its_task() {
        let woken = Arc::new(AtomicUsize::new(0));
        let task = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&task);
        let mut conn = Repoll::new(WakesItself {
            polls: 0,
            self_wakes: 2,
            waker: None,
        });
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 3, "until a poll did not wake it");
        assert_eq!(woken.load(Ordering::SeqCst), 0);

        // Woken from outside a poll: the task is.
        conn.inner.waker.take().unwrap().wake();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 4);

        // One that always wakes itself yields after a bounded number.
        conn.inner.self_wakes = usize::MAX;
        assert!(Pin::new(&mut conn).poll(&mut cx).is_pending());
        assert_eq!(conn.inner.polls, 4 + Repoll::<WakesItself>::MAX_POLLS);
        assert_eq!(woken.load(Ordering::SeqCst), 2, "and its task is woken");
    }

    #[test]
    fn one_pass_polls_every_ready_watch_even_when_they_wake_themselves() {
        let mut watches = Watches::default();
        let polls: Vec<_> = (0..10).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        for (i, p) in polls.iter().enumerate() {
            let end = if i < 5 { 2 } else { usize::MAX };
            watches.insert(
                i,
                Probe {
                    polls: p.clone(),
                    end,
                },
            );
        }
        let count = |polls: &[Arc<AtomicUsize>]| -> Vec<usize> {
            polls.iter().map(|p| p.load(Ordering::SeqCst)).collect()
        };
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&waker);
        watches.poll_ready(&mut cx);
        assert_eq!(count(&polls), [1; 10], "all in one pass, once each");
        assert_eq!(
            woken.load(Ordering::SeqCst),
            1,
            "the connection is woken for the next"
        );
        watches.poll_ready(&mut cx);
        assert_eq!(count(&polls), [2; 10], "self-woken: again in the next pass");
        // A new one in the place of one that ended.
        let fresh = Arc::new(AtomicUsize::new(0));
        watches.insert(
            0,
            Probe {
                polls: fresh.clone(),
                end: usize::MAX,
            },
        );
        assert_eq!(watches.slots.len(), 10);
        watches.poll_ready(&mut cx);
        assert_eq!(count(&polls), [2, 2, 2, 2, 2, 3, 3, 3, 3, 3]);
        assert_eq!(fresh.load(Ordering::SeqCst), 1);
    }
}
