//! The watch cache of one resource: the current objects, the window of
//! recent events, and the revision they are caught up to. Readers take
//! snapshots; its one [`CacheWriter`](crate::cache::CacheWriter) applies changes and hands the events
//! to the dispatcher.

mod digest;
mod index;
#[cfg(test)]
mod model_tests;
pub mod ring;
mod snapshot;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use imbl::OrdSet;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::config::{CacheConfig, OnHistoryLost};
use crate::dispatch::{Dispatcher, Inbox, Subscription, Trigger, Wants, Watcher, Window};
use crate::object::{Event, Object, Resource, Revision, TooOld};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;
pub use digest::Digest;
pub use index::FieldIndexes;
use ring::EventRing;
pub use snapshot::Snapshot;
pub use writer::{CacheWriter, Change};

/// The store: objects ordered by key. A persistent set, so a snapshot is a
/// pointer copy and readers never hold the lock while they filter.
pub type Store = OrdSet<Stored>;

/// An object in the store or an index, ordered by its key, which it reads
/// from its own encoding: neither keeps a key of its own.
#[derive(Debug, Clone)]
pub struct Stored(pub Arc<Object>);

impl std::borrow::Borrow<[u8]> for Stored {
    fn borrow(&self) -> &[u8] {
        self.0.key_bytes()
    }
}

impl PartialEq for Stored {
    fn eq(&self, other: &Self) -> bool {
        self.0.key_bytes() == other.0.key_bytes()
    }
}

impl Eq for Stored {}

impl PartialOrd for Stored {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Stored {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key_bytes().cmp(other.0.key_bytes())
    }
}

impl std::ops::Deref for Stored {
    type Target = Arc<Object>;

    fn deref(&self) -> &Arc<Object> {
        &self.0
    }
}

/// Where the cache stands; waiters watch it change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Every event up to here is applied (the window and bookmarks stand
    /// here).
    pub revision: Revision,
    /// The objects are also etcd's at every revision up to here: etcd
    /// proved that nothing it holds under the prefix differs. Reads may be
    /// answered as of any revision up to it; the event history may not,
    /// as keys created and deleted in between are still to be delivered.
    pub valid_through: Revision,
    /// The first list has completed.
    pub ready: bool,
}

/// The objects of a resource alone need more than its `max_bytes`: its
/// cache holds nothing and serves nothing until a list fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("its objects need at least {bytes} bytes, over its max_bytes of {budget}")]
pub struct OverBudget {
    pub bytes: u64,
    pub budget: u64,
}

pub(super) struct State {
    store: Store,
    /// What the store's objects cost ([`Object::cost`]).
    bytes: u64,
    /// Set while the resource is refused for its budget.
    over_budget: Option<OverBudget>,
    indexes: FieldIndexes,
    ring: EventRing,
    revision: Revision,
    /// See [`Progress::valid_through`]; never below `revision`.
    valid_through: Revision,
    /// The revision of the newest change in the store (or of the list it
    /// came from): the objects are those of every revision from it to
    /// `valid_through`.
    changed: Revision,
    /// The store's [`Digest`].
    digest: Digest,
    ready: bool,
}

/// What an upstream watchproxy says of its objects, for a tier below to
/// prove it holds the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sameness {
    Digest(Digest),
    /// The revision of the newest change (from a watchproxy that sends no
    /// digest).
    Changed(Revision),
}

/// A few of a cache's keys and versions, for a check against etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub revision: Revision,
    /// How many keys the cache holds.
    pub count: usize,
    pub keys: Vec<(String, Revision)>,
}

/// How a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// The current state first, then changes after it.
    State,
    /// Every change after this revision, replayed from the window.
    Revision(Revision),
}

pub struct WatchStart {
    /// The state to send first as ADDED events, when starting from it.
    /// Without it the watcher starts behind and reads the window itself.
    pub state: Option<Snapshot>,
    /// Has seen everything up to its revision once `state` is sent.
    pub watcher: Watcher,
}

