//! The single writer of a watch cache: changes in revision order into the
//! store and the event window, then to the dispatcher outside the lock.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Digest, FieldIndexes, OverBudget, Progress, State, Store, Stored, WatchCache};
use crate::config::OnHistoryLost;
use crate::object::{Event, Object, Revision};

/// A change read from etcd: the new state of a key, or its deletion.
#[derive(Debug)]
pub struct Change {
    pub revision: Revision,
    pub key: Arc<str>,
    /// None for a deletion.
    pub object: Option<Object>,
}

impl Change {
    /// `object` written, at its own revision.
    pub fn put(object: Object) -> Self {
        Self {
            revision: object.revision,
            key: object.key().into(),
            object: Some(object),
        }
    }
}

/// The single writer of a [`WatchCache`], owned by its reflector. Applies
/// changes in revision order, then dispatches them outside the cache lock.
pub struct CacheWriter {
    pub(super) cache: Arc<WatchCache>,
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
    /// cache ready. A later one comes when etcd's history since the cache's
    /// revision is gone (compacted during an outage): by default the
    /// difference becomes a resync, events at `revision` that resume from
    /// the old revision and are marked, closed by a marked bookmark, so
    /// watchers go on
    /// with the right state and know the history in between is lost;
    /// with [`OnHistoryLost::End`], the window restarts at `revision` and
    /// every watch ends with OUT_OF_RANGE.
    ///
    /// A list whose objects alone exceed the resource's `max_bytes` is
    /// refused, and a ready cache gives up what it holds (see
    /// [`CacheWriter::apply`]).
    pub fn replace(&mut self, objects: Vec<Object>, revision: Revision) -> Result<(), OverBudget> {
        self.replace_changed(objects, revision, revision)
    }

    /// [`CacheWriter::replace`] with a list whose newest change is at
    /// `changed` (an upstream watchproxy's list says so; etcd's is taken
    /// at its revision).
    pub fn replace_changed(
        &mut self,
        objects: Vec<Object>,
        revision: Revision,
        changed: Revision,
    ) -> Result<(), OverBudget> {
        let bytes = self.within_budget(&objects)?;
        let (new, indexes) = build(objects, &self.cache.resource.indexed_positions());
        let digest = Digest::of(new.iter().map(|o| &*o.0));
        let mut s = self.cache.state.lock();
        s.bytes = bytes;
        s.over_budget = None;
        s.digest = digest;
        if !s.ready {
            s.indexes = indexes;
            s.store = new;
            s.ring.reset(revision);
            s.revision = revision;
            s.valid_through = revision;
            s.changed = changed;
            s.ready = true;
            self.publish(&s);
            return Ok(());
        }
        let from = s.revision;
        // A list older than the cache (etcd restored from a backup) has no
        // difference to show in order: the watches end.
        let end = self.cache.on_history_lost == OnHistoryLost::End || revision <= from;
        let revision = revision.max(from);
        let mut events: Vec<Arc<Event>> = Vec::new();
        if !end {
            let mut diff: Vec<Event> = Vec::new();
            for obj in &new {
                let old = s.store.get(obj.key_bytes());
                if old.is_none_or(|old| old.revision != obj.revision) {
                    let old = old.map(|o| o.0.clone());
                    diff.extend(Event::between(revision, old, Some(obj.0.clone())));
                }
            }
            for old in &s.store {
                if !new.contains(old.key_bytes()) {
                    diff.push(Event::deleted(revision, old.0.clone()));
                }
            }
            diff.sort_by(|a, b| a.key().cmp(b.key()));
            events = diff
                .into_iter()
                .map(|e| Arc::new(e.in_resync(from)))
                .collect();
            let now = Instant::now();
            for e in &events {
                s.ring.push(e.clone(), now);
            }
            s.ring.lose(from, revision);
        } else {
            s.ring.reset(revision);
        }
        s.indexes = indexes;
        s.store = new;
        s.revision = revision;
        s.valid_through = revision;
        s.changed = match end || !events.is_empty() {
            true => revision,
            false => changed.min(revision),
        };
        self.shed(&mut s);
        self.publish(&s);
        drop(s);
        self.cache.dispatcher.dispatch(&events);
        self.cache.dispatcher.history_lost(revision, end);
        Ok(())
    }

