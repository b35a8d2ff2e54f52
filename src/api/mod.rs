//! The gRPC service: List, Get and Watch served from the watch caches.

mod connection;
mod continue_token;
pub mod error;
pub mod health;
pub mod server;
mod socket;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::cache::{NotInWindow, Snapshot, WatchCache, WatchFrom, WatchStart};
use crate::dispatch::{Encoded, Inbox, Next, View, Watcher};
use crate::object::{range_end, EventType, Object, RequestedVersion, Resource, Revision};
use crate::pb;
use crate::selector::Predicate;
use crate::source::{Etcd, EtcdError, Freshness};
use crate::telemetry::{EndReason, EtcdRequest, Metrics, ResourceMetrics};
use continue_token::ContinueToken;
use error::ApiError;

/// One served resource: its cache, its revision checks and its metrics.
#[derive(Clone)]
pub struct Served {
    pub cache: Arc<WatchCache>,
    pub freshness: Arc<Freshness>,
    pub metrics: ResourceMetrics,
    /// One permit per open watch of this resource.
    pub watch_slots: Arc<Semaphore>,
}

/// Where a read is answered from.
enum Source {
    /// The cache, at the snapshot's revision.
    Cache(Snapshot),
    /// etcd at this revision: the cache did not catch up in time.
    Etcd(Revision),
}

/// The `WatchProxy` service.
#[derive(Clone)]
pub struct Api {
    resources: Arc<HashMap<String, Served>>,
    etcd: Etcd,
    /// Bound on waiting for readiness, freshness or a requested version.
    freshness_wait: Duration,
    /// One permit per open watch of any resource.
    watch_slots: Arc<Semaphore>,
    metrics: Metrics,
    shutdown: CancellationToken,
}

