//! Fan-out: hands each event to every interested watcher's bounded queue,
//! rewriting its type per watcher, and sends periodic bookmarks.

mod trigger;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use crate::object::{Event, EventType, Object, Revision};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;
pub use trigger::Trigger;
use trigger::TriggerIndex;

/// Turns a change as a watcher sees it into the bytes sent on the wire.
/// Given by the API layer, so dispatch knows nothing of the wire format.
pub type Encode = Arc<dyn Fn(EventType, &Object, Revision) -> Bytes + Send + Sync>;

/// What a watcher's queue carries.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// A change as this watcher sees it: DELETED carries the last state the
    /// watcher was shown, stamped with `revision`.
    Event {
        kind: EventType,
        object: Arc<Object>,
        revision: Revision,
        /// The encoded change, made once per event and type and shared by
        /// every watcher it goes to (when the dispatcher has an encoder).
        encoded: Option<Bytes>,
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
    transition_by(event, |o| p.matches(o))
}

fn transition_by(
    event: &Event,
    matches: impl Fn(&Object) -> bool,
) -> Option<(EventType, Arc<Object>)> {
    let now = event.object.as_ref().filter(|o| matches(o));
    let before = event.prev.as_ref().filter(|o| matches(o));
    match (now, before) {
        (Some(o), Some(_)) => Some((EventType::Modified, o.clone())),
        (Some(o), None) => Some((EventType::Added, o.clone())),
        (None, Some(prev)) => Some((EventType::Deleted, prev.clone())),
        (None, None) => None,
    }
}

struct Entry {
    predicate: Predicate,
    /// The predicate says no more than the watcher's trigger set, so being
    /// reached through that set decides a match without reading it.
    trigger_decides: bool,
    /// Events at or before this revision are already in the watcher's
    /// initial state or replay.
    start: Revision,
    tx: mpsc::Sender<Delivery>,
    bookmarks: bool,
    ended: Arc<OnceLock<Ended>>,
}

struct Watchers {
    next_id: u64,
    index: TriggerIndex<Entry>,
    /// When each watcher that allows bookmarks gets its next one; entries
    /// of watchers that left are dropped when they come due.
    bookmarks_due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The newest revision dispatched (events or progress); bookmarks carry it.
    revision: Revision,
    /// Watchers to drop after an event (queue full or closed); reused so
    /// dispatch does not allocate.
    gone: Vec<u64>,
}

/// The watchers of one resource.
///
/// Events are dispatched by the single cache writer, in revision order. The
/// lock is held while queueing to the interested watchers: `try_send` never
/// waits, and holding it is what orders registration against dispatch (a
/// watcher registered at revision R is in the set before any event after R
/// is dispatched).
pub struct Dispatcher {
    watchers: Mutex<Watchers>,
    queue_len: usize,
    bookmark_interval: Duration,
    metrics: ResourceMetrics,
    encode: Option<Encode>,
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
        let mut w = self.dispatcher.watchers.lock().unwrap();
        w.index.remove(self.id);
        self.dispatcher.metrics.watchers.set(w.index.len() as i64);
    }
}

impl Dispatcher {
    pub fn new(queue_len: usize, bookmark_interval: Duration, metrics: ResourceMetrics) -> Self {
        Self {
            watchers: Mutex::new(Watchers {
                next_id: 0,
                index: TriggerIndex::default(),
                bookmarks_due: BinaryHeap::new(),
                revision: 0,
                gone: Vec::new(),
            }),
            queue_len,
            bookmark_interval,
            metrics,
            encode: None,
        }
    }

    /// Encodes each delivered change once, for all its watchers.
    pub fn with_encoder(mut self, encode: Encode) -> Self {
        self.encode = Some(encode);
        self
    }

