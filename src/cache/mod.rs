//! The watch cache of one resource: the current objects, the window of
//! recent events, and the revision they are caught up to.

mod index;
pub mod ring;

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imbl::OrdMap;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::dispatch::{Dispatcher, Inbox, Subscription, Trigger, Watcher};
use crate::object::{Event, EventType, Object, Resource, Revision};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;
pub use index::FieldIndexes;
use ring::{EventRing, TooOld};

/// The store: objects by key, ordered. A persistent map, so a snapshot is a
/// pointer copy and readers never hold the lock while they filter.
pub type Store = OrdMap<Arc<str>, Arc<Object>>;

/// Where the cache stands; waiters watch it change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub revision: Revision,
    /// The first list has completed.
    pub ready: bool,
}

struct State {
    store: Store,
    indexes: FieldIndexes,
    ring: EventRing,
    revision: Revision,
    ready: bool,
}

/// The objects as of one revision.
#[derive(Clone)]
pub struct Snapshot {
    pub store: Store,
    pub indexes: FieldIndexes,
    pub revision: Revision,
}

impl Snapshot {
    /// The objects the predicate selects, in key order, starting after
    /// `after` when given. Reads only the key range the namespace or name
    /// pins.
    pub fn select<'a>(
        &'a self,
        resource: &Resource,
        predicate: &'a Predicate,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Object>> + 'a> {
        let namespace = predicate.namespace().unwrap_or("");
        if let Some(name) = predicate.name() {
            if !resource.namespaced || !namespace.is_empty() {
                let key = resource.key(namespace, name);
                let past = after.is_some_and(|a| a >= key.as_str());
                let hit = if past {
                    None
                } else {
                    self.store.get(key.as_str())
                };
                return Box::new(hit.into_iter().filter(|o| predicate.matches(o)));
            }
        }
        let prefix = resource.namespace_prefix(namespace);
        let indexed = predicate
            .pinned_fields()
            .filter_map(|(field, value)| self.indexes.lookup(field, value))
            .min_by_key(|keys| keys.len());
        if let Some(keys) = indexed {
            let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
            let keys: Vec<Arc<str>> = keys
                .range::<_, str>((lower, Bound::Unbounded))
                .cloned()
                .collect();
            return Box::new(
                keys.into_iter()
                    .filter(move |k| k.starts_with(prefix.as_str()))
                    .filter_map(|k| self.store.get(&k))
                    .filter(|o| predicate.matches(o)),
            );
        }
        let lower = match after {
            Some(a) if a >= prefix.as_str() => Bound::Excluded(a),
            _ => Bound::Included(prefix.as_str()),
        };
        let range = self.store.range::<_, str>((lower, Bound::Unbounded));
        Box::new(
            range
                .take_while(move |(k, _)| k.starts_with(prefix.as_str()))
                .map(|(_, o)| o)
                .filter(|o| predicate.matches(o)),
        )
    }
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
            indexes: FieldIndexes::new(&resource.indexed_positions()),
            ring: EventRing::new(config.min_events, config.max_events, config.freshness),
            revision: 0,
            ready: false,
        };
        let cache = Arc::new(Self {
            resource,
            state: Mutex::new(state),
            progress: watch::Sender::new(Progress {
                revision: 0,
                ready: false,
            }),
            dispatcher: Arc::new(dispatcher),
            metrics,
            past: Mutex::default(),
        });
        (cache.clone(), CacheWriter { cache })
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    pub fn snapshot(&self) -> Snapshot {
        let s = self.state.lock().unwrap();
        Snapshot {
            store: s.store.clone(),
            indexes: s.indexes.clone(),
            revision: s.revision,
        }
    }

    /// The objects exactly as of `revision`: the current state with every
    /// later event in the window undone. Structural sharing makes this cost
    /// the events undone, not the size of the store.
    pub fn snapshot_at(&self, revision: Revision) -> Result<Snapshot, NotInWindow> {
        let (mut snapshot, later) = {
            let s = self.state.lock().unwrap();
            if revision > s.revision || !s.ready {
                return Err(NotInWindow::Future {
                    current: s.revision,
                });
            }
            let later = s.ring.since(revision).map_err(NotInWindow::TooOld)?;
            if let Some(hit) = self
                .past
                .lock()
                .unwrap()
                .iter()
                .find(|p| p.revision == revision)
            {
                return Ok(hit.clone());
            }
            let snapshot = Snapshot {
                store: s.store.clone(),
                indexes: s.indexes.clone(),
                revision,
            };
            (snapshot, later)
        };
        for e in later.iter().rev() {
            let key: Arc<str> = Arc::from(e.key());
            snapshot
                .indexes
                .update(&key, e.object.as_deref(), e.prev.as_deref());
            match &e.prev {
                Some(p) => snapshot.store.insert(key, p.clone()),
                None => snapshot.store.remove(&key),
            };
        }
        self.remember(snapshot.clone());
        Ok(snapshot)
    }

    /// Keeps `snapshot` for the next pages of a list cut at its revision,
    /// for as long as that revision is in the event window.
    pub fn remember(&self, snapshot: Snapshot) {
        let oldest = self.oldest();
        let mut past = self.past.lock().unwrap();
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
        self.state.lock().unwrap().ring.oldest()
    }

    pub fn watchers(&self) -> usize {
        self.dispatcher.len()
    }

    /// Waits, without bound, until the first list is in.
    pub async fn wait_ready(&self) {
        let mut rx = self.progress.subscribe();
        let _ = rx.wait_for(|p| p.ready).await;
    }

    /// Waits until the cache is ready and at `revision` or later.
    pub async fn wait_for(
        &self,
        revision: Revision,
        timeout: Duration,
    ) -> Result<Progress, Progress> {
        let mut rx = self.progress.subscribe();
        let reached =
            tokio::time::timeout(timeout, rx.wait_for(|p| p.ready && p.revision >= revision)).await;
        match reached {
            Ok(Ok(p)) => Ok(*p),
            _ => Err(self.progress()),
        }
    }

    /// Advances the cache to `revision` on etcd's proof that nothing under
    /// the prefix changed after `since` up to it. The reflector stays the
    /// only writer of objects; this moves only the revision, and only if the
    /// cache is still at `since` or later.
    pub fn confirm_unchanged(&self, since: Revision, revision: Revision) {
        let mut s = self.state.lock().unwrap();
        if !s.ready || s.revision < since || s.revision >= revision {
            return;
        }
        s.revision = revision;
        self.metrics.cache_revision.set(revision as i64);
        self.progress.send_replace(Progress {
            revision,
            ready: true,
        });
        drop(s);
        self.dispatcher.progress(revision);
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
        predicate
            .pinned_fields()
            .filter_map(|(field, value)| Some((indexes.lookup(field, value)?.len(), field, value)))
            .min_by_key(|(objects, _, _)| *objects)
            .map_or(Trigger::All, |(_, field, value)| Trigger::Field {
                field,
                value: value.to_owned(),
            })
    }

    /// Registers a watcher whose deliveries wait in `inbox`. Capturing its
    /// starting point and registering happen under one lock, so no event
    /// falls between them.
    pub fn watch(
        &self,
        inbox: &Arc<Inbox>,
        predicate: Predicate,
        from: WatchFrom,
        bookmarks: bool,
    ) -> Result<WatchStart, TooOld> {
        let s = self.state.lock().unwrap();
        let (state, revision) = match from {
            WatchFrom::State => {
                let snapshot = Snapshot {
                    store: s.store.clone(),
                    indexes: s.indexes.clone(),
                    revision: s.revision,
                };
                (Some(snapshot), s.revision)
            }
            WatchFrom::Revision(r) if r < s.ring.oldest() => {
                return Err(TooOld {
                    oldest: s.ring.oldest(),
                })
            }
            WatchFrom::Revision(r) => (None, r),
        };
        let trigger = self.trigger(&predicate, &s.indexes);
        let behind = state.is_none();
        let subscription = self.dispatcher.register(
            inbox,
            predicate.clone(),
            trigger,
            revision,
            bookmarks,
            behind,
        );
        Ok(WatchStart {
            state,
            watcher: Watcher::new(subscription, predicate, revision, behind),
        })
    }

    /// The next events after `after` (whole revisions, about `max`) for a
    /// watcher that is behind. When there are none it has caught up: it
    /// rejoins live delivery, under the lock that orders the window, so no
    /// event is missed or delivered twice.
    pub fn catch_up(
        &self,
        subscription: &Subscription,
        after: Revision,
        max: usize,
    ) -> Result<Vec<Arc<Event>>, TooOld> {
        let s = self.state.lock().unwrap();
        let events = s.ring.read(after, max)?;
        if events.is_empty() {
            subscription.rejoin(after);
        }
        self.metrics.replayed.inc_by(events.len() as u64);
        Ok(events)
    }
}

