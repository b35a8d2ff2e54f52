//! The model the relist path is proven against: etcd under one prefix,
//! the watchproxy in front of it, its clients and an edge following it.

use crate::api::wire::{encode_bookmark, encode_event};
use crate::cache::{CacheWriter, Change, WatchCache, WatchFrom};
use crate::config::CacheConfig;
use crate::dispatch::{Dispatcher, Inbox, Next, Watcher};
use crate::object::{Event, Object, Resource, Revision};
use crate::pb;
use crate::selector::Predicate;
use crate::telemetry::Metrics;
use futures::FutureExt;
use proptest::prelude::*;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Each key's value and mod revision.
pub(super) type State = BTreeMap<String, (Vec<u8>, Revision)>;

pub(super) const KEYS: usize = 5;

pub(super) fn resource() -> Arc<Resource> {
    Arc::new(Resource::raw_for_tests())
}

pub(super) fn key(k: usize) -> String {
    format!("/p/ns/k{k}")
}

/// etcd under the prefix: every change, and how far it compacted.
pub(super) struct Etcd {
    pub(super) revision: Revision,
    pub(super) changes: Vec<(Revision, String, Option<Vec<u8>>)>,
    pub(super) compacted: Revision,
}

/// etcd starts at revision 1.
impl Default for Etcd {
    fn default() -> Self {
        Etcd {
            revision: 1,
            changes: Vec::new(),
            compacted: 0,
        }
    }
}

impl Etcd {
    pub(super) fn state_at(&self, at: Revision) -> State {
        let mut state = State::new();
        for (revision, key, value) in self.changes.iter().take_while(|c| c.0 <= at) {
            match value {
                Some(v) => state.insert(key.clone(), (v.clone(), *revision)),
                None => state.remove(key),
            };
        }
        state
    }

    /// Writes (or deletes) a key; none when a deletion finds nothing.
    pub(super) fn write(&mut self, k: usize, value: Option<u8>) {
        let key = key(k);
        if value.is_none() && !self.state_at(self.revision).contains_key(&key) {
            return;
        }
        self.revision += 1;
        let value = value.map(|v| format!("v{v}@{}", self.revision).into_bytes());
        self.changes.push((self.revision, key, value));
    }

    pub(super) fn objects(&self, r: &Resource, at: Revision) -> Vec<Object> {
        (self.state_at(at).iter())
            .map(|(k, (v, rev))| r.decode(k.as_bytes(), v, *rev).unwrap())
            .collect()
    }

    /// The changes after `after`, as a reflector reads them.
    pub(super) fn changes_after(&self, r: &Resource, after: Revision) -> Vec<Change> {
        (self.changes.iter().filter(|c| c.0 > after))
            .map(|(revision, key, value)| Change {
                revision: *revision,
                key: Arc::from(key.as_str()),
                object: value
                    .as_ref()
                    .map(|v| r.decode(key.as_bytes(), v, *revision).unwrap()),
            })
            .collect()
    }

    /// The events of `(oldest, through]`, as a restart reads them.
    pub(super) fn events(&self, r: &Resource, oldest: Revision, through: Revision) -> Vec<Event> {
        let mut state = self.state_at(oldest);
        let decode = |k: &str, (v, rev): &(Vec<u8>, Revision)| {
            Arc::new(r.decode(k.as_bytes(), v, *rev).unwrap())
        };
        let mut events = Vec::new();
        for (revision, key, value) in self
            .changes
            .iter()
            .filter(|c| c.0 > oldest && c.0 <= through)
        {
            let prev = state.get(key).map(|p| decode(key, p));
            let now = value.as_ref().map(|v| (v.clone(), *revision));
            let object = now.as_ref().map(|n| decode(key, n));
            events.extend(Event::between(*revision, prev, object));
            match now {
                Some(n) => state.insert(key.clone(), n),
                None => state.remove(key),
            };
        }
        events
    }
}

/// The watchproxy in front of etcd: its cache, fed by the model's
/// reflector.
pub(super) struct Core {
    pub(super) cache: Arc<WatchCache>,
    pub(super) writer: CacheWriter,
    pub(super) connected: bool,
    /// The last etcd revision it applied.
    pub(super) at: Revision,
    /// The ranges `(S, L)` whose history it lost (resumes inside them are
    /// refused).
    pub(super) lost: Vec<(Revision, Revision)>,
    /// The oldest version it can resume from.
    pub(super) oldest: Revision,
}

