//! An informer, as Kubernetes' client-go has it (SharedInformer): a
//! [`watcher`] kept in a [`Store`] by a reflector's
//! [`Writer`], telling subscribers each change the store took. It resumes
//! a broken watch from the last version it has every event of, so a
//! restart or a move between replicas costs no list; it lists again only
//! when the server says its version is gone, and then delivers just the
//! difference.

mod subscription;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::client::Client;
use crate::error::Error;
use crate::pb::Object;
use crate::reflector::{store_with_indexes, Writer};
use crate::store::{Change, IndexFn, Store};
use crate::watcher::{self, recovery, watcher, Config, Recovery};
use subscription::Subscribers;
pub use subscription::Subscription;

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
    config: Config,
    indexers: BTreeMap<String, IndexFn>,
    subscribers: Vec<mpsc::Sender<Event>>,
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
        Informer::with_config(client, Config::new(resource))
    }

    /// An informer of what `config` says.
    pub fn with_config(client: Client, config: Config) -> Informer {
        Informer {
            client,
            config,
            indexers: BTreeMap::new(),
            subscribers: Vec::new(),
        }
    }

    fn set(mut self, change: impl FnOnce(Config) -> Config) -> Informer {
        self.config = change(self.config);
        self
    }

    /// [`Config::namespace`].
    pub fn namespace(self, namespace: impl Into<String>) -> Informer {
        self.set(|c| c.namespace(namespace))
    }

    /// [`Config::label_selector`].
    pub fn label_selector(self, selector: impl Into<String>) -> Informer {
        self.set(|c| c.label_selector(selector))
    }

    /// [`Config::field_selector`].
    pub fn field_selector(self, selector: impl Into<String>) -> Informer {
        self.set(|c| c.field_selector(selector))
    }

    /// [`Config::fields`].
    pub fn fields(self, paths: impl IntoIterator<Item = impl Into<String>>) -> Informer {
        self.set(|c| c.fields(paths))
    }

    /// [`Config::metadata_only`].
    pub fn metadata_only(self) -> Informer {
        self.set(Config::metadata_only)
    }

    /// [`Config::shard`].
    pub fn shard(
        self,
        field: impl Into<String>,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Informer {
        self.set(|c| c.shard(field, ranges))
    }

    /// [`Config::page_size`].
    pub fn page_size(self, items: i64) -> Informer {
        self.set(|c| c.page_size(items))
    }

    /// [`Config::backoff`].
    pub fn backoff(self, first: Duration, ceiling: Duration) -> Informer {
        self.set(|c| c.backoff(first, ceiling))
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

    /// A stream of every change, lossless: the informer waits for a
    /// subscriber that falls `capacity` events behind, and so reads its
    /// watch no faster. [`Running::subscribe`] is the one that never holds
    /// the informer up.
    pub fn events(&mut self, capacity: usize) -> EventStream {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.push(tx);
        ReceiverStream::new(rx)
    }

    /// Starts following on the current Tokio runtime; it stops when the
    /// returned handle is stopped or dropped, or at an error no retry can
    /// mend (a bad selector, an unknown resource, no permission).
    pub fn start(self) -> Running {
        let (store, writer) = store_with_indexes(self.indexers);
        let shared = Arc::new(Shared::default());
        let subscriptions = Arc::new(Subscribers::default());
        let cancel = CancellationToken::new();
        let follow = Follow {
            renewable: self.client.renewable(),
            stream: Box::pin(watcher(self.client, self.config)),
            writer,
            subscribers: self.subscribers,
            subscriptions: subscriptions.clone(),
            shared: shared.clone(),
        };
        let stop = cancel.clone();
        let ended = subscriptions.clone();
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                _ = stop.cancelled() => Ok(()),
                ended = follow.run() => ended,
            };
            ended.close();
            result
        });
        Running {
            store,
            shared,
            subscriptions,
            cancel,
            task: Some(task),
        }
    }
}

/// A started informer; dropping it stops it.
pub struct Running {
    store: Store,
    shared: Arc<Shared>,
    subscriptions: Arc<Subscribers>,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Running {
    /// The local copy, readable while the informer runs.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// A subscription to every change from now on, as client-go's
    /// `AddEventHandler`: made after the informer synced, it first gets
    /// every object the store holds, once, as `Added`. Its queue of
    /// `capacity` changes is never waited on: a subscriber that lets it
    /// fill falls behind and, once it has read the queue, gets the
    /// difference between what it was told and the store. (The streams of
    /// [`Informer::events`] are lossless instead, and hold the informer.)
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        self.subscriptions.subscribe(&self.store, capacity)
    }

    /// Whether the first list is in the store.
    pub fn has_synced(&self) -> bool {
        self.store.is_ready()
    }

    /// Waits for the first list to be in the store; the informer's error
    /// if it stopped before.
    pub async fn wait_until_synced(&self) -> Result<(), Error> {
        if self.store.wait_until_ready().await.is_ok() {
            return Ok(());
        }
        Err(self.shared.failed.lock().clone().unwrap_or_else(|| {
            Error::local(Code::Cancelled, "the informer stopped before it synced")
        }))
    }

    /// The version of the last change or bookmark the store took.
    pub fn resource_version(&self) -> String {
        self.store.resource_version()
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

type WatcherStream = std::pin::Pin<
    Box<dyn futures_core::Stream<Item = Result<watcher::Event<Object>, Error>> + Send>,
>;

/// The running part: the watcher's events into the store, the store's
/// changes to the subscribers.
struct Follow {
    stream: WatcherStream,
    renewable: bool,
    writer: Writer<Object>,
    subscribers: Vec<mpsc::Sender<Event>>,
    subscriptions: Arc<Subscribers>,
    shared: Arc<Shared>,
}

impl Follow {
    async fn run(mut self) -> Result<(), Error> {
        let mut listing = Some(Instant::now());
        while let Some(item) = self.stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(e) => match recovery(&e, self.renewable) {
                    Recovery::Stop => {
                        *self.shared.failed.lock() = Some(e.clone());
                        return Err(e);
                    }
                    Recovery::Relist => {
                        listing = Some(Instant::now());
                        continue;
                    }
                    Recovery::Skip => continue,
                    Recovery::Retry => {
                        if listing.is_none() {
                            self.shared.resumes.fetch_add(1, Ordering::Relaxed);
                        }
                        continue;
                    }
                },
            };
            if matches!(
                event,
                watcher::Event::Apply(_)
                    | watcher::Event::Delete(_)
                    | watcher::Event::Bookmark { .. }
            ) {
                self.shared.events.fetch_add(1, Ordering::Relaxed);
            }
            let writer = &mut self.writer;
            let events = self.subscriptions.take(|| {
                let applied = writer.apply(event);
                let mut events: Vec<Event> = applied.changes.into_iter().map(Event::from).collect();
                match applied.event {
                    watcher::Event::InitDone { resource_version } => events.push(Event::Relisted {
                        resource_version,
                        resync: false,
                    }),
                    watcher::Event::Bookmark {
                        resource_version,
                        resync: true,
                    } => events.push(Event::Relisted {
                        resource_version,
                        resync: true,
                    }),
                    _ => {}
                }
                events
            });
            for event in events {
                let listed = matches!(event, Event::Relisted { resync: false, .. });
                self.emit(event).await;
                if listed {
                    self.shared.lists.fetch_add(1, Ordering::Relaxed);
                    if let Some(started) = listing.take() {
                        *self.shared.last_list.lock() = started.elapsed();
                    }
                }
            }
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