/// A change read from etcd: the new state of a key, or its deletion.
#[derive(Debug)]
pub struct Change {
    pub revision: Revision,
    pub key: Arc<str>,
    /// None for a deletion.
    pub object: Option<Object>,
}

/// The single writer of a [`WatchCache`], owned by its reflector. Applies
/// changes in revision order, then dispatches them outside the cache lock.
pub struct CacheWriter {
    cache: Arc<WatchCache>,
}

/// With its writer gone the cache gets no more changes: its watches end
/// once they have shown what they were sent.
impl Drop for CacheWriter {
    fn drop(&mut self) {
        self.cache.dispatcher.close();
    }
}

impl CacheWriter {
    pub fn cache(&self) -> &Arc<WatchCache> {
        &self.cache
    }

    /// Installs a full list taken at `revision`. The first list makes the
    /// cache ready; a later one (after compaction or a long outage) turns
    /// the difference into events, so watchers continue consistently: each
    /// added or changed object at its own mod revision, each vanished one
    /// deleted at `revision`.
    pub fn replace(&mut self, objects: Vec<Object>, revision: Revision) {
        let new: Store = objects
            .into_iter()
            .map(|o| (o.key.clone(), Arc::new(o)))
            .collect();
        let mut s = self.cache.state.lock().unwrap();
        let positions = self.cache.resource.indexed_positions();
        if !s.ready {
            s.indexes = FieldIndexes::build(&positions, &new);
            s.store = new;
            s.ring.reset(revision);
            s.revision = revision;
            s.ready = true;
            self.publish(&s);
            return;
        }
        let mut events: Vec<Event> = Vec::new();
        for (key, obj) in &new {
            match s.store.get(key) {
                Some(old) if old.revision == obj.revision => {}
                old => events.push(Event {
                    revision: obj.revision,
                    kind: if old.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    object: Some(obj.clone()),
                    prev: old.cloned(),
                }),
            }
        }
        for (key, old) in &s.store {
            if !new.contains_key(key) {
                events.push(Event {
                    revision,
                    kind: EventType::Deleted,
                    object: None,
                    prev: Some(old.clone()),
                });
            }
        }
        events.sort_by(|a, b| (a.revision, a.key()).cmp(&(b.revision, b.key())));
        let events: Vec<Arc<Event>> = events.into_iter().map(Arc::new).collect();
        let now = Instant::now();
        for e in &events {
            s.ring.push(e.clone(), now);
        }
        s.indexes = FieldIndexes::build(&positions, &new);
        s.store = new;
        s.revision = s.revision.max(revision);
        self.publish(&s);
        drop(s);
        self.cache.dispatcher.dispatch(&events);
        self.cache.dispatcher.progress(revision);
    }