impl Api {
    pub fn new(
        resources: HashMap<String, Served>,
        etcd: Etcd,
        freshness_wait: Duration,
        max_watchers: usize,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            resources: Arc::new(resources),
            etcd,
            freshness_wait,
            watch_slots: Arc::new(Semaphore::new(max_watchers)),
            metrics,
            shutdown,
        }
    }

    /// Times a call and records it by resource, method and status code.
    async fn timed<T>(
        &self,
        resource: &str,
        method: &'static str,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, Status> {
        let started = Instant::now();
        let result = call.await.map_err(Status::from);
        let code = result
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        let resource = if self.resources.contains_key(resource) {
            resource
        } else {
            "unknown"
        };
        self.metrics
            .call(resource, method, code, started.elapsed().as_secs_f64());
        result
    }

    fn served(&self, name: &str) -> Result<&Served, ApiError> {
        self.resources.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.resources.keys().map(String::as_str).collect();
            known.sort_unstable();
            ApiError::UnknownResource {
                name: name.to_owned(),
                known: known.join(", "),
            }
        })
    }

    async fn ready(&self, s: &Served) -> Result<(), ApiError> {
        s.cache
            .wait_for(0, self.freshness_wait)
            .await
            .map(|_| ())
            .map_err(|_| ApiError::NotReady {
                resource: s.cache.resource.name.clone(),
            })
    }

    /// Brings the cache to `min`, or (no `min`) to etcd's revision at the
    /// time of the call, learned from a check shared with concurrent reads.
    /// If the cache does not get there within `freshness_wait`, a version
    /// etcd has not reached is "too large"; otherwise the read falls back
    /// to etcd at its current revision (counted).
    async fn catch_up(&self, s: &Served, min: Option<Revision>) -> Result<Source, ApiError> {
        self.ready(s).await?;
        let cache = &s.cache;
        if min.is_some_and(|m| cache.progress().revision >= m) {
            return Ok(Source::Cache(cache.snapshot()));
        }
        let deadline = Instant::now() + self.freshness_wait;
        let mut target = min;
        loop {
            // Each check also advances an idle cache that etcd proves
            // unchanged, so waiting below ends at once in that case.
            let now = s
                .freshness
                .current_revision()
                .await
                .map_err(ApiError::EtcdShared)?;
            let target = *target.get_or_insert(now);
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(250));
            if cache.wait_for(target, step).await.is_ok() {
                return Ok(Source::Cache(cache.snapshot()));
            }
            if Instant::now() >= deadline {
                return match min {
                    Some(requested) if requested > now => Err(ApiError::TooLarge {
                        requested,
                        current: cache.progress().revision,
                    }),
                    _ => {
                        s.metrics.consistent_read_fallbacks.inc();
                        Ok(Source::Etcd(now))
                    }
                };
            }
        }
    }

    /// Where to answer a read at a request's resource version
    /// (not-older-than rules).
    async fn source_for(&self, s: &Served, version: RequestedVersion) -> Result<Source, ApiError> {
        match version {
            RequestedVersion::Latest => self.catch_up(s, None).await,
            RequestedVersion::At(n) => self.catch_up(s, Some(n)).await,
            RequestedVersion::Any => {
                self.ready(s).await?;
                Ok(Source::Cache(s.cache.snapshot()))
            }
        }
    }

    /// A snapshot of the cache for a watch, which cannot fall back to etcd.
    async fn cache_for(&self, s: &Served, version: RequestedVersion) -> Result<Snapshot, ApiError> {
        match self.source_for(s, version).await? {
            Source::Cache(snapshot) => Ok(snapshot),
            Source::Etcd(_) => Err(ApiError::NotFresh {
                resource: s.cache.resource.name.clone(),
            }),
        }
    }

    async fn list(&self, req: pb::ListRequest) -> Result<pb::ListResponse, ApiError> {
        let s = self.served(&req.resource)?;
        let resource = &s.cache.resource;
        let predicate = Predicate::new(
            resource,
            &req.namespace,
            "",
            &req.label_selector,
            &req.field_selector,
        )?;
        let version = RequestedVersion::parse(&req.resource_version)?;
        let exact = match pb::ResourceVersionMatch::try_from(req.resource_version_match) {
            Ok(pb::ResourceVersionMatch::Exact) => true,
            Ok(_) => false,
            Err(_) => {
                return Err(ApiError::InvalidArgument(
                    "unknown resource_version_match".into(),
                ))
            }
        };
        if req.limit < 0 {
            return Err(ApiError::InvalidArgument(
                "limit must not be negative".into(),
            ));
        }
        let limit = match req.limit {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        if !req.continue_token.is_empty() {
            if version != RequestedVersion::Latest || exact {
                return Err(ApiError::InvalidArgument(
                    "resource_version must be unset when continue_token is set".into(),
                ));
            }
            let token = ContinueToken::decode(&req.continue_token, resource)?;
            let after = Some(token.after.as_str());
            if token.from_etcd {
                return self
                    .etcd_page(s, &predicate, token.revision, after, limit)
                    .await;
            }
            return match s.cache.snapshot_at(token.revision) {
                Ok(snapshot) => Ok(page_from_snapshot(s, &snapshot, &predicate, after, limit)),
                Err(NotInWindow::TooOld(_)) | Err(NotInWindow::Future { .. }) => {
                    Err(ApiError::ContinueExpired {
                        revision: token.revision,
                    })
                }
            };
        }
        if exact {
            let RequestedVersion::At(n) = version else {
                return Err(ApiError::InvalidArgument(
                    "EXACT needs a resource_version other than \"\" and \"0\"".into(),
                ));
            };
            if let Source::Etcd(_) = self.catch_up(s, Some(n)).await? {
                return self.etcd_page(s, &predicate, n, None, limit).await;
            }
            return match s.cache.snapshot_at(n) {
                Ok(snapshot) => Ok(page_from_snapshot(s, &snapshot, &predicate, None, limit)),
                Err(_) => self.etcd_page(s, &predicate, n, None, limit).await,
            };
        }
        match self.source_for(s, version).await? {
            Source::Cache(snapshot) => {
                Ok(page_from_snapshot(s, &snapshot, &predicate, None, limit))
            }
            Source::Etcd(revision) => self.etcd_page(s, &predicate, revision, None, limit).await,
        }
    }

    /// A page of the state at `revision` read from etcd, for revisions the
    /// cache cannot show.
    async fn etcd_page(
        &self,
        s: &Served,
        predicate: &Predicate,
        revision: Revision,
        after: Option<&str>,
        limit: usize,
    ) -> Result<pb::ListResponse, ApiError> {
        let resource = &s.cache.resource;
        let prefix = match resource.single_key(predicate.namespace(), predicate.name()) {
            Some(key) => key,
            None => resource.namespace_prefix(predicate.namespace().unwrap_or("")),
        };
        let end = if predicate.name().is_some() {
            format!("{prefix}\0")
        } else {
            range_end(&prefix)
        };
        let mut from = match after {
            Some(a) if a >= prefix.as_str() => format!("{a}\0"),
            _ => prefix.clone(),
        };
        let mut items = Vec::new();
        let page_size = limit.saturating_add(1).clamp(1, 1000) as i64;
        loop {
            let page = match self
                .etcd
                .page(
                    &s.metrics,
                    EtcdRequest::exact_list_page,
                    &from,
                    &end,
                    Some(revision),
                    page_size,
                )
                .await
            {
                Ok(p) => p,
                Err(EtcdError::Compacted { .. }) => return Err(ApiError::Compacted { revision }),
                Err(EtcdError::FutureRevision) => {
                    return Err(ApiError::TooLarge {
                        requested: revision,
                        current: s.cache.progress().revision,
                    })
                }
                Err(e) => return Err(e.into()),
            };
            for (k, v, rev) in &page.kvs {
                // Undecodable values are skipped here as in the cache.
                if let Ok(o) = resource.decode(k, v, *rev) {
                    if predicate.matches(&o) {
                        items.push(Arc::new(o));
                    }
                }
            }
            let last = page
                .kvs
                .last()
                .map(|(k, _, _)| String::from_utf8_lossy(k).into_owned());
            match last {
                Some(k) if page.more && items.len() <= limit => from = format!("{k}\0"),
                _ => break,
            }
        }
        let more = items.len() > limit;
        items.truncate(limit);
        let remaining = match items.last() {
            Some(last) if more && !predicate.has_selectors() => {
                let after_last = format!("{}\0", last.key);
                let (n, _) = self
                    .etcd
                    .count(
                        &s.metrics,
                        EtcdRequest::exact_list_page,
                        &after_last,
                        &end,
                        Some(revision),
                        None,
                    )
                    .await?;
                Some(n as usize)
            }
            _ => None,
        };
        let page = Page {
            revision,
            more,
            remaining,
            from_etcd: true,
        };
        Ok(page_response(resource, items.iter(), page))
    }

    async fn get(&self, req: pb::GetRequest) -> Result<pb::Object, ApiError> {
        let s = self.served(&req.resource)?;
        let resource = &s.cache.resource;
        if req.name.is_empty() || (resource.namespaced && req.namespace.is_empty()) {
            let what = if resource.namespaced {
                "namespace and name are"
            } else {
                "name is"
            };
            return Err(ApiError::InvalidArgument(format!(
                "{what} required for {}",
                resource.name
            )));
        }
        let version = RequestedVersion::parse(&req.resource_version)?;
        let key = resource.key(&req.namespace, &req.name);
        let found = match self.source_for(s, version).await? {
            Source::Cache(snapshot) => snapshot
                .store
                .get(key.as_str())
                .map(|o| object_pb(o, o.revision)),
            Source::Etcd(revision) => {
                let predicate = Predicate::new(resource, &req.namespace, &req.name, "", "")?;
                let page = self.etcd_page(s, &predicate, revision, None, 1).await?;
                page.items.into_iter().next()
            }
        };
        found.ok_or(ApiError::NotFound { key })
    }

    /// Starts a watch whose deliveries wait in `inbox`; its stream yields
    /// each event encoded for the wire.
    async fn watch(
        &self,
        req: pb::WatchRequest,
        inbox: Arc<Inbox>,
    ) -> Result<WatchStream, ApiError> {
        let s = self.served(&req.resource)?;
        let resource = &s.cache.resource;
        let predicate = Predicate::new(
            resource,
            &req.namespace,
            &req.name,
            &req.label_selector,
            &req.field_selector,
        )?;
        let version = RequestedVersion::parse(&req.resource_version)?;
        let timeout = match req.timeout_seconds {
            t if t < 0 => {
                return Err(ApiError::InvalidArgument(
                    "timeout_seconds must not be negative".into(),
                ))
            }
            0 => None,
            t => Some(Duration::from_secs(t as u64)),
        };
        if self.shutdown.is_cancelled() {
            return Err(ApiError::ShuttingDown { last: None });
        }
        let slots = (
            self.watch_slots.clone().try_acquire_owned().map_err(|_| {
                ApiError::TooManyWatchers {
                    scope: "in total".into(),
                }
            })?,
            s.watch_slots
                .clone()
                .try_acquire_owned()
                .map_err(|_| ApiError::TooManyWatchers {
                    scope: format!("for {}", resource.name),
                })?,
        );
        let from = match version {
            RequestedVersion::At(n) if !req.send_initial_events => {
                self.cache_for(s, version).await?;
                WatchFrom::Revision(n)
            }
            v => {
                self.cache_for(s, v).await?;
                WatchFrom::State
            }
        };
        let start = s
            .cache
            .watch(&inbox, predicate, from, req.allow_bookmarks)
            .map_err(|too_old| {
                let WatchFrom::Revision(requested) = from else {
                    unreachable!("only a replay can be too old")
                };
                ApiError::TooOld {
                    requested,
                    oldest: too_old.oldest,
                    current: s.cache.progress().revision,
                }
            })?;
        let WatchStart { state, watcher } = start;
        // The end of the initial state is marked only when it was sent.
        let initial_end = (state.is_some() && req.send_initial_events).then(|| watcher.revision());
        let initial: Vec<Arc<Object>> = match state {
            Some(snapshot) => snapshot
                .select(resource, watcher.predicate(), None)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Ok(WatchStream {
            _slots: slots,
            cache: s.cache.clone(),
            watcher,
            initial: initial.into_iter(),
            initial_end,
            allow_bookmarks: req.allow_bookmarks,
            timer: timeout.map(|t| Box::pin(tokio::time::sleep(t))),
            end: EndCounter {
                metrics: s.metrics.clone(),
                reason: None,
            },
        })
    }
}

type WatchEvents = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

/// One `WatchEvent` of a watch stream, as the Watch codec writes it.
pub enum WatchMessage {
    /// A live or replayed change. Live changes carry the encoding every
    /// watcher shares, and it is copied straight from them to the wire.
    Change(Arc<View>),
    /// Made for this watcher: initial objects and bookmarks.
    Own(Encoded),
}

impl WatchMessage {
    /// The message's length when its bytes are at hand (0 for a change
    /// read back from the window, which is encoded as it is written).
    pub fn len_hint(&self) -> usize {
        match self {
            WatchMessage::Own(e) => e.size(),
            WatchMessage::Change(view) => view.encoded.as_ref().map_or(0, Encoded::size),
        }
    }

    /// Writes the message to `dst`.
    pub fn write_to(&self, dst: &mut impl bytes::BufMut) {
        let own;
        let e = match self {
            WatchMessage::Own(e) => e,
            WatchMessage::Change(view) => match &view.encoded {
                Some(e) => e,
                None => {
                    own = encode_event(view.kind, &view.object, view.revision);
                    &own
                }
            },
        };
        dst.put_slice(&e.head);
        dst.put_slice(&e.body);
    }
}

/// Encodes a change as a `WatchEvent`. The dispatcher calls it once per
/// event and type, and every watcher shares the result. At the object's
/// own revision (every event but DELETED, and every initial ADDED) the
/// message is a few bytes of header followed by the object's encoding made
/// when it was read, so no watcher encodes the object again.
pub fn encode_event(kind: EventType, o: &Object, revision: Revision) -> Encoded {
    use prost::encoding::{encode_key, encode_varint, WireType};
    if revision != o.revision || o.wire.is_empty() {
        return Encoded {
            head: Bytes::from(event_pb(kind, o, revision).encode_to_vec()),
            body: Bytes::new(),
        };
    }
    let mut head = Vec::with_capacity(16);
    encode_key(1, WireType::Varint, &mut head);
    encode_varint(event_type_pb(kind) as u64, &mut head);
    encode_key(2, WireType::LengthDelimited, &mut head);
    encode_varint(o.wire.len() as u64, &mut head);
    Encoded {
        head: Bytes::from(head),
        body: o.wire.clone(),
    }
}

fn encode_bookmark(revision: Revision, initial_events_end: bool) -> Encoded {
    Encoded {
        head: Bytes::from(bookmark_pb(revision, initial_events_end).encode_to_vec()),
        body: Bytes::new(),
    }
}

/// What a page says about the list it belongs to.
struct Page {
    revision: Revision,
    more: bool,
    remaining: Option<usize>,
    from_etcd: bool,
}

/// A page of a snapshot. When more pages follow, the snapshot is kept so
/// they are cut from the same revision.
fn page_from_snapshot(
    s: &Served,
    snapshot: &Snapshot,
    predicate: &Predicate,
    after: Option<&str>,
    limit: usize,
) -> pb::ListResponse {
    let resource = &s.cache.resource;
    let mut it = snapshot.select(resource, predicate, after);
    let items: Vec<&Arc<Object>> = it.by_ref().take(limit).collect();
    let remaining = if predicate.has_selectors() {
        None
    } else {
        Some(it.count())
    };
    let more = match remaining {
        Some(n) => n > 0,
        None => snapshot
            .select(resource, predicate, items.last().map(|o| &*o.key))
            .next()
            .is_some(),
    };
    if more {
        s.cache.remember(snapshot.clone());
    }
    let page = Page {
        revision: snapshot.revision,
        more,
        remaining,
        from_etcd: false,
    };
    page_response(resource, items.into_iter(), page)
}

fn page_response<'a>(
    resource: &Resource,
    items: impl Iterator<Item = &'a Arc<Object>>,
    page: Page,
) -> pb::ListResponse {
    let items: Vec<pb::Object> = items.map(|o| object_pb(o, o.revision)).collect();
    let continue_token = match items.last() {
        Some(last) if page.more => {
            ContinueToken::new(resource, page.revision, last.key.clone(), page.from_etcd).encode()
        }
        _ => String::new(),
    };
    pb::ListResponse {
        items,
        resource_version: page.revision.to_string(),
        continue_token,
        remaining_item_count: page.remaining.filter(|_| page.more).map(|n| n as i64),
    }
}

