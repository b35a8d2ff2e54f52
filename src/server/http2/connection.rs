//! One client connection's task: reads its frames ([`inbound`]), keeps
//! its streams ([`streams`]), starts the watches it serves itself, drives the live ones, bridges every other
//! call to the routes, keeps the connection alive, and writes what a pass
//! framed in one system call after it.
//!
//! [`inbound`]: super::inbound
//! [`streams`]: super::streams

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use futures::future::{Abortable, BoxFuture};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;
use tracing::{debug, info, Span};

use super::super::router::Faces;
use super::bridge::{Links, Part};
use super::held::HeldResponses;
use super::live_watch::LiveWatch;
use super::protocol::frame::{setting, Reason, DEFAULT_WINDOW};
use super::protocol::hpack::MAX_HEADER_LIST;
use super::protocol::keepalive::KeepAlive;
use super::protocol::out::Out;
use super::protocol::repoll::Repoll;
use super::protocol::socket::{lend, return_lent, Socket, INCOMING, OUTGOING, WRITE_LIMIT};
use super::protocol::state::Session;
use super::protocol::window::RECEIVE_WINDOW;
use super::table::{Entry, State};
use super::watches::Watches;
use super::{ConnectionBounds, Routes};
use crate::access::PeerCerts;
use crate::api::{Api, WatchStream};
use crate::etcd_api::EtcdApi;
use crate::telemetry::{Bound, ServePathLabel, WriteClock};

/// How long a connection that is closing waits for its last frames to be
/// written.
const LAST_WRITE: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves one accepted connection until the client leaves, or until
/// `stop`: then GOAWAY, and the connection ends once its calls have.
///
/// `span` is entered where the connection starts calls or logs, not on
/// every pass: entering a span on each poll took a few percent of a
/// steady delivery's CPU.
pub(super) async fn serve<S>(
    socket: Socket,
    peer: Option<PeerCerts>,
    faces: Faces,
    routes: S,
    settings: ConnectionBounds,
    stop: CancellationToken,
    span: Span,
) where
    S: Routes,
{
    let mut driver = Driver::new(socket, peer, faces, routes, settings, stop, span);
    let ended = Repoll::new(poll_fn(|cx| driver.poll(cx))).await;
    let _entered = driver.span.enter();
    match ended {
        Ok(()) => {}
        Err(Fail::Io(e)) => {
            debug!(error = %e, "connection ended");
            return;
        }
        Err(Fail::Protocol(reason)) => {
            if PROTOCOL_LOGS.allow() {
                info!(
                    code = reason.0,
                    "the client broke the HTTP/2 protocol; closing its connection"
                );
            }
            driver.out.goaway(driver.h2.last_stream, reason);
        }
    }
    let last = async {
        poll_fn(|cx| driver.socket.poll_write_out(cx, &mut driver.out.buf)).await?;
        poll_fn(|cx| driver.socket.poll_shutdown(cx)).await
    };
    let _ = tokio::time::timeout(LAST_WRITE, last).await;
}

/// Protocol errors logged, across connections: at most a few a second,
/// so a flood of broken clients does not flood the log.
static PROTOCOL_LOGS: LogLimit = LogLimit::new(10);

/// At most `per_second` log lines a second.
struct LogLimit {
    per_second: u64,
    /// The second (since the process started) of the lines counted, and
    /// how many, in one word.
    state: AtomicU64,
}

impl LogLimit {
    const fn new(per_second: u64) -> Self {
        Self {
            per_second,
            state: AtomicU64::new(0),
        }
    }

    fn allow(&self) -> bool {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let second = START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs();
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let (at, n) = (state >> 20, state & 0xf_ffff);
            let next = if at == second { n + 1 } else { 1 };
            if next > self.per_second {
                return false;
            }
            let new = (second << 20) | next;
            match self
                .state
                .compare_exchange_weak(state, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => state = seen,
            }
        }
    }
}

/// Why a connection ended before its client left.
pub(super) enum Fail {
    Io(io::Error),
    /// The peer broke the protocol: GOAWAY with this reason.
    Protocol(Reason),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Fail::Io(e)
    }
}