impl Core {
    /// Starts on etcd, with up to `depth` revisions of history.
    pub(super) fn start(r: &Arc<Resource>, etcd: &Etcd, depth: u64) -> Core {
        let metrics = Metrics::default().resource("pods");
        let d = Dispatcher::new(4, Duration::from_secs(3600), metrics.clone());
        let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
        let now = etcd.revision;
        let oldest = now.saturating_sub(depth).max(etcd.compacted);
        let history = etcd.events(r, oldest, now);
        let objects = etcd.objects(r, now);
        (writer.replace_with_history(objects, now, now, oldest, now, history)).unwrap();
        Core {
            cache,
            writer,
            connected: true,
            at: now,
            lost: Vec::new(),
            oldest,
        }
    }

    /// Takes what etcd has, when connected: the changes since its
    /// revision, or a list when their history is compacted.
    pub(super) fn sync(&mut self, r: &Resource, etcd: &Etcd) {
        if !self.connected || self.at == etcd.revision {
            return;
        }
        if etcd.compacted > self.at {
            let objects = etcd.objects(r, etcd.revision);
            self.writer.replace(objects, etcd.revision).unwrap();
            self.lost.push((self.at, etcd.revision));
        } else {
            self.writer.apply(etcd.changes_after(r, self.at)).unwrap();
            // etcd's progress notification.
            self.writer.progress(etcd.revision);
        }
        self.at = etcd.revision;
    }

    /// Whether a resume from `from` must be refused.
    pub(super) fn refuses(&self, from: Revision) -> bool {
        from < self.oldest || self.lost.iter().any(|&(s, l)| s < from && from < l)
    }
}

/// A client: the state it holds from what it was sent, and where it
/// resumes from.
pub(super) struct Client {
    pub(super) watcher: Option<Watcher>,
    pub(super) state: State,
    pub(super) resume: Revision,
    pub(super) reads: Vec<usize>,
}

impl Client {
    /// Watches the core from `from` (none: from its state); a refused
    /// resume lists again.
    pub(super) fn join(
        core: &Core,
        from: Option<Revision>,
        reads: Vec<usize>,
        etcd: &Etcd,
    ) -> Client {
        let mut c = Client {
            watcher: None,
            state: State::new(),
            resume: 0,
            reads,
        };
        match from {
            Some(from) => c.resume_on(core, from, etcd),
            None => c.relist(core),
        }
        c
    }

    pub(super) fn relist(&mut self, core: &Core) {
        let all = Predicate::new(&core.cache.resource, "", "", "", "").unwrap();
        let start = (core
            .cache
            .watch(&Inbox::solo(), all, WatchFrom::State, true))
        .unwrap();
        let snapshot = start.state.expect("a watch from the state has it");
        self.state = (snapshot.store.iter())
            .map(|o| (o.key().to_owned(), (o.value().to_vec(), o.revision)))
            .collect();
        self.resume = start.watcher.revision();
        self.watcher = Some(start.watcher);
    }

    /// Resumes from `from` with the state it holds (a new client: etcd's at
    /// `from`), or lists again where the core refuses.
    pub(super) fn resume_on(&mut self, core: &Core, from: Revision, etcd: &Etcd) {
        let all = Predicate::new(&core.cache.resource, "", "", "", "").unwrap();
        match core
            .cache
            .watch(&Inbox::solo(), all, WatchFrom::Revision(from), true)
        {
            Ok(start) => {
                assert!(
                    !core.refuses(from),
                    "a resume from {from} inside lost history"
                );
                if self.watcher.is_none() && self.state.is_empty() {
                    self.state = etcd.state_at(from);
                }
                self.resume = from;
                self.watcher = Some(start.watcher);
            }
            Err(_) => {
                assert!(core.refuses(from), "a resume from {from} refused");
                self.relist(core);
            }
        }
    }