pub fn object_pb(o: &Object, revision: Revision) -> pb::Object {
    pb::Object {
        key: o.key.to_string(),
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        resource_version: revision.to_string(),
        labels: o.labels.clone(),
        value: o.value.clone(),
    }
}

fn event_type_pb(kind: EventType) -> pb::EventType {
    match kind {
        EventType::Added => pb::EventType::Added,
        EventType::Modified => pb::EventType::Modified,
        EventType::Deleted => pb::EventType::Deleted,
    }
}

fn event_pb(kind: EventType, o: &Object, revision: Revision) -> pb::WatchEvent {
    pb::WatchEvent {
        r#type: event_type_pb(kind) as i32,
        object: Some(object_pb(o, revision)),
        initial_events_end: false,
    }
}

fn bookmark_pb(revision: Revision, initial_events_end: bool) -> pb::WatchEvent {
    pb::WatchEvent {
        r#type: pb::EventType::Bookmark as i32,
        object: Some(pb::Object {
            resource_version: revision.to_string(),
            ..Default::default()
        }),
        initial_events_end,
    }
}

/// One client's watch, from its start to its end: the initial state (if
/// asked for), then changes, live from the queue or read from the window
/// while the watcher is behind, until the client leaves, the timeout
/// passes, the server shuts down or the watcher falls further behind than
/// the window reaches. Written by hand rather than with `async_stream`: it
/// is polled once per delivery, for every watcher.
pub struct WatchStream {
    /// Held while the watch is open: its places in the watcher limits.
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    cache: Arc<WatchCache>,
    watcher: Watcher,
    initial: std::vec::IntoIter<Arc<Object>>,
    /// The bookmark that marks the end of the initial state, still to send.
    initial_end: Option<Revision>,
    allow_bookmarks: bool,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    end: EndCounter,
}