/// The cache of one resource, shared by the API (readers) and its one
/// [`CacheWriter`].
pub struct WatchCache {
    pub resource: Arc<Resource>,
    /// A `std` mutex: every critical section is short and never awaits.
    state: Mutex<State>,
    progress: watch::Sender<Progress>,
    dispatcher: Arc<Dispatcher>,
    metrics: ResourceMetrics,
    /// Recent snapshots at past revisions, newest last, so the pages of a
    /// list cut at one revision do not each rebuild it.
    past: Mutex<VecDeque<Snapshot>>,
    on_history_lost: OnHistoryLost,
}

/// How many past snapshots are kept for paged lists.
const PAST_SNAPSHOTS: usize = 8;

/// A revision the cache cannot show exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotInWindow {
    /// Older than the event window.
    TooOld(TooOld),
    /// Newer than the cache.
    Future { current: Revision },
}

impl WatchCache {
    /// A cache and its only writer.
    pub fn new(
        resource: Arc<Resource>,
        config: &CacheConfig,
        dispatcher: Dispatcher,
        metrics: ResourceMetrics,
    ) -> (Arc<Self>, CacheWriter) {
        let state = State {
            store: Store::new(),
            bytes: 0,
            over_budget: None,
            indexes: FieldIndexes::new(&resource.indexed_positions()),
            ring: EventRing::new(config.min_events, config.max_events, config.freshness),
            revision: 0,
            valid_through: 0,
            changed: 0,
            digest: Digest::default(),
            ready: false,
        };
        let cache = Arc::new(Self {
            resource,
            state: Mutex::new(state),
            progress: watch::Sender::new(Progress {
                revision: 0,
                valid_through: 0,
                ready: false,
            }),
            dispatcher: Arc::new(dispatcher),
            metrics,
            past: Mutex::default(),
            on_history_lost: config.on_history_lost,
        });
        (cache.clone(), CacheWriter { cache })
    }

    /// Why the cache is not ready, when its budget is the reason.
    pub fn over_budget(&self) -> Option<OverBudget> {
        self.state.lock().over_budget
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    /// The objects now, as of the newest revision they are known to be
    /// etcd's at.
    pub fn snapshot(&self) -> Snapshot {
        let s = self.state.lock();
        Snapshot {
            store: s.store.clone(),
            indexes: s.indexes.clone(),
            revision: s.valid_through,
            changed: s.changed,
            digest: Some(s.digest),
        }
    }

    /// The objects exactly as of `revision`: the current state with every
    /// later event in the window undone. Structural sharing makes this cost
    /// the events undone, not the size of the store.
    pub fn snapshot_at(&self, revision: Revision) -> Result<Snapshot, NotInWindow> {
        let (mut snapshot, later) = {
            let s = self.state.lock();
            if revision > s.valid_through || !s.ready {
                return Err(NotInWindow::Future {
                    current: s.valid_through,
                });
            }
            if revision >= s.revision {
                return Ok(Snapshot {
                    store: s.store.clone(),
                    indexes: s.indexes.clone(),
                    revision,
                    changed: s.changed,
                    digest: Some(s.digest),
                });
            }
            let later = s.ring.since(revision).map_err(NotInWindow::TooOld)?;
            if let Some(hit) = self.past.lock().iter().find(|p| p.revision == revision) {
                return Ok(hit.clone());
            }
            let snapshot = Snapshot {
                store: s.store.clone(),
                indexes: s.indexes.clone(),
                revision,
                changed: 0,
                digest: None,
            };
            (snapshot, later)
        };
        for e in later.iter().rev() {
            snapshot.indexes.update(e.object(), e.prev());
            match e.prev() {
                Some(p) => snapshot.store.insert(Stored(p.clone())),
                None => snapshot.store.remove(e.key().as_bytes()),
            };
        }
        self.remember(snapshot.clone());
        Ok(snapshot)
    }

    /// Whether the state at `revision` is at hand: the current one, or one
    /// kept for the pages of a list; any other is rebuilt from the window.
    pub fn has_snapshot(&self, revision: Revision) -> bool {
        revision >= self.state.lock().revision
            || self.past.lock().iter().any(|p| p.revision == revision)
    }

    /// Keeps `snapshot` for the next pages of a list cut at its revision,
    /// for as long as that revision is in the event window.
    pub fn remember(&self, snapshot: Snapshot) {
        let oldest = self.oldest();
        let mut past = self.past.lock();
        past.retain(|p| p.revision >= oldest);
        if snapshot.revision < oldest || past.iter().any(|p| p.revision == snapshot.revision) {
            return;
        }
        if past.len() == PAST_SNAPSHOTS {
            past.pop_front();
        }
        past.push_back(snapshot);
    }

    /// The oldest revision the cache can show exactly.
    pub fn oldest(&self) -> Revision {
        self.state.lock().ring.oldest()
    }

    /// Where the cache's events go; its bookmark clock runs apart.
    pub fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.dispatcher
    }