type Start = Abortable<BoxFuture<'static, (u32, Result<WatchStream, Status>)>>;

/// The connection's task.
pub(super) struct Driver<S> {
    pub socket: Socket,
    /// Bytes read and not yet taken as frames.
    pub rbuf: BytesMut,
    /// What the protocol keeps of the connection, apart from its streams.
    pub h2: Session,
    pub out: Out,
    pub streams: HashMap<u32, Entry>,
    /// The client's certificates, given to each of its calls.
    pub peer: Option<PeerCerts>,
    pub api: Api,
    /// etcd's face, when it is served.
    pub etcd: Option<EtcdApi>,
    pub routes: S,
    pub settings: ConnectionBounds,
    /// Watches waiting for the cache.
    pub starts: FuturesUnordered<Start>,
    /// Watches sending events; each is polled only when woken.
    pub watches: Watches<LiveWatch>,
    /// Every other call, each in its own task; aborted with the connection.
    pub calls: JoinSet<()>,
    pub links: Links,
    parts: mpsc::UnboundedReceiver<(u32, Part)>,
    released: mpsc::UnboundedReceiver<(u32, usize)>,
    pub keep_alive: KeepAlive,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    /// When the connection reaches its maximum age, if it has one.
    aged: Option<Pin<Box<Sleep>>>,
    /// After its age, when it closes whatever calls remain.
    closing: Option<Pin<Box<Sleep>>>,
    /// The waker of the shutdown, keepalive and age timers.
    aside_waker: Waker,
    /// The waker of the socket's reads.
    pub read_waker: Waker,
    /// Names the peer, and its caller once identified.
    pub span: Span,
}

