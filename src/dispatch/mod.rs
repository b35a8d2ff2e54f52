//! Fan-out: hands each event to every interested watcher's bounded queue,
//! rewriting its type per watcher, and sends periodic bookmarks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rand::Rng;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use crate::object::{Event, EventType, Object, Revision};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;

/// What a watcher's queue carries.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// A change as this watcher sees it: DELETED carries the last state the
    /// watcher was shown, stamped with `revision`.
    Event {
        kind: EventType,
        object: Arc<Object>,
        revision: Revision,
    },
    /// Progress with nothing to show: the watcher has seen everything up to
    /// this revision.
    Bookmark(Revision),
}

/// Why the dispatcher stopped feeding a watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The queue was full. Everything up to `resume_from` has been queued,
    /// so a watch from it continues without loss.
    Slow { resume_from: Revision },
}

/// How an event looks to a watcher with predicate `p`: starts matching is
/// ADDED, keeps matching is MODIFIED, stops matching is DELETED (with the
/// previous state), never matched is nothing.
pub fn transition(p: &Predicate, event: &Event) -> Option<(EventType, Arc<Object>)> {
    let now = event.object.as_ref().filter(|o| p.matches(o));
    let before = event.prev.as_ref().filter(|o| p.matches(o));
    match (now, before) {
        (Some(o), Some(_)) => Some((EventType::Modified, o.clone())),
        (Some(o), None) => Some((EventType::Added, o.clone())),
        (None, Some(prev)) => Some((EventType::Deleted, prev.clone())),
        (None, None) => None,
    }
}

struct Entry {
    predicate: Predicate,
    /// Events at or before this revision are already in the watcher's
    /// initial state or replay.
    start: Revision,
    tx: mpsc::Sender<Delivery>,
    next_bookmark: Option<Instant>,
    ended: Arc<OnceLock<Ended>>,
}

struct Watchers {
    next_id: u64,
    by_id: HashMap<u64, Entry>,
    /// The newest revision dispatched (events or progress); bookmarks carry it.
    revision: Revision,
}

/// The watchers of one resource.
///
/// Events are dispatched by the single cache writer, in revision order. The
/// lock is held while queueing to every watcher: `try_send` never waits, and
/// holding it is what orders registration against dispatch (a watcher
/// registered at revision R is in the set before any event after R is
/// dispatched).
pub struct Dispatcher {
    watchers: Mutex<Watchers>,
    queue_len: usize,
    bookmark_interval: Duration,
    metrics: ResourceMetrics,
}

/// A registered watcher's receiving end; dropping it unregisters.
pub struct Subscription {
    id: u64,
    pub rx: mpsc::Receiver<Delivery>,
    ended: Arc<OnceLock<Ended>>,
    dispatcher: Arc<Dispatcher>,
}

impl Subscription {
    /// Why the queue was closed, once `rx` has returned `None`.
    pub fn ended(&self) -> Option<Ended> {
        self.ended.get().copied()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.dispatcher.remove(self.id);
    }
}

impl Dispatcher {
    pub fn new(queue_len: usize, bookmark_interval: Duration, metrics: ResourceMetrics) -> Self {
        Self {
            watchers: Mutex::new(Watchers {
                next_id: 0,
                by_id: HashMap::new(),
                revision: 0,
            }),
            queue_len,
            bookmark_interval,
            metrics,
        }
    }

    /// Adds a watcher that receives events after `start`.
    pub fn register(
        self: &Arc<Self>,
        predicate: Predicate,
        start: Revision,
        bookmarks: bool,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(self.queue_len);
        let ended = Arc::new(OnceLock::new());
        let next_bookmark = bookmarks.then(|| self.next_bookmark(Instant::now()));
        let mut w = self.watchers.lock().unwrap();
        let id = w.next_id;
        w.next_id += 1;
        w.by_id.insert(
            id,
            Entry {
                predicate,
                start,
                tx,
                next_bookmark,
                ended: ended.clone(),
            },
        );
        self.metrics.watchers.set(w.by_id.len() as i64);
        drop(w);
        Subscription {
            id,
            rx,
            ended,
            dispatcher: self.clone(),
        }
    }

    fn remove(&self, id: u64) {
        let mut w = self.watchers.lock().unwrap();
        w.by_id.remove(&id);
        self.metrics.watchers.set(w.by_id.len() as i64);
    }