/// Counts how a watch ended when its stream is dropped; a stream dropped
/// without a recorded reason was abandoned by its client.
struct EndCounter {
    metrics: ResourceMetrics,
    reason: Option<EndReason>,
}

impl Drop for EndCounter {
    fn drop(&mut self) {
        self.metrics
            .watcher_ended(self.reason.unwrap_or(EndReason::client_gone));
    }
}

impl WatchStream {
    /// Where its deliveries wait in its inbox (see [`Inbox::collect`]).
    pub fn place(&self) -> usize {
        self.watcher.place()
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchMessage, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.end.reason.is_some() {
            return Poll::Ready(None);
        }
        if let Some(o) = this.initial.next() {
            let added = encode_event(EventType::Added, &o, o.revision);
            return Poll::Ready(Some(Ok(WatchMessage::Own(added))));
        }
        if let Some(revision) = this.initial_end.take() {
            return Poll::Ready(Some(Ok(WatchMessage::Own(encode_bookmark(revision, true)))));
        }
        if let Some(timer) = &mut this.timer {
            if timer.as_mut().poll(cx).is_ready() {
                this.end.reason = Some(EndReason::timeout);
                return Poll::Ready(None);
            }
        }
        loop {
            let error = match ready!(this.watcher.poll_next(cx, &this.cache)) {
                Next::Event(view) => return Poll::Ready(Some(Ok(WatchMessage::Change(view)))),
                Next::Bookmark(revision) if this.allow_bookmarks => {
                    return Poll::Ready(Some(Ok(WatchMessage::Own(encode_bookmark(
                        revision, false,
                    )))))
                }
                Next::Bookmark(_) => continue,
                Next::Expired { after, oldest } => {
                    this.end.reason = Some(EndReason::expired);
                    ApiError::TooOld {
                        requested: after,
                        oldest,
                        current: this.cache.progress().revision,
                    }
                }
                // Shutdown stops the reflectors, which closes every queue
                // after what it holds.
                Next::Closed => {
                    this.end.reason = Some(EndReason::shutdown);
                    ApiError::ShuttingDown {
                        last: Some(this.watcher.revision()),
                    }
                }
            };
            return Poll::Ready(Some(Err(error.into())));
        }
    }
}