    /// Adds a watcher that receives events after `start`, registered under
    /// `trigger`, which must cover every object `predicate` can match.
    pub fn register(
        self: &Arc<Self>,
        predicate: Predicate,
        trigger: Trigger,
        start: Revision,
        bookmarks: bool,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(self.queue_len);
        let ended = Arc::new(OnceLock::new());
        let due = self.next_bookmark(Instant::now());
        let mut w = self.watchers.lock().unwrap();
        let id = w.next_id;
        w.next_id += 1;
        if bookmarks {
            w.bookmarks_due.push(Reverse((due, id)));
        }
        let trigger_decides = match &trigger {
            Trigger::All => {
                !predicate.has_selectors()
                    && predicate.namespace().is_none()
                    && predicate.name().is_none()
            }
            Trigger::Key(_) => predicate.is_only_name(),
            Trigger::Field { field, .. } => predicate.is_only_field_pin(*field),
        };
        let entry = Entry {
            predicate,
            trigger_decides,
            start,
            tx,
            bookmarks,
            ended: ended.clone(),
        };
        w.index.insert(id, trigger, entry);
        self.metrics.watchers.set(w.index.len() as i64);
        drop(w);
        Subscription {
            id,
            rx,
            ended,
            dispatcher: self.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.watchers.lock().unwrap().index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `events` (in revision order) to every watcher they concern,
    /// visiting only the watchers the trigger index names. A watcher whose
    /// queue is full is ended as slow, never waited for.
    pub fn dispatch(&self, events: &[Arc<Event>]) {
        let Some(last) = events.last() else { return };
        let mut delivered = 0;
        let mut guard = self.watchers.lock().unwrap();
        let w = &mut *guard;
        w.revision = w.revision.max(last.revision);
        let mut gone = std::mem::take(&mut w.gone);
        let mut encodings = 0;
        for event in events {
            // One encoding per type this event is delivered as.
            let mut encoded: [Option<Bytes>; 3] = [None, None, None];
            w.index.for_each_candidate(event, |id, entry, via| {
                if event.revision <= entry.start {
                    return;
                }
                let seen = match entry.trigger_decides {
                    true => transition_by(event, |o| via.holds(o)),
                    false => transition(&entry.predicate, event),
                };
                let Some((kind, object)) = seen else {
                    return;
                };
                let encoded = self.encode.as_ref().map(|encode| {
                    encoded[kind as usize]
                        .get_or_insert_with(|| {
                            encodings += 1;
                            encode(kind, &object, event.revision)
                        })
                        .clone()
                });
                let delivery = Delivery::Event {
                    kind,
                    object,
                    revision: event.revision,
                    encoded,
                };
                match entry.tx.try_send(delivery) {
                    Ok(()) => delivered += 1,
                    Err(TrySendError::Full(_)) => {
                        // Events of this revision may be partly queued, so
                        // the watcher resumes from the one before it.
                        let _ = entry.ended.set(Ended::Slow {
                            resume_from: event.revision - 1,
                        });
                        gone.push(id);
                    }
                    Err(TrySendError::Closed(_)) => gone.push(id),
                }
            });
            for id in gone.drain(..) {
                w.index.remove(id);
            }
        }
        w.gone = gone;
        self.metrics.watchers.set(w.index.len() as i64);
        drop(guard);
        self.metrics.deliveries.inc_by(delivered);
        self.metrics.encodings.inc_by(encodings);
    }

    /// Records progress without events (an etcd progress notification).
    pub fn progress(&self, revision: Revision) {
        let mut w = self.watchers.lock().unwrap();
        w.revision = w.revision.max(revision);
    }

    /// Sends a bookmark to each watcher whose bookmark is due, visiting
    /// only those. A full queue skips the bookmark: the events in it carry
    /// progress anyway.
    pub fn send_due_bookmarks(&self, now: Instant) {
        let mut sent = 0;
        let mut guard = self.watchers.lock().unwrap();
        let w = &mut *guard;
        while let Some(&Reverse((due, id))) = w.bookmarks_due.peek() {
            if due > now {
                break;
            }
            w.bookmarks_due.pop();
            let revision = w.revision;
            let Some(entry) = w.index.get_mut(id).filter(|e| e.bookmarks) else {
                continue;
            };
            // Nothing newer than the watcher's start yet: try again soon.
            let next = if revision > entry.start {
                if entry.tx.try_send(Delivery::Bookmark(revision)).is_ok() {
                    sent += 1;
                }
                self.next_bookmark(now)
            } else {
                now + Duration::from_secs(1)
            };
            w.bookmarks_due.push(Reverse((next, id)));
        }
        drop(guard);
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
        let mut s = d.register(Predicate::default(), Trigger::All, 6, false);
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
        let mut slow = d.register(Predicate::default(), Trigger::All, 0, false);
        let mut fast = d.register(Predicate::default(), Trigger::All, 0, false);
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

    #[test]
    fn each_event_is_encoded_once_per_type_for_all_its_watchers() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let encode: Encode = Arc::new(move |kind, _, revision| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Bytes::from(format!("{kind}@{revision}"))
        });
        let d = Arc::new(
            Dispatcher::new(
                16,
                Duration::from_secs(60),
                Metrics::default().resource("pods"),
            )
            .with_encoder(encode),
        );
        let mut node1: Vec<_> = (0..50)
            .map(|_| d.register(on_node("node-1"), Trigger::All, 0, false))
            .collect();
        let mut node2: Vec<_> = (0..50)
            .map(|_| d.register(on_node("node-2"), Trigger::All, 0, false))
            .collect();
        let moved = ev(
            EventType::Modified,
            Some(obj("a", "node-2", 6)),
            Some(obj("a", "node-1", 5)),
            6,
        );
        d.dispatch(&[moved]);
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::Relaxed),
            2,
            "DELETED once and ADDED once"
        );
        let encoded = |s: &mut Subscription| match s.rx.try_recv() {
            Ok(Delivery::Event {
                encoded: Some(b), ..
            }) => b,
            other => panic!("{other:?}"),
        };
        assert!(node1.iter_mut().all(|s| encoded(s) == "DELETED@6"));
        assert!(node2.iter_mut().all(|s| encoded(s) == "ADDED@6"));
    }

    #[tokio::test(start_paused = true)]
    async fn bookmarks_go_only_to_watchers_that_allow_them_and_never_backwards() {
        let d = dispatcher(16);
        let mut with = d.register(Predicate::default(), Trigger::All, 10, true);
        let mut without = d.register(Predicate::default(), Trigger::All, 10, false);
        d.progress(9);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(
            with.rx.try_recv().is_err(),
            "revision 9 is behind the watcher's start"
        );
        d.progress(12);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(with.rx.try_recv().is_err(), "the retry is a second away");
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(62));
        assert!(matches!(with.rx.try_recv(), Ok(Delivery::Bookmark(12))));
        assert!(without.rx.try_recv().is_err());
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(63));
        assert!(
            with.rx.try_recv().is_err(),
            "the next bookmark is an interval away"
        );
    }
}