    /// Installs the first list, taken at `listed`, with the events that
    /// led to it: the window then covers `(oldest, through]`, so watches
    /// resume from versions older than the list. History read up to
    /// `through` < `listed` holds when etcd proved its objects the same at
    /// both: the cache stands at `through`, and the watch delivers what
    /// came and went in between. `changed` is the list's newest change, as
    /// in [`CacheWriter::replace_changed`].
    pub fn replace_with_history(
        &mut self,
        objects: Vec<Object>,
        listed: Revision,
        changed: Revision,
        oldest: Revision,
        through: Revision,
        history: Vec<Event>,
    ) -> Result<(), OverBudget> {
        let bytes = self.within_budget(&objects)?;
        let (store, indexes) = build(objects, &self.cache.resource.indexed_positions());
        let digest = Digest::of(store.iter().map(|o| &*o.0));
        let mut s = self.cache.state.lock();
        debug_assert!(!s.ready, "history comes with the first list only");
        s.bytes = bytes;
        s.digest = digest;
        s.over_budget = None;
        s.indexes = indexes;
        s.store = store;
        s.ring.reset(oldest);
        let now = Instant::now();
        for e in history {
            s.ring.push(Arc::new(e), now);
        }
        s.revision = through.min(listed);
        s.valid_through = listed;
        s.changed = changed;
        s.ready = true;
        self.shed(&mut s);
        self.publish(&s);
        Ok(())
    }

    /// Applies changes from the watch, in order.
    ///
    /// Within the resource's `max_bytes`: when the objects and the window
    /// together exceed it, the window's oldest events go first, below its
    /// lower bound; when the objects alone do, the cache gives up all it
    /// holds and stops serving: every watch ends (OUT_OF_RANGE, as for a
    /// version that left the window) and reads are refused (UNAVAILABLE,
    /// OVER_BUDGET) until a list fits again.
    pub fn apply(&mut self, changes: Vec<Change>) -> Result<(), OverBudget> {
        let now = Instant::now();
        let mut events = Vec::with_capacity(changes.len());
        let mut s = self.cache.state.lock();
        for c in changes {
            let prev = s.store.get(c.key.as_bytes()).map(|o| o.0.clone());
            let object = c.object.map(Arc::new);
            s.revision = s.revision.max(c.revision);
            // A key the cache never held (its value was not decodable) has
            // nothing to delete.
            let Some(event) = Event::between(c.revision, prev, object) else {
                continue;
            };
            s.changed = s.changed.max(c.revision);
            s.bytes += event.object().map_or(0, |o| o.cost());
            s.bytes -= event.prev().map_or(0, |o| o.cost());
            s.indexes.update(event.prev(), event.object());
            if let Some(p) = event.prev() {
                s.digest.remove(p);
            }
            if let Some(o) = event.object() {
                s.digest.add(o);
            }
            match event.object() {
                Some(o) => s.store.insert(Stored(o.clone())),
                None => s.store.remove(c.key.as_bytes()),
            };
            let event = Arc::new(event);
            s.ring.push(event.clone(), now);
            events.push(event);
        }
        // What the events changed is known to be etcd's only at their
        // revision.
        if !events.is_empty() {
            s.valid_through = s.revision;
        }
        s.valid_through = s.valid_through.max(s.revision);
        if let Some(over) = self.shed(&mut s) {
            drop(s);
            self.refuse(over);
            return Err(over);
        }
        self.publish(&s);
        drop(s);
        self.cache
            .metrics
            .events_received
            .inc_by(events.len() as u64);
        self.cache
            .dispatcher
            .dispatch_received(&events, now.into_std());
        if let Some(last) = events.last() {
            self.cache.dispatcher.progress(last.revision);
        }
        Ok(())
    }

