//! etcd's Watch: one stream of requests that create and cancel watches,
//! each a watcher of the resource its key range lies in, registered and
//! served as a `watchproxy.v1` watch is; only the messages are etcd's.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures::{Stream, StreamExt};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::{Request, Response, Status, Streaming};

use super::batch::{Batch, Outgoing};
use super::EtcdApi;
use crate::access::{Grant, Granted, HeldGrant, Identity};
use crate::api::error::{etcd_status, revoked, ApiError};
use crate::api::{CallMeta, Entered};
use crate::config::Verb;
use crate::dispatch::{Inbox, Mailbox, Place};
use crate::etcdpb::etcdserverpb::WatchRequest;

/// Changes taken from the watches at once before they are sent, so one
/// busy watch does not hold up the requests of the stream.
const BATCH: usize = 256;

impl EtcdApi {
    /// etcd's Watch: the caller identified once, each watch it creates
    /// authorized, limited and registered on its own. The stream answers
    /// its requests and sends its watches' changes as it is polled: it
    /// lives as long as the call, in the call's own task.
    pub async fn etcd_watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
        max_message: usize,
    ) -> Result<Response<EtcdStream>, Status> {
        self.etcd_session(request, max_message).map(Response::new)
    }

    /// An etcd Watch stream for `request`, whose caller is identified at
    /// once. Given the inbox of a connection's task (the service's own
    /// HTTP/2 path), it takes a place there, by which that task polls it.
    pub(crate) fn etcd_session(
        &self,
        request: Request<Streaming<WatchRequest>>,
        max_message: usize,
    ) -> Result<EtcdStream, Status> {
        let (meta, requests) = CallMeta::of(request);
        let Entered { judged, identity } = self.core.enter(&meta).map_err(etcd_status)?;
        // The stream ends with its credential, watches or none.
        let grant = Grant::of(identity.clone(), Verb::Watch, Granted::Identity);
        let grant = self.core.authority().hold(grant, &judged);
        let requests_woken = Arc::new(Woken::default());
        let alarm = requests_woken.clone();
        grant
            .grant()
            .on_revoke(move || std::task::Wake::wake_by_ref(&alarm));
        let inbox = meta.extensions.get::<Arc<Inbox>>().cloned();
        let place = inbox.as_ref().map(Inbox::reserve);
        Ok(EtcdStream {
            shutdown: Box::pin(self.core.shutdown().clone().cancelled_owned()),
            api: self.clone(),
            identity,
            grant,
            open: HashMap::new(),
            streams: WatchSet::default(),
            next_id: 0,
            max_message,
            requests,
            requests_woken,
            registered: None,
            waiting: false,
            reading: true,
            pending: None,
            batch: Batch::default(),
            end: None,
            ended: false,
            place,
            inbox,
        })
    }
}

/// One etcd Watch stream: its requests, its watches, and the responses
/// waiting to be sent.
pub struct EtcdStream {
    api: EtcdApi,
    identity: Identity,
    /// Its caller's credential, while it is in force.
    grant: HeldGrant,
    open: HashMap<i64, Opened>,
    streams: WatchSet,
    /// Where the search for a free id starts, as etcd assigns them.
    next_id: i64,
    max_message: usize,
    requests: Streaming<WatchRequest>,
    /// Whether the requests are worth reading again: a watch's changes
    /// wake the stream far more often than its requests do.
    requests_woken: Arc<Woken>,
    /// The waker `requests_woken` wakes.
    registered: Option<Waker>,
    /// Every watch was found waiting in this pass of its connection's
    /// task (the service's own path): none has more before the next,
    /// which its wake starts. Asking again in the same pass would only
    /// find them waiting.
    waiting: bool,
    /// etcd goes on sending after its client's half-close.
    reading: bool,
    pending: Option<Pending>,
    /// The responses waiting to be sent, where a turn adds its own.
    batch: Batch,
    /// The status that ends the stream, once `batch` is sent.
    end: Option<Status>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
    /// Its place in its connection's inbox, on the service's own path.
    place: Option<Mailbox>,
    /// That inbox, where its watches' deliveries wait too.
    inbox: Option<Arc<Inbox>>,
}

impl Stream for EtcdStream {
    type Item = Result<Outgoing, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_response(cx, false)
    }
}

impl EtcdStream {
    /// A pass of its connection's task begins: a watch found waiting
    /// before may have changes now.
    pub(crate) fn begin_pass(&mut self) {
        self.waiting = false;
    }