impl Api {
    /// Answers a Watch with its events encoded, for the handler that sends
    /// them as they are. A caller that reads the deliveries of several
    /// watches in one task passes their [`Inbox`] as a request extension;
    /// otherwise the watch gets one of its own.
    pub async fn watch_encoded(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let inbox = extensions
            .get::<Arc<Inbox>>()
            .cloned()
            .unwrap_or_else(Inbox::solo);
        let info = CallInfo::new(
            "Watch",
            &req.resource,
            &req.label_selector,
            &req.field_selector,
        );
        self.answer(&metadata, info, self.watch(req, inbox)).await
    }
}

/// What a call is about, for its span and its metrics.
struct CallInfo {
    method: &'static str,
    resource: String,
    label_selector: String,
    field_selector: String,
}

impl CallInfo {
    fn new(
        method: &'static str,
        resource: &str,
        label_selector: &str,
        field_selector: &str,
    ) -> Self {
        Self {
            method,
            resource: resource.to_owned(),
            label_selector: label_selector.to_owned(),
            field_selector: field_selector.to_owned(),
        }
    }
}

impl Api {
    /// Answers a call in its span (continuing the caller's trace), timed
    /// and recorded by resource, method and status code.
    async fn answer<T>(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        info: CallInfo,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<Response<T>, Status> {
        let span = tracing::info_span!(
            "call",
            otel.name = info.method,
            rpc.method = info.method,
            resource = %info.resource,
            label_selector = %info.label_selector,
            field_selector = %info.field_selector,
            code = tracing::field::Empty,
        );
        crate::telemetry::continue_trace(&span, metadata);
        let answer = self
            .timed(&info.resource, info.method, call)
            .instrument(span.clone())
            .await;
        let code = answer
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        span.record("code", format!("{code:?}"));
        answer.map(Response::new)
    }
}

#[tonic::async_trait]
impl pb::watch_proxy_server::WatchProxy for Api {
    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let (metadata, _, req) = request.into_parts();
        let info = CallInfo::new(
            "List",
            &req.resource,
            &req.label_selector,
            &req.field_selector,
        );
        self.answer(&metadata, info, self.list(req)).await
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::Object>, Status> {
        let (metadata, _, req) = request.into_parts();
        let info = CallInfo::new("Get", &req.resource, "", "");
        self.answer(&metadata, info, self.get(req)).await
    }