impl<S: Routes> Driver<S> {
    fn new(
        socket: Socket,
        peer: Option<PeerCerts>,
        Faces { api, etcd }: Faces,
        routes: S,
        settings: ConnectionBounds,
        stop: CancellationToken,
        span: Span,
    ) -> Self {
        let watches = Watches::new(settings.direct_delivery);
        let (aside_waker, read_waker) = (watches.aside_waker(), watches.read_waker());
        // Bounded by the held responses: a call produces more only while
        // the connection holds less than its bound of unsent bytes.
        let (parts_tx, parts) = mpsc::unbounded_channel();
        // Bounded by the receive windows: one release per read of bytes
        // the client could send only within them.
        let (released_tx, released) = mpsc::unbounded_channel();
        let metrics = api.metrics().http2.clone();
        let held = Arc::new(HeldResponses::new(metrics.held_response_bytes().clone()));
        let mut out = Out {
            metrics,
            clock: WriteClock::new(api.metrics().delivery_latency(ServePathLabel::fast)),
            ..Out::default()
        };
        out.settings(&[
            (
                setting::MAX_CONCURRENT_STREAMS,
                settings.max_concurrent_streams,
            ),
            (setting::INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
            (setting::MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST as u32),
        ]);
        out.window_update(0, RECEIVE_WINDOW - DEFAULT_WINDOW as u32);
        let max_age = settings.max_connection_age;
        Self {
            socket,
            rbuf: BytesMut::new(),
            h2: Session::default(),
            out,
            streams: HashMap::new(),
            peer,
            api,
            etcd,
            routes,
            keep_alive: KeepAlive::new(settings.keep_alive_interval, settings.keep_alive_timeout),
            settings,
            starts: FuturesUnordered::new(),
            watches,
            calls: JoinSet::new(),
            links: Links {
                parts: parts_tx,
                released: released_tx,
                held,
            },
            parts,
            released,
            stop: Box::pin(stop.cancelled_owned()),
            // A tenth either way, so that connections made together do not
            // all end together.
            aged: max_age.map(|age| {
                let age = age.mul_f64(rand::random_range(0.9..1.1));
                Box::pin(tokio::time::sleep(age))
            }),
            closing: None,
            aside_waker,
            read_waker,
            span,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Fail>> {
        lend(&OUTGOING, &mut self.out.buf);
        lend(&INCOMING, &mut self.rbuf);
        let polled = self.poll_passes(cx);
        return_lent(&OUTGOING, &mut self.out.buf);
        return_lent(&INCOMING, &mut self.rbuf);
        polled
    }

    fn poll_passes(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Fail>> {
        // Bounded: a client that keeps sending yields to the others.
        for _ in 0..16 {
            // Before any of the wakers' flags is read: a wake after the
            // read then wakes this task again.
            self.watches.register(cx);
            // A client that does not read what it is sent is not read
            // either: its pings and SETTINGS would be answered without end.
            let full = self.out.buf.len() >= WRITE_LIMIT;
            if !full && self.watches.take_readable() && self.poll_frames(cx)?.is_ready() {
                // The client closed the connection.
                return Poll::Ready(Ok(()));
            }
            let mut busy = false;
            if !self.starts.is_empty() {
                let _entered = self.span.clone().entered();
                while let Poll::Ready(Some(started)) = self.starts.poll_next_unpin(cx) {
                    if let Ok((id, started)) = started {
                        self.started(id, started);
                    }
                    busy = true;
                }
            }
            if self.watches.take_aside() {
                self.poll_aside()?;
            }
            let full = full || self.out.buf.len() >= WRITE_LIMIT;
            if !full {
                self.watches.poll_ready(&mut self.out);
            }
            self.close_ended();
            if let Poll::Ready(Err(e)) = self.socket.poll_write_out(cx, &mut self.out.buf) {
                return Poll::Ready(Err(e.into()));
            }
            if self.out.buf.is_empty() {
                self.out.clock.written();
            }
            // What was skipped for a full buffer is done once it has room:
            // the wakes that asked for it were spent.
            busy |= full && self.out.buf.len() < WRITE_LIMIT;
            if self.h2.conn.draining() && self.streams.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if !busy {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// The shutdown, keepalive and age timers, and what the calls'
    /// tasks send back, polled once their waker fired: polled on every
    /// pass, once per delivery, they took a few percent of the task's time.
    fn poll_aside(&mut self) -> Result<(), Fail> {
        let _entered = self.span.clone().entered();
        let waker = self.aside_waker.clone();
        let mut cx = Context::from_waker(&waker);
        self.poll_calls(&mut cx);
        if !self.h2.conn.goaway_sent() && self.stop.as_mut().poll(&mut cx).is_ready() {
            self.go_away(false);
        }
        if self.keep_alive.poll(&mut cx, &mut self.out).is_err() {
            debug!("keepalive unanswered; closing the connection");
            self.out.metrics.sent_away(Bound::keepalive);
            return Err(Fail::Io(io::ErrorKind::TimedOut.into()));
        }
        if self
            .aged
            .as_mut()
            .is_some_and(|aged| aged.as_mut().poll(&mut cx).is_ready())
        {
            self.aged = None;
            self.go_away(true);
            self.watches.end_aged(&mut self.out);
            let grace = self.settings.max_connection_age_grace;
            self.closing = Some(Box::pin(tokio::time::sleep(grace)));
        }
        if self
            .closing
            .as_mut()
            .is_some_and(|c| c.as_mut().poll(&mut cx).is_ready())
        {
            debug!("the connection's age and grace are over; closing it");
            return Err(Fail::Io(io::ErrorKind::TimedOut.into()));
        }
        Ok(())
    }

    /// The calls' parts of responses, the request bytes they consumed
    /// (which the client may send again) and their ends.
    fn poll_calls(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some((id, part))) = self.parts.poll_recv(cx) {
            if let Some(Entry {
                state: State::Call(call),
                ..
            }) = self.streams.get_mut(&id)
            {
                call.queue.push_back(part);
                call.flush(id, &mut self.out);
            }
        }
        while let Poll::Ready(Some((id, n))) = self.released.poll_recv(cx) {
            self.release_stream_window(id, n as u32);
            self.release_connection_window(n as u32);
        }
        while let Poll::Ready(Some(_)) = self.calls.poll_join_next(cx) {}
    }

    /// Sends GOAWAY, once: the streams opened so far are served, later
    /// ones refused; `aged`: the connection reached its age.
    fn go_away(&mut self, aged: bool) {
        if self.h2.conn.send_goaway(aged) {
            self.out.goaway(self.h2.last_stream, Reason::NO_ERROR);
        }
    }
}