    /// etcd reports that nothing under the prefix changed up to `revision`.
    pub fn progress(&mut self, revision: Revision) {
        let mut s = self.cache.state.lock();
        if revision <= s.revision {
            return;
        }
        s.revision = revision;
        s.valid_through = s.valid_through.max(revision);
        self.publish(&s);
        drop(s);
        self.cache.dispatcher.progress(revision);
    }

    /// Records that the objects do not fit the budget: a ready cache gives
    /// up all it holds, and its watches end.
    pub fn refuse(&mut self, over: OverBudget) {
        let mut s = self.cache.state.lock();
        s.over_budget = Some(over);
        if !s.ready {
            self.publish(&s);
            return;
        }
        let end = s.revision + 1;
        s.store = Store::new();
        s.indexes = FieldIndexes::new(&self.cache.resource.indexed_positions());
        s.digest = Digest::default();
        s.bytes = 0;
        s.ring.reset(end);
        s.ready = false;
        self.publish(&s);
        drop(s);
        self.cache.past.lock().clear();
        tracing::error!(
            resource = %self.cache.resource.name,
            bytes = over.bytes,
            budget = over.budget,
            "the objects alone exceed max_bytes: the cache gives them up and serves nothing until a list fits"
        );
        self.cache.dispatcher.history_lost(end, true);
    }

    /// What `objects` cost, when that is within the budget; refused
    /// otherwise.
    fn within_budget(&mut self, objects: &[Object]) -> Result<u64, OverBudget> {
        let bytes = objects.iter().map(Object::cost).sum();
        match self.cache.resource.max_bytes {
            Some(budget) if bytes > budget => {
                let over = OverBudget { bytes, budget };
                self.refuse(over);
                Err(over)
            }
            _ => Ok(bytes),
        }
    }

    /// Sheds the window's oldest events while the cache exceeds its
    /// budget; the budget the objects alone exceed, if they do.
    fn shed(&self, s: &mut State) -> Option<OverBudget> {
        let budget = self.cache.resource.max_bytes?;
        if s.bytes + s.ring.bytes() <= budget {
            return None;
        }
        let shed = s.ring.shed(budget.saturating_sub(s.bytes));
        self.cache.metrics.window_shed.inc_by(shed as u64);
        (s.bytes > budget).then_some(OverBudget {
            bytes: s.bytes,
            budget,
        })
    }

    fn publish(&self, s: &State) {
        let m = &self.cache.metrics;
        m.cache_bytes.set(s.bytes as i64);
        m.cache_max_bytes
            .set(self.cache.resource.max_bytes.unwrap_or(0) as i64);
        m.window_bytes.set(s.ring.bytes() as i64);
        m.over_budget.set(i64::from(s.over_budget.is_some()));
        m.cache_objects.set(s.store.len() as i64);
        m.cache_revision.set(s.revision as i64);
        m.window_events.set(s.ring.len() as i64);
        m.window_capacity.set(s.ring.capacity() as i64);
        self.cache.progress.send_replace(Progress {
            revision: s.revision,
            valid_through: s.valid_through,
            ready: s.ready,
        });
    }
}

/// The store and indexes of a list, built side by side on two threads: by
/// the end of a list both cores are free, and the cache serves nothing
/// before both are in.
fn build(objects: Vec<Object>, positions: &[usize]) -> (Store, FieldIndexes) {
    let objects: Vec<Arc<Object>> = objects.into_iter().map(Arc::new).collect();
    let store = || -> Store { objects.iter().map(|o| Stored(o.clone())).collect() };
    if positions.is_empty() {
        return (store(), FieldIndexes::new(positions));
    }
    std::thread::scope(|t| {
        let indexes = t.spawn(|| FieldIndexes::build(positions, &objects));
        let store = store();
        (
            store,
            indexes.join().expect("building an index does not panic"),
        )
    })
}