    /// Reads up to `n` things the watcher has to show, each as the wire
    /// shows it, checking unmarked changes against etcd's history.
    pub(super) fn read(&mut self, core: &Core, etcd: &Etcd, n: usize) -> Result<(), TestCaseError> {
        for _ in 0..n {
            let Some(watcher) = &mut self.watcher else {
                return Ok(());
            };
            let Some(next) = watcher.next(&core.cache).now_or_never() else {
                return Ok(());
            };
            match next {
                Next::Event(v) => {
                    let wire = encode_event(v.kind, &v.object, v.revision, v.resync_from);
                    let e = pb::WatchEvent::decode(wire.to_bytes()).unwrap();
                    let o = e.object.unwrap();
                    let version: Revision = o.resource_version.parse().unwrap();
                    prop_assert_eq!(e.resync, v.resync_from.is_some());
                    if !e.resync {
                        // A change of etcd's history, at its revision.
                        let at = etcd.state_at(version);
                        let deleted = e.r#type == pb::EventType::Deleted as i32;
                        prop_assert_eq!(deleted, !at.contains_key(&o.key), "{:?}", o);
                        if !deleted {
                            prop_assert_eq!(&at[&o.key], &(o.value.to_vec(), version));
                        }
                    }
                    match e.r#type == pb::EventType::Deleted as i32 {
                        true => self.state.remove(&o.key),
                        false => self.state.insert(o.key, (o.value.to_vec(), version)),
                    };
                    self.resume = e.resume_resource_version.parse().unwrap();
                }
                Next::ResyncEnd(listed) => {
                    let e = pb::WatchEvent::decode(encode_bookmark(listed, false, true).to_bytes());
                    self.resume = e.unwrap().resume_resource_version.parse().unwrap();
                    prop_assert_eq!(
                        &self.state,
                        &etcd.state_at(listed),
                        "after a resync to {}",
                        listed
                    );
                }
                Next::Bookmark(at) => self.resume = at,
                Next::Expired { .. } => self.relist(core),
                Next::Closed => self.watcher = None,
            }
        }
        Ok(())
    }
}

/// Another watchproxy following the core, as a tier does: changes applied,
/// a resync's events passed over and the core listed again at its end.
pub(super) struct Edge {
    pub(super) cache: Arc<WatchCache>,
    pub(super) writer: CacheWriter,
    pub(super) feed: Option<Watcher>,
}

impl Edge {
    /// Starts as a tier does: lists the core at a version up to `depth`
    /// back, as far as its window reaches, then follows it from there.
    pub(super) fn start(r: &Arc<Resource>, core: &Core, depth: u64) -> Edge {
        let metrics = Metrics::default().resource("edge");
        let d = Dispatcher::new(4, Duration::from_secs(3600), metrics.clone());
        let (cache, writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
        let mut edge = Edge {
            cache,
            writer,
            feed: None,
        };
        let now = core.cache.progress().valid_through;
        let from = match now.saturating_sub(depth).max(core.oldest) {
            from if core.refuses(from) || from > core.cache.progress().revision => now,
            from => from,
        };
        let snapshot = core.cache.snapshot_at(from).unwrap();
        let objects = snapshot.store.iter().map(|o| (*o.0).clone()).collect();
        // A past state has no newest change: the objects are the core's at
        // `from`.
        (edge.writer).replace_changed(objects, from, from).unwrap();
        edge.follow(core, from);
        edge
    }

    pub(super) fn relist(&mut self, core: &Core) {
        let snapshot = core.cache.snapshot();
        let objects = snapshot.store.iter().map(|o| (*o.0).clone()).collect();
        (self.writer)
            .replace_changed(objects, snapshot.revision, snapshot.changed)
            .unwrap();
        self.follow(core, snapshot.revision);
    }

    /// Watches the core after `after`, or lists it again where it refuses.
    pub(super) fn follow(&mut self, core: &Core, after: Revision) {
        let all = Predicate::new(&core.cache.resource, "", "", "", "").unwrap();
        match core
            .cache
            .watch(&Inbox::solo(), all, WatchFrom::Revision(after), true)
        {
            Ok(start) => self.feed = Some(start.watcher),
            Err(_) => self.relist(core),
        }
    }

    pub(super) fn read(&mut self, core: &Core, n: usize) {
        for _ in 0..n {
            let Some(feed) = &mut self.feed else { return };
            let Some(next) = feed.next(&core.cache).now_or_never() else {
                return;
            };
            match next {
                Next::Event(v) if v.resync_from.is_none() => {
                    let deleted = v.kind == crate::object::EventType::Deleted;
                    let change = Change {
                        revision: v.revision,
                        key: Arc::from(v.object.key()),
                        object: (!deleted).then(|| (*v.object).clone()),
                    };
                    self.writer.apply(vec![change]).unwrap();
                }
                Next::Event(_) => {}
                Next::ResyncEnd(_) | Next::Expired { .. } => self.relist(core),
                Next::Bookmark(at) => self.writer.progress(at),
                Next::Closed => self.feed = None,
            }
        }
    }
}
