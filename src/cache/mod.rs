//! The watch cache of one resource: the current objects, the window of
//! recent events, and the revision they are caught up to.

mod index;
pub mod ring;

use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imbl::OrdMap;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::dispatch::{Dispatcher, Subscription, Trigger};
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

/// What a new watcher sends before live changes.
pub enum Initial {
    State(Snapshot),
    Replay(Vec<Arc<Event>>),
}

pub struct WatchStart {
    pub initial: Initial,
    /// The revision live delivery continues from.
    pub revision: Revision,
    pub subscription: Subscription,
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

    pub fn watchers(&self) -> usize {
        self.dispatcher.len()
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

    /// Registers a watcher. Capturing its starting point and registering
    /// happen under one lock, so no event falls between them.
    pub fn watch(
        &self,
        predicate: Predicate,
        from: WatchFrom,
        bookmarks: bool,
    ) -> Result<WatchStart, TooOld> {
        let s = self.state.lock().unwrap();
        let initial = match from {
            WatchFrom::State => Initial::State(Snapshot {
                store: s.store.clone(),
                indexes: s.indexes.clone(),
                revision: s.revision,
            }),
            WatchFrom::Revision(r) => Initial::Replay(s.ring.since(r)?),
        };
        let trigger = self.trigger(&predicate, &s.indexes);
        let subscription = self
            .dispatcher
            .register(predicate, trigger, s.revision, bookmarks);
        Ok(WatchStart {
            initial,
            revision: s.revision,
            subscription,
        })
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
    use crate::dispatch::Delivery;
    use crate::telemetry::Metrics;

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

    fn drain(sub: &mut Subscription) -> Vec<(EventType, String, Revision)> {
        let mut out = Vec::new();
        while let Ok(d) = sub.rx.try_recv() {
            if let Delivery::Event {
                kind,
                object,
                revision,
            } = d
            {
                out.push((kind, object.key.to_string(), revision));
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
        let mut sub = cache
            .watch(Predicate::default(), WatchFrom::Revision(10), false)
            .unwrap()
            .subscription;
        w.replace(
            vec![
                obj("/p/a/keep", 2),
                obj("/p/a/change", 15),
                obj("/p/a/new", 12),
            ],
            20,
        );
        assert_eq!(
            drain(&mut sub),
            [
                (EventType::Added, "/p/a/new".into(), 12),
                (EventType::Modified, "/p/a/change".into(), 15),
                (EventType::Deleted, "/p/a/gone".into(), 20),
            ]
        );
        // The same events are in the window for watchers that resume later.
        let replay = match cache
            .watch(Predicate::default(), WatchFrom::Revision(12), false)
            .unwrap()
            .initial
        {
            Initial::Replay(events) => events.iter().map(|e| e.revision).collect::<Vec<_>>(),
            Initial::State(_) => panic!("want replay"),
        };
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
        let mut sub = cache
            .watch(Predicate::default(), WatchFrom::State, false)
            .unwrap()
            .subscription;
        w.apply(vec![Change {
            revision: 6,
            key: Arc::from("/p/a/x"),
            object: None,
        }]);
        assert!(drain(&mut sub).is_empty());
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
