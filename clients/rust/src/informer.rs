//! An informer, as Kubernetes' client-go has it (Reflector, Indexer,
//! SharedInformer): it lists a resource, watches from the list's version,
//! keeps an indexed local copy, and tells subscribers what changed. It
//! resumes a broken watch from the last version it has every event of, so
//! a restart or a move between replicas costs no list; it lists again only
//! when the server says its version is gone, and then delivers just the
//! difference.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::{Error, Reason};
use crate::pb::{EventType, HashRange, ListRequest, Object, ShardSelector, WatchRequest};
use crate::store::{Change, IndexFn, Store};

/// What subscribers are told, in the order the store took it.
#[derive(Debug, Clone)]
pub enum Event {
    /// An object the store did not hold.
    Added(Arc<Object>),
    /// A new state of an object the store held.
    Modified {
        /// The state the store held.
        old: Arc<Object>,
        /// The state it holds now.
        new: Arc<Object>,
    },
    /// The object's last state.
    Deleted(Arc<Object>),
    /// The store now equals a list at `resource_version`: the events
    /// before this one since the previous watch event were the difference.
    /// `resync` when the server sent the difference on the watch (its
    /// history was lost), not a list of ours.
    Relisted {
        /// The version the store is at.
        resource_version: String,
        /// The server's resync, not a list of ours.
        resync: bool,
    },
}

impl From<Change> for Event {
    fn from(change: Change) -> Event {
        match change {
            Change::Added(o) => Event::Added(o),
            Change::Modified { old, new } => Event::Modified { old, new },
            Change::Deleted(o) => Event::Deleted(o),
        }
    }
}

/// The events of an informer, from [`Informer::events`].
pub type EventStream = ReceiverStream<Event>;

/// An informer to be started; the builder methods say what it follows.
pub struct Informer {
    client: Client,
    query: ListRequest,
    indexers: BTreeMap<String, IndexFn>,
    subscribers: Vec<mpsc::Sender<Event>>,
    backoff: Backoff,
}

/// Counts of what a running informer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lists made (the first included).
    pub lists: u64,
    /// Watches resumed after they broke.
    pub resumes: u64,
    /// Watch events received (bookmarks included).
    pub events: u64,
    /// How long the last list took, its pages, the store's update and the
    /// subscribers' taking of the difference included.
    pub last_list: Duration,
}

#[derive(Default)]
struct Shared {
    version: Mutex<String>,
    failed: Mutex<Option<Error>>,
    lists: AtomicU64,
    resumes: AtomicU64,
    events: AtomicU64,
    last_list: Mutex<Duration>,
}

impl Informer {
    /// An informer of `resource` (every namespace, no selector), not
    /// started.
    pub fn new(client: Client, resource: impl Into<String>) -> Informer {
        Informer {
            client,
            query: ListRequest {
                resource: resource.into(),
                limit: 500,
                ..Default::default()
            },
            indexers: BTreeMap::new(),
            subscribers: Vec::new(),
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
        }
    }

    /// Only this namespace (all namespaces when empty).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Informer {
        self.query.namespace = namespace.into();
        self
    }

    /// Only the objects whose labels match, e.g. `app=web,tier!=db`.
    pub fn label_selector(mut self, selector: impl Into<String>) -> Informer {
        self.query.label_selector = selector.into();
        self
    }

    /// Only the objects whose fields match, e.g. `spec.nodeName=node-7`.
    pub fn field_selector(mut self, selector: impl Into<String>) -> Informer {
        self.query.field_selector = selector.into();
        self
    }

    /// Keeps only these dotted paths of each value (`spec.nodeName`,
    /// `status.phase`); selectors still see whole objects.
    pub fn fields(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Informer {
        self.query.fields = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps only the `metadata` of each value.
    pub fn metadata_only(mut self) -> Informer {
        self.query.metadata_only = true;
        self
    }

    /// Only the objects whose `field` (`metadata.uid`, `metadata.name`,
    /// `metadata.namespace` or a selectable field) hashes into one of
    /// `ranges`: `[start, end)` of 64-bit FNV-1a, `end` 0 for 2^64, as
    /// Kubernetes' sharded List and Watch.
    pub fn shard(
        mut self,
        field: impl Into<String>,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Informer {
        self.query.shard = Some(ShardSelector {
            field: field.into(),
            ranges: (ranges.into_iter())
                .map(|(start, end)| HashRange { start, end })
                .collect(),
        });
        self
    }

    /// Items per List page.
    pub fn page_size(mut self, items: i64) -> Informer {
        self.query.limit = items;
        self
    }

    /// The first and the longest wait between retries.
    pub fn backoff(mut self, first: Duration, ceiling: Duration) -> Informer {
        self.backoff = Backoff::new(first, ceiling);
        self
    }

    /// An index of the store: `values` says which values an object is
    /// filed under, read with [`Store::by_index`].
    pub fn index(
        mut self,
        name: impl Into<String>,
        values: impl Fn(&Object) -> Vec<String> + Send + Sync + 'static,
    ) -> Informer {
        self.indexers.insert(name.into(), Arc::new(values));
        self
    }

    /// A stream of every change. The informer waits for a subscriber that
    /// falls `capacity` events behind, and so reads its watch no faster.
    pub fn events(&mut self, capacity: usize) -> EventStream {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.push(tx);
        ReceiverStream::new(rx)
    }

    /// Starts following on the current Tokio runtime; it stops when the
    /// returned handle is stopped or dropped, or at an error no retry can
    /// mend (a bad selector, an unknown resource, no permission).
    pub fn start(self) -> Running {
        let store = Store::with_indexers(self.indexers);
        let shared = Arc::new(Shared::default());
        let (synced_tx, synced) = watch::channel(false);
        let cancel = CancellationToken::new();
        let reflector = Reflector {
            client: self.client,
            query: self.query,
            store: store.clone(),
            subscribers: self.subscribers,
            backoff: self.backoff,
            shared: shared.clone(),
            synced: synced_tx,
        };
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => Ok(()),
                ended = reflector.run() => ended,
            }
        });
        Running {
            store,
            shared,
            synced,
            cancel,
            task: Some(task),
        }
    }
}