    /// Installs the first list, taken at `revision`, with the events that
    /// led to it: the window then covers `(oldest, revision]`, so watches
    /// resume from versions older than the list.
    pub fn replace_with_history(
        &mut self,
        objects: Vec<Object>,
        revision: Revision,
        oldest: Revision,
        history: Vec<Event>,
    ) {
        let store: Store = objects
            .into_iter()
            .map(|o| (o.key.clone(), Arc::new(o)))
            .collect();
        let mut s = self.cache.state.lock().unwrap();
        debug_assert!(!s.ready, "history comes with the first list only");
        s.indexes = FieldIndexes::build(&self.cache.resource.indexed_positions(), &store);
        s.store = store;
        s.ring.reset(oldest);
        let now = Instant::now();
        for e in history {
            s.ring.push(Arc::new(e), now);
        }
        s.revision = revision;
        s.ready = true;
        self.publish(&s);
    }

    /// Applies changes from the watch, in order.
    pub fn apply(&mut self, changes: Vec<Change>) {
        let now = Instant::now();
        let mut events = Vec::with_capacity(changes.len());
        let mut s = self.cache.state.lock().unwrap();
        for c in changes {
            let prev = s.store.get(&c.key).cloned();
            let event = match c.object {
                Some(o) => {
                    let o = Arc::new(o);
                    s.indexes.update(&c.key, prev.as_deref(), Some(&o));
                    s.store.insert(c.key, o.clone());
                    let kind = if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    };
                    Event {
                        revision: c.revision,
                        kind,
                        object: Some(o),
                        prev,
                    }
                }
                None => {
                    // A key the cache never held (its value was not
                    // decodable) has nothing to delete.
                    if prev.is_none() {
                        s.revision = s.revision.max(c.revision);
                        continue;
                    }
                    s.indexes.update(&c.key, prev.as_deref(), None);
                    s.store.remove(&c.key);
                    Event {
                        revision: c.revision,
                        kind: EventType::Deleted,
                        object: None,
                        prev,
                    }
                }
            };
            s.revision = s.revision.max(c.revision);
            let event = Arc::new(event);
            s.ring.push(event.clone(), now);
            events.push(event);
        }
        self.publish(&s);
        drop(s);
        self.cache
            .metrics
            .events_received
            .inc_by(events.len() as u64);
        self.cache.dispatcher.dispatch(&events);
        if let Some(last) = events.last() {
            self.cache.dispatcher.progress(last.revision);
        }
    }

    /// etcd reports that nothing under the prefix changed up to `revision`.
    pub fn progress(&mut self, revision: Revision) {
        let mut s = self.cache.state.lock().unwrap();
        if revision <= s.revision {
            return;
        }
        s.revision = revision;
        self.publish(&s);
        drop(s);
        self.cache.dispatcher.progress(revision);
    }

    pub fn send_due_bookmarks(&self, now: Instant) {
        self.cache.dispatcher.send_due_bookmarks(now);
    }

    fn publish(&self, s: &State) {
        let m = &self.cache.metrics;
        m.cache_objects.set(s.store.len() as i64);
        m.cache_revision.set(s.revision as i64);
        m.window_events.set(s.ring.len() as i64);
        m.window_capacity.set(s.ring.capacity() as i64);
        self.cache.progress.send_replace(Progress {
            revision: s.revision,
            ready: s.ready,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ValueFormat;
    use crate::dispatch::Next;
    use crate::telemetry::Metrics;
    use futures::FutureExt;

    fn resource() -> Arc<Resource> {
        Arc::new(Resource {
            format: ValueFormat::Raw,
            ..Resource::for_tests(&[])
        })
    }

    fn obj(key: &str, revision: Revision) -> Object {
        let r = resource();
        r.decode(key.as_bytes(), revision.to_string().as_bytes(), revision)
            .unwrap()
    }

    fn new_cache() -> (Arc<WatchCache>, CacheWriter) {
        let metrics = Metrics::default().resource("pods");
        let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
        WatchCache::new(resource(), &CacheConfig::default(), d, metrics)
    }

    /// Everything a watcher has to show now, live or from the window.
    fn shown(cache: &WatchCache, w: &mut Watcher) -> Vec<(EventType, String, Revision)> {
        let mut out = Vec::new();
        while let Some(next) = w.next(cache).now_or_never() {
            match next {
                Next::Event(v) => out.push((v.kind, v.object.key.to_string(), v.revision)),
                other => panic!("{other:?}"),
            }
        }
        out
    }

    #[test]
    fn a_relist_turns_the_difference_into_events() {
        let (cache, mut w) = new_cache();
        w.replace(
            vec![
                obj("/p/a/keep", 2),
                obj("/p/a/change", 3),
                obj("/p/a/gone", 4),
            ],
            10,
        );
        let mut live = cache
            .watch(
                &Inbox::solo(),
                Predicate::default(),
                WatchFrom::State,
                false,
            )
            .unwrap()
            .watcher;
        w.replace(
            vec![
                obj("/p/a/keep", 2),
                obj("/p/a/change", 15),
                obj("/p/a/new", 12),
            ],
            20,
        );
        assert_eq!(
            shown(&cache, &mut live),
            [
                (EventType::Added, "/p/a/new".into(), 12),
                (EventType::Modified, "/p/a/change".into(), 15),
                (EventType::Deleted, "/p/a/gone".into(), 20),
            ]
        );
        // The same events are in the window for watchers that resume later.
        let mut start = cache
            .watch(
                &Inbox::solo(),
                Predicate::default(),
                WatchFrom::Revision(12),
                false,
            )
            .unwrap();
        assert!(start.state.is_none());
        let replay: Vec<Revision> = shown(&cache, &mut start.watcher)
            .iter()
            .map(|e| e.2)
            .collect();
        assert_eq!(replay, [15, 20]);
        assert_eq!(
            cache.progress(),
            Progress {
                revision: 20,
                ready: true
            }
        );
    }

    #[test]
    fn deleting_an_unknown_key_emits_nothing_but_advances_the_revision() {
        let (cache, mut w) = new_cache();
        w.replace(vec![], 5);
        let mut watcher = cache
            .watch(
                &Inbox::solo(),
                Predicate::default(),
                WatchFrom::State,
                false,
            )
            .unwrap()
            .watcher;
        w.apply(vec![Change {
            revision: 6,
            key: Arc::from("/p/a/x"),
            object: None,
        }]);
        assert!(shown(&cache, &mut watcher).is_empty());
        assert_eq!(cache.progress().revision, 6);
    }

    #[test]
    fn select_reads_only_the_pinned_range() {
        let (cache, mut w) = new_cache();
        w.replace(
            vec![
                obj("/p/a/x", 2),
                obj("/p/b/x", 3),
                obj("/p/b/y", 4),
                obj("/p/c/x", 5),
            ],
            5,
        );
        let snap = cache.snapshot();
        let r = resource();
        let keys = |p: &Predicate, after: Option<&str>| {
            snap.select(&r, p, after)
                .map(|o| o.key.to_string())
                .collect::<Vec<_>>()
        };
        let ns_b = Predicate::new(&r, "b", "", "", "").unwrap();
        assert_eq!(keys(&ns_b, None), ["/p/b/x", "/p/b/y"]);
        assert_eq!(keys(&ns_b, Some("/p/b/x")), ["/p/b/y"]);
        let one = Predicate::new(&r, "b", "y", "", "").unwrap();
        assert_eq!(keys(&one, None), ["/p/b/y"]);
        assert_eq!(keys(&one, Some("/p/b/y")), Vec::<String>::new());
        assert_eq!(keys(&Predicate::default(), Some("/p/b/y")), ["/p/c/x"]);
    }
}

/// What each watcher receives through the trigger index equals, event for
/// event and type for type, a brute-force filter of the whole history.
#[cfg(test)]
mod model_tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::dispatch::{transition, Next};
    use crate::telemetry::Metrics;
    use futures::FutureExt;

    const NODES: [&str; 4] = ["node-0", "node-1", "node-2", "node-3"];
    const PHASES: [&str; 2] = ["Running", "Pending"];

    fn resource() -> Arc<Resource> {
        let mut r = Resource::for_tests(&["spec.nodeName", "status.phase"]);
        r.indexed_fields = vec!["spec.nodeName".into(), "status.phase".into()];
        Arc::new(r)
    }

    /// A change: which key (of 2 namespaces × 3 names), and the new state
    /// (node, phase, app label, tier label) or a deletion.
    type Step = (usize, Option<(usize, usize, usize, usize)>);

    fn key_of(k: usize) -> (String, String) {
        (format!("ns{}", k % 2), format!("p{}", k / 2))
    }

    fn object(
        r: &Resource,
        k: usize,
        state: (usize, usize, usize, usize),
        revision: Revision,
    ) -> Object {
        let (ns, name) = key_of(k);
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), ["web", "db"][state.2].into());
        if state.3 > 0 {
            labels.insert("tier".into(), ["", "a", "b"][state.3].into());
        }
        let v = serde_json::json!({
            "metadata": {"labels": labels},
            "spec": {"nodeName": NODES[state.0]},
            "status": {"phase": PHASES[state.1]},
        });
        r.decode(
            r.key(&ns, &name).as_bytes(),
            v.to_string().as_bytes(),
            revision,
        )
        .unwrap()
    }

    /// A watcher: when it joins (after how many transactions), from the
    /// state or from how many revisions back, its request, and how many
    /// changes it reads after each transaction (it may fall behind).
    #[derive(Debug, Clone)]
    struct WatcherSpec {
        joins_after: usize,
        replays: Option<u64>,
        namespace: &'static str,
        name: &'static str,
        labels: &'static str,
        fields: String,
        reads: Vec<usize>,
    }

    fn watcher() -> impl Strategy<Value = WatcherSpec> {
        let labels = prop::sample::select(vec![
            "",
            "app=web",
            "app!=web",
            "tier in (a,b)",
            "tier notin (a)",
            "!tier",
            "tier",
        ]);
        let node = prop::option::of(0..NODES.len());
        let phase = prop::option::of((0..PHASES.len(), any::<bool>()));
        let scope = prop::sample::select(vec![("", ""), ("ns0", ""), ("ns1", "p1"), ("", "p0")]);
        let joins = (0..40usize, prop::option::weighted(0.3, 0..8u64));
        let reads = prop::collection::vec(0..4usize, 40);
        (joins, scope, labels, node, phase, reads).prop_map(
            |((joins_after, replays), (namespace, name), labels, node, phase, reads)| {
                let mut fields = Vec::new();
                if let Some(n) = node {
                    fields.push(format!("spec.nodeName={}", NODES[n]));
                }
                if let Some((p, eq)) = phase {
                    fields.push(format!(
                        "status.phase{}{}",
                        if eq { "=" } else { "!=" },
                        PHASES[p]
                    ));
                }
                WatcherSpec {
                    joins_after,
                    replays,
                    namespace,
                    name,
                    labels,
                    fields: fields.join(","),
                    reads,
                }
            },
        )
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0..6usize,
            prop::option::weighted(0.8, (0..NODES.len(), 0..PHASES.len(), 0..2usize, 0..3usize)),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn trigger_index_dispatch_equals_brute_force(
            steps in prop::collection::vec((step(), prop::bool::weighted(0.3)), 1..40),
            watchers in prop::collection::vec(watcher(), 1..12),
            queue in 2..6usize,
        ) {
            let r = resource();
            let metrics = Metrics::default().resource("pods");
            // Small queues, so watchers that read slowly fall behind, read
            // the window and rejoin, again and again.
            let d = Dispatcher::new(queue, Duration::from_secs(3600), metrics.clone());
            let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
            writer.replace(vec![], 1);

            // Steps on distinct keys may share a revision (a transaction).
            let mut txns: Vec<Vec<Step>> = Vec::new();
            for (step, joins_previous) in steps {
                match txns.last_mut() {
                    Some(t) if joins_previous && t.iter().all(|s| s.0 != step.0) => t.push(step),
                    _ => txns.push(vec![step]),
                }
            }

            let mut model: BTreeMap<Arc<str>, Arc<Object>> = BTreeMap::new();
            let mut history: Vec<Event> = Vec::new();
            let mut subs = Vec::new();
            let mut states = vec![(1, model.clone())];
            for (i, txn) in txns.iter().enumerate() {
                for w in watchers.iter().filter(|w| w.joins_after == i) {
                    let p = Predicate::new(&r, w.namespace, w.name, w.labels, &w.fields).unwrap();
                    let now = cache.progress().revision;
                    let from = match w.replays {
                        Some(back) => WatchFrom::Revision(now.saturating_sub(back).max(1)),
                        None => WatchFrom::State,
                    };
                    let watcher = cache.watch(&Inbox::solo(), p.clone(), from, false).unwrap().watcher;
                    subs.push((p, watcher.revision(), watcher, &w.reads, Vec::new()));
                }
                let revision = i as Revision + 2;
                let mut changes = Vec::new();
                for (k, state) in txn {
                    let (ns, name) = key_of(*k);
                    let key: Arc<str> = Arc::from(r.key(&ns, &name));
                    let object = state.map(|s| object(&r, *k, s, revision));
                    let prev = model.get(&key).cloned();
                    match &object {
                        Some(o) => {
                            model.insert(key.clone(), Arc::new(o.clone()));
                            let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
                            history.push(Event { revision, kind, object: Some(Arc::new(o.clone())), prev });
                        }
                        None if prev.is_some() => {
                            model.remove(&key);
                            history.push(Event { revision, kind: EventType::Deleted, object: None, prev });
                        }
                        None => {}
                    }
                    changes.push(Change { revision, key, object });
                }
                writer.apply(changes);
                states.push((revision, model.clone()));
                for (_, _, watcher, reads, got) in &mut subs {
                    for _ in 0..reads[i] {
                        match watcher.next(&cache).now_or_never() {
                            Some(Next::Event(v)) => got.push((v.kind, (*v.object).clone(), v.revision)),
                            None => break,
                            Some(other) => panic!("{other:?}"),
                        }
                    }
                }
            }

            // The state at every past revision is rebuilt exactly.
            for (revision, state) in &states {
                let at = cache.snapshot_at(*revision).unwrap();
                let got: Vec<(&str, &Object)> = at.store.iter().map(|(k, o)| (&**k, &**o)).collect();
                let want: Vec<(&str, &Object)> = state.iter().map(|(k, o)| (&**k, &**o)).collect();
                prop_assert_eq!(got, want, "state at {}", revision);
                for (p, ..) in &subs {
                    let listed: Vec<&str> = at.select(&r, p, None).map(|o| &*o.key).collect();
                    let scanned: Vec<&str> = state.values().filter(|o| p.matches(o)).map(|o| &*o.key).collect();
                    prop_assert_eq!(listed, scanned, "indexed list at {}", revision);
                }
            }

            // Lists read through the indexes equal a scan of the model,
            // whole and from after each key.
            let snapshot = cache.snapshot();
            for (p, ..) in &subs {
                let all: Vec<&str> = model.values().filter(|o| p.matches(o)).map(|o| &*o.key).collect();
                let listed: Vec<&str> = snapshot.select(&r, p, None).map(|o| &*o.key).collect();
                prop_assert_eq!(&listed, &all, "list {:?}", p);
                for after in model.keys() {
                    let rest: Vec<&str> = all.iter().copied().filter(|k| *k > &**after).collect();
                    let page: Vec<&str> = snapshot.select(&r, p, Some(after)).map(|o| &*o.key).collect();
                    prop_assert_eq!(page, rest, "list {:?} after {}", p, after);
                }
            }

            for (p, from, mut watcher, _, mut got) in subs {
                let want: Vec<(EventType, Object, Revision)> = history
                    .iter()
                    .filter(|e| e.revision > from)
                    .filter_map(|e| transition(&p, e).map(|(t, o)| (t, (*o).clone(), e.revision)))
                    .collect();
                while let Some(next) = watcher.next(&cache).now_or_never() {
                    let Next::Event(v) = next else { panic!("{next:?}") };
                    got.push((v.kind, (*v.object).clone(), v.revision));
                }
                prop_assert_eq!(got, want, "watcher {:?}", p);
            }
        }
    }
}