    /// Its next response, polled in a pass of its connection's task, which
    /// calls [`EtcdStream::begin_pass`] first: watches found waiting are
    /// not asked again in the same pass.
    pub(crate) fn poll_in_pass(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Outgoing, Status>>> {
        self.poll_response(cx, true)
    }

    fn poll_response(
        &mut self,
        cx: &mut Context<'_>,
        in_pass: bool,
    ) -> Poll<Option<Result<Outgoing, Status>>> {
        let this = self;
        // Asked again in the same pass once its responses went out: its
        // watches were found waiting, and its requests and its credential
        // (whose end raises the same flag) have said nothing since.
        if in_pass
            && this.waiting
            && this.batch.is_empty()
            && this.end.is_none()
            && !this.ended
            && this.pending.is_none()
            && !this.requests_woken.woken.load(Ordering::Acquire)
        {
            return Poll::Pending;
        }
        // Shutdown closes every cache's queues, which ends the stream; a
        // stream with no watch of a cache looks for it, once a call (its
        // token takes a lock).
        let mut shutdown_seen = this.streams.all_follow_a_cache();
        // The waker rarely changes: handed over again only when it does.
        if !(this.registered.as_ref()).is_some_and(|w| w.will_wake(cx.waker())) {
            *this.requests_woken.stream.lock() = Some(cx.waker().clone());
            this.registered = Some(cx.waker().clone());
            this.waiting = false;
        }
        loop {
            if let Some(response) = this.batch.pop_front() {
                return Poll::Ready(Some(Ok(response)));
            }
            // Looked at before taken: a take moves the whole status.
            if this.end.is_some() {
                this.ended = true;
                return Poll::Ready(this.end.take().map(Err));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if let Some(why) = this.grant.revoked() {
                // Nothing more reaches a caller whose credential ended.
                this.batch.clear();
                this.streams = WatchSet::default();
                this.open.clear();
                this.end = Some(etcd_status(revoked(why, None)));
                continue;
            }
            if !std::mem::replace(&mut shutdown_seen, true)
                && this.shutdown.as_mut().poll(cx).is_ready()
            {
                this.end = Some(etcd_status(ApiError::ShuttingDown { last: None }));
                continue;
            }
            let mut progressed = false;
            // Looked at before taken, as the status is.
            if this.pending.is_some() {
                if let Some(pending) = this.pending.take() {
                    if let Poll::Ready(answered) = this.poll_pending(pending, cx) {
                        progressed = true;
                        this.end = answered.err();
                    }
                }
            } else if this.reading && this.requests_woken.take() {
                let waker = Waker::from(this.requests_woken.clone());
                match (this.requests).poll_next_unpin(&mut Context::from_waker(&waker)) {
                    Poll::Ready(Some(Ok(request))) => {
                        progressed = true;
                        // More may be buffered, with no wake to come.
                        this.requests_woken.woken.store(true, Ordering::Release);
                        this.on_request(request);
                    }
                    Poll::Ready(None) => {
                        progressed = true;
                        this.reading = false;
                    }
                    // The client's side failed: nothing reaches it now.
                    Poll::Ready(Some(Err(_))) => return Poll::Ready(None),
                    Poll::Pending => {}
                }
            }
            let mut more = !(in_pass && this.waiting);
            if more && this.batch.is_empty() && this.end.is_none() {
                match this.take_lone(cx) {
                    Ok(Lone::Alone(response)) => return Poll::Ready(Some(Ok(response))),
                    Ok(Lone::Waiting) => more = false,
                    Ok(Lone::More) => progressed = true,
                    Err(status) => {
                        this.end = Some(status);
                        more = false;
                    }
                }
            }
            if more {
                match this.take_ready(cx, BATCH) {
                    Ok((taken, waiting)) => {
                        progressed |= taken > 0;
                        this.waiting = waiting;
                    }
                    Err(status) => {
                        this.end.get_or_insert(status);
                    }
                }
            }
            let open = &this.open;
            let fragments = |id| open.get(&id).is_some_and(|o| o.fragment);
            this.batch.end_turn(fragments, this.max_message);
            if !progressed && this.batch.is_empty() && this.end.is_none() {
                return Poll::Pending;
            }
        }
    }
}

impl EtcdStream {
    /// Where its connection's task names it: its place in the inbox it was
    /// given.
    pub(crate) fn place(&self) -> Option<Place> {
        self.place.as_ref().map(Mailbox::place)
    }
}

mod requests;
mod shown;
mod woken;

use requests::{Opened, Pending};
use shown::{Lone, WatchSet};
use woken::Woken;