/// A started informer; dropping it stops it.
pub struct Running {
    store: Store,
    shared: Arc<Shared>,
    synced: watch::Receiver<bool>,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Running {
    /// The local copy, readable while the informer runs.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// Whether the first list is in the store.
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits for the first list to be in the store; the informer's error
    /// if it stopped before.
    pub async fn wait_until_synced(&self) -> Result<(), Error> {
        let mut synced = self.synced.clone();
        if synced.wait_for(|s| *s).await.is_ok() {
            return Ok(());
        }
        Err(self.shared.failed.lock().clone().unwrap_or_else(|| {
            Error::local(Code::Cancelled, "the informer stopped before it synced")
        }))
    }

    /// The version of the last change or bookmark the store took.
    pub fn resource_version(&self) -> String {
        self.shared.version.lock().clone()
    }

    /// Lists, resumes and relists so far.
    pub fn stats(&self) -> Stats {
        Stats {
            lists: self.shared.lists.load(Ordering::Relaxed),
            resumes: self.shared.resumes.load(Ordering::Relaxed),
            events: self.shared.events.load(Ordering::Relaxed),
            last_list: *self.shared.last_list.lock(),
        }
    }

    /// Stops it; the error that ended it, if one did.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.cancel.cancel();
        match self.task.take() {
            Some(task) => task
                .await
                .unwrap_or_else(|e| Err(Error::local(Code::Internal, e.to_string()))),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Where a watch resumes: `complete` is the last version with all its
/// events here. One version can carry several events (a transaction), so
/// the latest one seen is complete only once a later version or a
/// bookmark arrives.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    complete: u64,
    seen: u64,
}

impl Cursor {
    fn at(version: u64) -> Cursor {
        Cursor {
            complete: version,
            seen: version,
        }
    }

    fn event(&mut self, version: u64) {
        if version > self.seen {
            self.complete = self.seen;
            self.seen = version;
        }
    }

    fn bookmark(&mut self, version: u64) {
        self.seen = self.seen.max(version);
        self.complete = self.seen;
    }
}

/// The running part: list, watch, resume, list again.
struct Reflector {
    client: Client,
    query: ListRequest,
    store: Store,
    subscribers: Vec<mpsc::Sender<Event>>,
    backoff: Backoff,
    shared: Arc<Shared>,
    synced: watch::Sender<bool>,
}

fn version_of(text: &str) -> Result<u64, Error> {
    text.parse().map_err(|_| {
        Error::local(
            Code::Internal,
            format!("the server sent resource version {text:?}"),
        )
    })
}

impl Reflector {
    async fn run(mut self) -> Result<(), Error> {
        let mut resume = None;
        loop {
            let from = match resume {
                Some(version) => version,
                None => match self.relist().await {
                    Ok(version) => version,
                    Err(e) => {
                        self.pause("list", &e).await?;
                        continue;
                    }
                },
            };
            let mut cursor = Cursor::at(from);
            resume = match self.follow(&mut cursor).await {
                Ok(()) => {
                    self.pause_after_end().await;
                    Some(cursor.complete)
                }
                Err(e) if e.is_gone() => {
                    info!(resource = %self.query.resource, error = %e, "listing again");
                    None
                }
                Err(e) => {
                    self.pause("watch", &e).await?;
                    let named = e.resume_resource_version().and_then(|v| v.parse().ok());
                    self.shared.resumes.fetch_add(1, Ordering::Relaxed);
                    Some(cursor.complete.max(named.unwrap_or(0)))
                }
            };
        }
    }

    /// Waits before a retry, or gives up on an error no retry mends.
    async fn pause(&mut self, call: &str, e: &Error) -> Result<(), Error> {
        // A fixed token that expired or was revoked stays so.
        let fixed = !self.client.renewable()
            && matches!(
                e.reason(),
                Some(Reason::CredentialExpired | Reason::CredentialRevoked)
            );
        if e.is_permanent() || fixed {
            warn!(resource = %self.query.resource, call, error = %e, "informer stopped");
            *self.shared.failed.lock() = Some(e.clone());
            return Err(e.clone());
        }
        let wait = self.backoff.next(e.retry_delay());
        // A replica going away or a connection reaching its age is a
        // planned move.
        if matches!(
            e.reason(),
            Some(Reason::ShuttingDown | Reason::ConnectionAged)
        ) || e.is_credential_end()
        {
            info!(resource = %self.query.resource, call, error = %e, ?wait, "moving");
        } else {
            warn!(resource = %self.query.resource, call, error = %e, ?wait, "retrying");
        }
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// A watch the server ended cleanly resumes at once, unless it keeps
    /// ending before any event.
    async fn pause_after_end(&mut self) {
        tokio::time::sleep(self.backoff.next(None)).await;
    }

    /// Lists every page at one version into the store and tells
    /// subscribers the difference; the list's version.
    async fn relist(&mut self) -> Result<u64, Error> {
        let started = Instant::now();
        let (items, version) = self.client.list_all(self.query.clone()).await?;
        let at = version_of(&version)?;
        let changes = self.store.replace(items);
        // Synced means the store holds the list: a subscriber that waits
        // for it before reading its events must not hold up their sending.
        *self.shared.version.lock() = version.clone();
        self.shared.lists.fetch_add(1, Ordering::Relaxed);
        self.synced.send_replace(true);
        info!(resource = %self.query.resource, version = at, changes = changes.len(), "listed");
        for change in changes {
            self.emit(change.into()).await;
        }
        self.emit(Event::Relisted {
            resource_version: version,
            resync: false,
        })
        .await;
        *self.shared.last_list.lock() = started.elapsed();
        Ok(at)
    }

    /// Follows a watch from `cursor` until it ends.
    async fn follow(&mut self, cursor: &mut Cursor) -> Result<(), Error> {
        let request = WatchRequest {
            resource: self.query.resource.clone(),
            namespace: self.query.namespace.clone(),
            label_selector: self.query.label_selector.clone(),
            field_selector: self.query.field_selector.clone(),
            fields: self.query.fields.clone(),
            metadata_only: self.query.metadata_only,
            shard: self.query.shard.clone(),
            resource_version: cursor.complete.to_string(),
            allow_bookmarks: true,
            ..Default::default()
        };
        let mut watch = self.client.watch(request).await?;
        while let Some(event) = watch.next().await? {
            self.backoff.reset();
            self.shared.events.fetch_add(1, Ordering::Relaxed);
            let Some(object) = event.object else { continue };
            // Where to resume after the event: a resync's events name the
            // version its lost history starts from, while their objects
            // keep their own. A server that does not say: the object's.
            let version = match event.resume_resource_version.as_str() {
                "" => version_of(&object.resource_version)?,
                resume => version_of(resume)?,
            };
            match EventType::try_from(event.r#type) {
                Ok(EventType::Bookmark) => {
                    cursor.bookmark(version);
                    if event.resync {
                        let resource_version = object.resource_version.clone();
                        self.emit(Event::Relisted {
                            resource_version,
                            resync: true,
                        })
                        .await;
                    }
                }
                Ok(kind @ (EventType::Added | EventType::Modified | EventType::Deleted)) => {
                    cursor.event(version);
                    if let Some(change) = self.store.apply(object, kind == EventType::Deleted) {
                        self.emit(change.into()).await;
                    }
                }
                _ => {
                    warn!(resource = %self.query.resource, kind = event.r#type, "skipped an event of an unknown type");
                    continue;
                }
            }
            *self.shared.version.lock() = cursor.seen.to_string();
        }
        Ok(())
    }

    async fn emit(&mut self, event: Event) {
        let mut i = 0;
        while i < self.subscribers.len() {
            if self.subscribers[i].send(event.clone()).await.is_ok() {
                i += 1;
            } else {
                self.subscribers.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_complete_once_a_later_one_or_a_bookmark_arrives() {
        let mut c = Cursor::at(10);
        c.event(12);
        assert_eq!((c.complete, c.seen), (10, 12));
        c.event(12);
        assert_eq!((c.complete, c.seen), (10, 12));
        c.event(13);
        assert_eq!((c.complete, c.seen), (12, 13));
        c.bookmark(15);
        assert_eq!((c.complete, c.seen), (15, 15));
        // A resync's events resume from the version its lost history
        // starts from: no later than what the cursor has.
        c.event(15);
        assert_eq!((c.complete, c.seen), (15, 15));
    }
}