    pub fn watchers(&self) -> usize {
        self.dispatcher.len()
    }

    /// Waits, without bound, until the first list is in.
    pub async fn wait_ready(&self) {
        let mut rx = self.progress.subscribe();
        let _ = rx.wait_for(|p| p.ready).await;
    }

    /// Waits until the cache is ready and its objects are etcd's at
    /// `revision` or later.
    pub async fn wait_for(
        &self,
        revision: Revision,
        timeout: Duration,
    ) -> Result<Progress, Progress> {
        let mut rx = self.progress.subscribe();
        let reached = tokio::time::timeout(
            timeout,
            rx.wait_for(|p| p.ready && p.valid_through >= revision),
        )
        .await;
        match reached {
            Ok(Ok(p)) => Ok(*p),
            _ => Err(self.progress()),
        }
    }

    /// Waits, at most `timeout`, until every event up to `revision` is
    /// applied and dispatched to the watchers; the revision they stand at
    /// then. Only events and etcd's progress notifications move it: a
    /// proof that the objects are unchanged does not (see
    /// [`WatchCache::confirm_unchanged`]).
    pub async fn wait_dispatched(&self, revision: Revision, timeout: Duration) -> Revision {
        let mut rx = self.progress.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|p| p.revision >= revision)).await;
        self.progress().revision
    }

    /// Up to `n` of its keys picked at random, each with its version, the
    /// number of keys, and the revision they are the cache's at; none
    /// before the first list.
    pub fn sample(&self, n: usize) -> Option<Sample> {
        use rand::Rng;
        // The store is persistent: a clone under the lock, walked outside it.
        let (store, revision) = {
            let s = self.state.lock();
            if !s.ready {
                return None;
            }
            (s.store.clone(), s.revision)
        };
        let len = store.len();
        let mut rng = rand::rng();
        let keys = (0..n.min(len))
            .filter_map(|_| store.iter().nth(rng.random_range(0..len)))
            .map(|o| (o.key().to_owned(), o.revision))
            .collect();
        Some(Sample {
            revision,
            count: len,
            keys,
        })
    }

    /// Records etcd's proof that its objects under the prefix at `until`
    /// are those it held at `since`, if the cache is still at `since`.
    ///
    /// Only reads move with it. The revision, the window and bookmarks stay:
    /// a key created and deleted in between leaves no trace in the proof,
    /// and its events are still to come from the watch.
    pub fn confirm_unchanged(&self, since: Revision, until: Revision) {
        self.move_reads(until, |s| s.revision == since);
    }

    /// Records an upstream watchproxy's proof that its objects are etcd's
    /// current ones at `until`: when this cache holds the same objects (the
    /// same [`Digest`]; from an upstream that sends none, the same newest
    /// change), its reads move to `until` too.
    pub fn confirm_same(&self, same: Sameness, until: Revision) {
        self.move_reads(until, |s| match same {
            Sameness::Digest(d) => s.digest == d,
            Sameness::Changed(changed) => s.changed == changed,
        });
    }

    /// Reads move to `until` if the cache is ready and `proven` holds of
    /// its state.
    fn move_reads(&self, until: Revision, proven: impl FnOnce(&State) -> bool) {
        let mut s = self.state.lock();
        if !s.ready || s.valid_through >= until || !proven(&s) {
            return;
        }
        s.valid_through = until;
        self.progress.send_replace(Progress {
            revision: s.revision,
            valid_through: until,
            ready: true,
        });
    }

    /// The narrowest watcher set that covers a predicate: its key for a
    /// single-object watch, else the pinned indexed field whose value the
    /// fewest objects have now (the most selective), else every event.
    fn trigger(&self, predicate: &Predicate, indexes: &FieldIndexes) -> Trigger {
        if let Some(key) = self
            .resource
            .single_key(predicate.namespace(), predicate.name())
        {
            return Trigger::Key(Arc::from(key));
        }
        let pinned = predicate
            .pinned_fields()
            .filter_map(|(field, value)| Some((indexes.count(field, value)?, field, value)))
            .min_by_key(|(objects, _, _)| *objects);
        match (pinned, predicate.shard()) {
            (Some((_, field, value)), _) => Trigger::Field {
                field,
                value: value.to_owned(),
            },
            (None, Some(shard)) => Trigger::Shard {
                field: shard.field(),
                ranges: shard.ranges().into(),
            },
            (None, None) => Trigger::All,
        }
    }

    /// Registers a watcher whose deliveries wait in `inbox`. Capturing its
    /// starting point and registering happen under one lock, so no event
    /// falls between them.
    pub fn watch(
        &self,
        inbox: &Arc<Inbox>,
        wants: impl Into<Wants>,
        from: WatchFrom,
        bookmarks: bool,
    ) -> Result<WatchStart, TooOld> {
        let wants = wants.into();
        let s = self.state.lock();
        let (state, revision) = match from {
            // Events up to the snapshot's revision are skipped for this
            // watcher, the still undelivered ones of keys that came and
            // went before it included.
            WatchFrom::State => {
                let snapshot = Snapshot {
                    store: s.store.clone(),
                    indexes: s.indexes.clone(),
                    revision: s.valid_through,
                    changed: s.changed,
                    digest: Some(s.digest),
                };
                (Some(snapshot), s.valid_through)
            }
            WatchFrom::Revision(r) => {
                s.ring.check_resume(r)?;
                (None, r)
            }
        };
        let trigger = self.trigger(&wants.predicate, &s.indexes);
        let behind = state.is_none();
        let subscription =
            self.dispatcher
                .register(inbox, wants.clone(), trigger, revision, bookmarks, behind);
        Ok(WatchStart {
            state,
            watcher: Watcher::new(subscription, wants, revision, behind),
        })
    }
}

impl Window for WatchCache {
    fn catch_up(
        &self,
        subscription: &Subscription,
        after: Revision,
        max: usize,
    ) -> Result<Vec<Arc<Event>>, TooOld> {
        let s = self.state.lock();
        let events = s.ring.read(after, max)?;
        if events.is_empty() {
            subscription.rejoin(after);
        }
        self.metrics.replayed.inc_by(events.len() as u64);
        Ok(events)
    }

    fn events_at(&self, revision: Revision) -> Option<Vec<Arc<Event>>> {
        let s = self.state.lock();
        // A revision is applied whole, its events together.
        if s.revision < revision {
            return None;
        }
        let mut events = s.ring.read(revision.checked_sub(1)?, 1).ok()?;
        events.retain(|e| e.revision == revision);
        Some(events)
    }
}