    pub fn len(&self) -> usize {
        self.watchers.lock().unwrap().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `events` (in revision order) to every watcher they concern. A
    /// watcher whose queue is full is ended as slow, never waited for.
    pub fn dispatch(&self, events: &[Arc<Event>]) {
        let Some(last) = events.last() else { return };
        let mut delivered = 0;
        let mut w = self.watchers.lock().unwrap();
        w.revision = w.revision.max(last.revision);
        w.by_id.retain(|_, entry| {
            for event in events.iter().filter(|e| e.revision > entry.start) {
                let Some((kind, object)) = transition(&entry.predicate, event) else {
                    continue;
                };
                match entry.tx.try_send(Delivery::Event {
                    kind,
                    object,
                    revision: event.revision,
                }) {
                    Ok(()) => delivered += 1,
                    Err(TrySendError::Full(_)) => {
                        // Events of this revision may be partly queued, so
                        // the watcher resumes from the one before it.
                        let _ = entry.ended.set(Ended::Slow {
                            resume_from: event.revision - 1,
                        });
                        return false;
                    }
                    Err(TrySendError::Closed(_)) => return false,
                }
            }
            true
        });
        self.metrics.watchers.set(w.by_id.len() as i64);
        drop(w);
        self.metrics.deliveries.inc_by(delivered);
    }

    /// Records progress without events (an etcd progress notification).
    pub fn progress(&self, revision: Revision) {
        let mut w = self.watchers.lock().unwrap();
        w.revision = w.revision.max(revision);
    }

    /// Sends a bookmark to each watcher whose bookmark is due. A full queue
    /// skips the bookmark: the events in it carry progress anyway.
    pub fn send_due_bookmarks(&self, now: Instant) {
        let mut sent = 0;
        let mut w = self.watchers.lock().unwrap();
        let revision = w.revision;
        for entry in w.by_id.values_mut() {
            let Some(due) = entry.next_bookmark else {
                continue;
            };
            if due > now || revision <= entry.start {
                continue;
            }
            entry.next_bookmark = Some(self.next_bookmark(now));
            if entry.tx.try_send(Delivery::Bookmark(revision)).is_ok() {
                sent += 1;
            }
        }
        drop(w);
        self.metrics.deliveries.inc_by(sent);
    }

    /// Spreads bookmarks over the last fifth of the interval so watchers
    /// started together do not wake together.
    fn next_bookmark(&self, now: Instant) -> Instant {
        now + self
            .bookmark_interval
            .mul_f64(rand::rng().random_range(0.8..=1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Resource;
    use crate::telemetry::Metrics;

    fn resource() -> Resource {
        Resource::for_tests(&["spec.nodeName"])
    }

    fn obj(name: &str, node: &str, revision: Revision) -> Arc<Object> {
        Arc::new(Object {
            key: Arc::from(format!("/p/ns/{name}")),
            namespace: "ns".into(),
            name: name.into(),
            revision,
            labels: Default::default(),
            fields: vec![node.to_owned()].into(),
            value: Default::default(),
        })
    }

    fn ev(
        kind: EventType,
        object: Option<Arc<Object>>,
        prev: Option<Arc<Object>>,
        revision: Revision,
    ) -> Arc<Event> {
        Arc::new(Event {
            revision,
            kind,
            object,
            prev,
        })
    }

    fn on_node(node: &str) -> Predicate {
        Predicate::new(&resource(), "", "", "", &format!("spec.nodeName={node}")).unwrap()
    }

    fn dispatcher(queue: usize) -> Arc<Dispatcher> {
        Arc::new(Dispatcher::new(
            queue,
            Duration::from_secs(60),
            Metrics::default().resource("pods"),
        ))
    }

    #[test]
    fn a_move_between_nodes_is_deleted_for_one_and_added_for_the_other() {
        let before = obj("a", "node-1", 5);
        let after = obj("a", "node-2", 6);
        let e = ev(
            EventType::Modified,
            Some(after.clone()),
            Some(before.clone()),
            6,
        );
        assert_eq!(
            transition(&on_node("node-1"), &e),
            Some((EventType::Deleted, before))
        );
        assert_eq!(
            transition(&on_node("node-2"), &e),
            Some((EventType::Added, after.clone()))
        );
        assert_eq!(transition(&on_node("node-3"), &e), None);
        let same = ev(
            EventType::Modified,
            Some(after.clone()),
            Some(after.clone()),
            7,
        );
        assert_eq!(
            transition(&on_node("node-2"), &same),
            Some((EventType::Modified, after))
        );
    }

    #[test]
    fn watchers_get_only_events_after_their_start() {
        let d = dispatcher(16);
        let mut s = d.register(Predicate::default(), 6, false);
        d.dispatch(&[
            ev(EventType::Added, Some(obj("a", "", 5)), None, 5),
            ev(EventType::Added, Some(obj("b", "", 6)), None, 6),
            ev(EventType::Added, Some(obj("c", "", 7)), None, 7),
        ]);
        let Ok(Delivery::Event { revision: 7, .. }) = s.rx.try_recv() else {
            panic!("want rev 7")
        };
        assert!(s.rx.try_recv().is_err());
    }

    #[test]
    fn a_full_queue_ends_only_that_watcher_with_a_lossless_resume_point() {
        let d = dispatcher(2);
        let mut slow = d.register(Predicate::default(), 0, false);
        let mut fast = d.register(Predicate::default(), 0, false);
        for rev in 1..=4 {
            d.dispatch(&[ev(
                EventType::Added,
                Some(obj(&rev.to_string(), "", rev)),
                None,
                rev,
            )]);
            while let Ok(Delivery::Event { .. }) = fast.rx.try_recv() {}
        }
        let mut got = Vec::new();
        while let Some(Delivery::Event { revision, .. }) = slow.rx.blocking_recv() {
            got.push(revision);
        }
        assert_eq!(got, [1, 2]);
        assert_eq!(slow.ended(), Some(Ended::Slow { resume_from: 2 }));
        assert_eq!(fast.ended(), None);
        assert_eq!(d.len(), 1);
        drop(fast);
        assert!(d.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn bookmarks_go_only_to_watchers_that_allow_them_and_never_backwards() {
        let d = dispatcher(16);
        let mut with = d.register(Predicate::default(), 10, true);
        let mut without = d.register(Predicate::default(), 10, false);
        d.progress(9);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(
            with.rx.try_recv().is_err(),
            "revision 9 is behind the watcher's start"
        );
        d.progress(12);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(matches!(with.rx.try_recv(), Ok(Delivery::Bookmark(12))));
        assert!(without.rx.try_recv().is_err());
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(62));
        assert!(
            with.rx.try_recv().is_err(),
            "the next bookmark is an interval away"
        );
    }
}