    type WatchStream = WatchEvents;

    /// Timed and traced until the stream starts; how a watch ends is
    /// counted in `watchproxy_watchers_ended_total`.
    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // Reached only when the generated server is mounted directly; the
        // service normally answers Watch with the encoded events as they
        // are (see `server::ApiService`).
        let events = self.watch_encoded(request).await?;
        let decoded = events.into_inner().map(|item| {
            item.and_then(|m| {
                let mut bytes = Vec::new();
                m.write_to(&mut bytes);
                pb::WatchEvent::decode(bytes.as_slice())
                    .map_err(|e| Status::internal(e.to_string()))
            })
        });
        Ok(Response::new(Box::pin(decoded) as WatchEvents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_built_on_the_objects_own_encoding_decode_as_if_encoded_whole() {
        let mut r = Resource::for_tests(&[]);
        r.prefix = "/registry/pods".into();
        let value = br#"{"metadata":{"labels":{"app":"web"}},"spec":{"x":1}}"#;
        let o = r
            .decode(b"/registry/pods/ns/a", value, 42)
            .expect("decodes");
        assert_eq!(&o.value[..], value, "the value is a slice of the encoding");
        for (kind, revision) in [
            (EventType::Added, 42),
            (EventType::Modified, 42),
            (EventType::Deleted, 50),
        ] {
            let e = encode_event(kind, &o, revision);
            assert_eq!(
                e.body.is_empty(),
                revision != o.revision,
                "the object's bytes are shared unless its version differs"
            );
            let decoded = pb::WatchEvent::decode(e.to_bytes()).unwrap();
            assert_eq!(decoded, event_pb(kind, &o, revision));
            assert_eq!(
                decoded.object.unwrap().resource_version,
                revision.to_string()
            );
        }
    }
}
