//! Fan-out: hands each event to every interested watcher's bounded queue,
//! rewriting its type per watcher, and sends periodic bookmarks. A watcher
//! whose queue is nearly full falls behind: its live deliveries are skipped
//! until it has caught up from the event window by itself.

mod inbox;
mod trigger;
mod watcher;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::time::Instant;

use crate::object::{Event, EventType, Object, Revision};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;
use inbox::{Address, Counters, Parcel, QueueSpec};
pub use inbox::{Inbox, Mailbox};
pub use trigger::Trigger;
use trigger::TriggerIndex;
pub use watcher::{Next, Watcher};

/// Turns a change as a watcher sees it into the bytes sent on the wire.
/// Given by the API layer, so dispatch knows nothing of the wire format.
pub type Encode = Arc<dyn Fn(EventType, &Object, Revision) -> Encoded + Send + Sync>;

/// An encoded message in two pieces written back to back, so that a piece
/// shared with the cache (an object's own encoding) is not copied to make
/// the message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    pub head: Bytes,
    pub body: Bytes,
}

impl Encoded {
    /// The message's size in bytes.
    pub fn size(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// The whole message in one buffer.
    pub fn to_bytes(&self) -> Bytes {
        if self.body.is_empty() {
            return self.head.clone();
        }
        [&self.head[..], &self.body[..]].concat().into()
    }
}

/// An event as the watchers of one type see it, shared by all of them.
#[derive(Debug)]
pub struct View {
    pub kind: EventType,
    /// DELETED carries the last state the watcher was shown.
    pub object: Arc<Object>,
    pub revision: Revision,
    /// The encoded change, made once per event and type (when the
    /// dispatcher has an encoder).
    pub encoded: Option<Encoded>,
}

/// What a watcher's queue carries. Small, so an idle watcher's queue is
/// small too.
#[derive(Debug, Clone)]
pub enum Delivery {
    Event(Arc<View>),
    /// Progress with nothing to show: the watcher has seen everything up to
    /// this revision.
    Bookmark(Revision),
    /// The queue had no room for the next event: live deliveries are
    /// skipped from here on, and the watcher reads the event window from
    /// the last change it received, then rejoins (through the cache).
    Behind,
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
    to: Address,
    /// Where its deliveries wait to be posted, in `Posts::posts`.
    post: usize,
    bookmarks: bool,
}

/// The deliveries of one dispatch for one inbox, posted together.
struct Post {
    inbox: Arc<Inbox>,
    parcels: Vec<Parcel>,
    /// The watchers registered with this inbox.
    watchers: usize,
}

/// Parcels gathered before a dispatch of many events posts what it has.
const POST_PARCELS: usize = 16 * 1024;

struct Watchers {
    next_id: u64,
    index: TriggerIndex<Entry>,
    /// When each watcher that allows bookmarks gets its next one; entries
    /// of watchers that left are dropped when they come due.
    bookmarks_due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The newest revision dispatched (events or progress); bookmarks carry it.
    revision: Revision,
    posts: Posts,
    /// No more events will come: the cache's writer is gone.
    closed: bool,
}

/// The inboxes of the registered watchers, each with what a dispatch
/// gathered for it.
#[derive(Default)]
struct Posts {
    posts: Vec<Option<Post>>,
    /// The place in `posts` of each inbox, by its address.
    post_of: HashMap<usize, usize>,
    free: Vec<usize>,
    /// The posts holding parcels, and how many parcels they hold together.
    posting: Vec<usize>,
    parcels: usize,
}

impl Posts {
    /// The place of `inbox`'s post, for one more watcher.
    fn join(&mut self, inbox: &Arc<Inbox>) -> usize {
        let key = Arc::as_ptr(inbox) as usize;
        if let Some(&i) = self.post_of.get(&key) {
            self.posts[i].as_mut().expect("a listed post").watchers += 1;
            return i;
        }
        let post = Post {
            inbox: inbox.clone(),
            parcels: Vec::new(),
            watchers: 1,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.posts[i] = Some(post);
                i
            }
            None => {
                self.posts.push(Some(post));
                self.posts.len() - 1
            }
        };
        self.post_of.insert(key, i);
        i
    }

    /// One watcher fewer at post `i`.
    fn leave(&mut self, i: usize) {
        let slot = &mut self.posts[i];
        let post = slot.as_mut().expect("a watcher's post");
        post.watchers -= 1;
        if post.watchers == 0 {
            self.post_of.remove(&(Arc::as_ptr(&post.inbox) as usize));
            *slot = None;
            self.free.push(i);
        }
    }

    fn inbox(&self, i: usize) -> &Arc<Inbox> {
        &self.posts[i].as_ref().expect("a watcher's post").inbox
    }

    fn send(&mut self, post: usize, to: Address, delivery: Delivery) {
        let parcels = &mut self.posts[post].as_mut().expect("a watcher's post").parcels;
        if parcels.is_empty() {
            self.posting.push(post);
        }
        parcels.push(Parcel {
            to,
            delivery: Some(delivery),
        });
        self.parcels += 1;
    }

    /// Posts what was gathered, each inbox's parcels at once.
    fn post(&mut self, wakes: &mut Vec<Waker>) {
        for i in self.posting.drain(..) {
            if let Some(post) = &mut self.posts[i] {
                post.inbox.post(&mut post.parcels, wakes);
            }
        }
        self.parcels = 0;
    }
}

/// The watchers of one resource.
///
/// Events are dispatched by the single cache writer, in revision order. The
/// lock is held while queueing to the interested watchers: a send never
/// waits, and holding it is what orders registration against dispatch (a
/// watcher registered at revision R is in the set before any event after R
/// is dispatched).
pub struct Dispatcher {
    watchers: Mutex<Watchers>,
    queue_len: usize,
    bookmark_interval: Duration,
    metrics: ResourceMetrics,
    /// Kept by the watchers' queues.
    counters: Arc<Counters>,
    encode: Option<Encode>,
    /// The wakers of receivers a dispatch has queued to, woken after it
    /// releases the lock; kept for the allocation.
    wakes: Mutex<Vec<Waker>>,
}

/// A registered watcher's receiving end; dropping it unregisters.
pub struct Subscription {
    id: u64,
    pub mailbox: Mailbox,
    dispatcher: Arc<Dispatcher>,
}

impl Subscription {
    /// Resumes live delivery after the watcher read the window through
    /// `after`. The caller holds the cache lock and has checked that the
    /// window holds nothing after `after`, so events up to it that are
    /// still on their way are skipped and every later one is delivered.
    pub(crate) fn rejoin(&self, after: Revision) {
        self.mailbox.rejoin(after);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut w = self.dispatcher.watchers.lock().unwrap();
        if let Some(entry) = w.index.remove(self.id) {
            w.posts.leave(entry.post);
        }
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
                posts: Posts::default(),
                closed: false,
            }),
            queue_len,
            bookmark_interval,
            counters: Arc::new(Counters {
                deliveries: metrics.deliveries.clone(),
                fell_behind: metrics.fell_behind.clone(),
            }),
            metrics,
            encode: None,
            wakes: Mutex::default(),
        }
    }

    /// Encodes each delivered change once, for all its watchers.
    pub fn with_encoder(mut self, encode: Encode) -> Self {
        self.encode = Some(encode);
        self
    }

    /// Adds a watcher that receives events after `start` in `inbox`,
    /// registered under `trigger`, which must cover every object
    /// `predicate` can match. One that starts `behind` reads the window
    /// from `start` and then rejoins.
    pub fn register(
        self: &Arc<Self>,
        inbox: &Arc<Inbox>,
        predicate: Predicate,
        trigger: Trigger,
        start: Revision,
        bookmarks: bool,
        behind: bool,
    ) -> Subscription {
        let mailbox = inbox.open(QueueSpec {
            capacity: self.queue_len,
            start,
            behind,
            counters: self.counters.clone(),
        });
        let due = self.next_bookmark(Instant::now());
        let mut w = self.watchers.lock().unwrap();
        let id = w.next_id;
        w.next_id += 1;
        if w.closed {
            // Its queue ends at once: the watcher sees `Closed`.
            let mut wakes = Vec::new();
            inbox.post_end(mailbox.address(), &mut wakes);
            drop(w);
            wakes.into_iter().for_each(Waker::wake);
            return Subscription {
                id,
                mailbox,
                dispatcher: self.clone(),
            };
        }
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
            to: mailbox.address(),
            post: w.posts.join(inbox),
            bookmarks,
        };
        w.index.insert(id, trigger, entry);
        self.metrics.watchers.set(w.index.len() as i64);
        drop(w);
        Subscription {
            id,
            mailbox,
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
    /// visiting only the watchers the trigger index names. Each inbox gets
    /// the batch's deliveries at once; a watcher whose queue is full falls
    /// behind there and is never waited for nor cut off.
    pub fn dispatch(&self, events: &[Arc<Event>]) {
        let Some(last) = events.last() else { return };
        let mut encodings = 0;
        let mut wakes = std::mem::take(&mut *self.wakes.lock().unwrap());
        let mut guard = self.watchers.lock().unwrap();
        let w = &mut *guard;
        w.revision = w.revision.max(last.revision);
        let Watchers { index, posts, .. } = w;
        for event in events {
            // One view (and encoding) per type this event is delivered as.
            let mut views: [Option<Arc<View>>; 3] = [None, None, None];
            index.for_each_candidate(event, |_, entry, via| {
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
                let view = views[kind as usize].get_or_insert_with(|| {
                    let encoded = self.encode.as_ref().map(|encode| {
                        encodings += 1;
                        encode(kind, &object, event.revision)
                    });
                    Arc::new(View {
                        kind,
                        object,
                        revision: event.revision,
                        encoded,
                    })
                });
                posts.send(entry.post, entry.to, Delivery::Event(view.clone()));
            });
            if posts.parcels >= POST_PARCELS {
                posts.post(&mut wakes);
            }
        }
        posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
        self.metrics.encodings.inc_by(encodings);
    }

    /// Ends every watcher's queue after what it holds, and any registered
    /// later at once: no more events will come. Watchers learn of it from
    /// their own queues, so a watch needs no other signal to see the end.
    pub fn close(&self) {
        let mut wakes = Vec::new();
        let mut w = self.watchers.lock().unwrap();
        w.closed = true;
        let index = std::mem::take(&mut w.index);
        for entry in index.into_watchers() {
            w.posts.inbox(entry.post).post_end(entry.to, &mut wakes);
        }
        w.posts = Posts::default();
        w.bookmarks_due.clear();
        self.metrics.watchers.set(0);
        drop(w);
        wakes.into_iter().for_each(Waker::wake);
    }

    /// Records progress without events (an etcd progress notification).
    pub fn progress(&self, revision: Revision) {
        let mut w = self.watchers.lock().unwrap();
        w.revision = w.revision.max(revision);
    }

    /// Sends a bookmark to each watcher whose bookmark is due, visiting
    /// only those. A watcher that is behind, or whose queue is full, gets
    /// none: it shows progress when it has caught up, and the events in a
    /// full queue carry progress anyway.
    pub fn send_due_bookmarks(&self, now: Instant) {
        let mut wakes = std::mem::take(&mut *self.wakes.lock().unwrap());
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
                w.posts
                    .send(entry.post, entry.to, Delivery::Bookmark(revision));
                self.next_bookmark(now)
            } else {
                now + Duration::from_secs(1)
            };
            w.bookmarks_due.push(Reverse((next, id)));
        }
        w.posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
    }

    /// Wakes the receivers a batch queued to, each once, and keeps the
    /// list's allocation for the next batch.
    fn wake(&self, mut wakes: Vec<Waker>) {
        wakes.drain(..).for_each(Waker::wake);
        *self.wakes.lock().unwrap() = wakes;
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
            wire: Default::default(),
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
        let mut s = everything(&d, &Inbox::solo(), 6, false);
        d.dispatch(&[
            ev(EventType::Added, Some(obj("a", "", 5)), None, 5),
            ev(EventType::Added, Some(obj("b", "", 6)), None, 6),
            ev(EventType::Added, Some(obj("c", "", 7)), None, 7),
        ]);
        assert_eq!(revisions(&mut s), [Some(7)]);
    }

    /// Registers a watcher of every object, live after `start`.
    fn everything(
        d: &Arc<Dispatcher>,
        inbox: &Arc<Inbox>,
        start: Revision,
        bookmarks: bool,
    ) -> Subscription {
        d.register(
            inbox,
            Predicate::default(),
            Trigger::All,
            start,
            bookmarks,
            false,
        )
    }

    /// Dispatches one new object at `rev`.
    fn add_one(d: &Dispatcher, rev: Revision) {
        d.dispatch(&[ev(
            EventType::Added,
            Some(obj(&rev.to_string(), "", rev)),
            None,
            rev,
        )])
    }

    fn revisions(s: &mut Subscription) -> Vec<Option<Revision>> {
        std::iter::from_fn(|| s.mailbox.try_recv())
            .map(|d| match d {
                Delivery::Event(v) => Some(v.revision),
                Delivery::Bookmark(_) => panic!("no bookmarks asked for"),
                Delivery::Behind => None,
            })
            .collect()
    }

    #[test]
    fn a_full_queue_marks_only_that_watcher_behind_until_it_rejoins() {
        let d = dispatcher(3);
        let mut slow = everything(&d, &Inbox::solo(), 0, false);
        let mut fast = everything(&d, &Inbox::solo(), 0, false);
        let send = |rev: Revision| add_one(&d, rev);
        for rev in 1..=5 {
            send(rev);
            assert_eq!(revisions(&mut fast), [Some(rev)]);
        }
        // Two events fit; the last slot says the watcher is behind, and
        // nothing more is queued for it.
        assert_eq!(revisions(&mut slow), [Some(1), Some(2), None]);
        send(6);
        assert_eq!(revisions(&mut slow), []);
        // It read the window through 6 and rejoins: 6 is not sent again
        // when its dispatch comes late, 7 is sent.
        slow.rejoin(6);
        send(6);
        send(7);
        assert_eq!(revisions(&mut slow), [Some(7)]);
        assert_eq!(d.len(), 2);
        drop(fast);
        assert_eq!(d.len(), 1);
        drop(slow);
        assert!(d.is_empty());
    }

    /// Records each wake, and whether the dispatcher's lock was free then.
    struct Woken {
        dispatcher: Arc<Dispatcher>,
        unlocked: Mutex<Vec<bool>>,
    }

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            let free = self.dispatcher.watchers.try_lock().is_ok();
            self.unlocked.lock().unwrap().push(free);
        }
    }

    #[test]
    fn a_batch_wakes_each_waiting_watcher_once_after_queuing_all_of_it() {
        let d = dispatcher(16);
        let mut subs: Vec<_> = (0..2)
            .map(|_| everything(&d, &Inbox::solo(), 0, false))
            .collect();
        let woken = Arc::new(Woken {
            dispatcher: d.clone(),
            unlocked: Mutex::default(),
        });
        let waker = Waker::from(woken.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        for s in &mut subs {
            assert!(s.mailbox.poll_recv(&mut cx).is_pending());
        }
        d.dispatch(&[
            ev(EventType::Added, Some(obj("a", "", 1)), None, 1),
            ev(EventType::Added, Some(obj("b", "", 2)), None, 2),
            ev(EventType::Added, Some(obj("c", "", 3)), None, 3),
        ]);
        assert_eq!(
            *woken.unlocked.lock().unwrap(),
            [true, true],
            "once each, unlocked"
        );
        for s in &mut subs {
            assert_eq!(revisions(s), [Some(1), Some(2), Some(3)]);
        }
    }

    fn ended(s: &Subscription) -> bool {
        let mut cx = std::task::Context::from_waker(Waker::noop());
        matches!(s.mailbox.poll_recv(&mut cx), std::task::Poll::Ready(None))
    }

    fn counting() -> Arc<Woken> {
        Arc::new(Woken {
            dispatcher: dispatcher(1),
            unlocked: Mutex::default(),
        })
    }

    fn woken(w: &Woken) -> usize {
        w.unlocked.lock().unwrap().len()
    }

    #[test]
    fn watchers_sharing_an_inbox_get_each_batch_through_one_wake_of_their_reader() {
        let d = dispatcher(16);
        let inbox = Inbox::shared();
        let mut subs: Vec<_> = (0..3).map(|_| everything(&d, &inbox, 0, false)).collect();
        let places = |subs: &[Subscription]| -> Vec<usize> {
            subs.iter().map(|s| s.mailbox.place()).collect()
        };
        let reader = counting();
        let reader_waker = Waker::from(reader.clone());
        let mut ready = Vec::new();
        inbox.collect(&reader_waker, &mut ready);
        assert!(ready.is_empty());
        add_one(&d, 1);
        add_one(&d, 2);
        assert_eq!(woken(&reader), 1, "once for both batches");
        inbox.collect(&reader_waker, &mut ready);
        ready.sort();
        assert_eq!(ready, places(&subs), "each watcher named once");
        for s in &mut subs {
            assert_eq!(revisions(s), [Some(1), Some(2)]);
        }

        // A watcher that leaves with deliveries on their way: its place is
        // taken by a new one, which does not get them.
        add_one(&d, 3);
        drop(subs.pop());
        let mut late = everything(&d, &inbox, 3, false);
        add_one(&d, 4);
        ready.clear();
        inbox.collect(&reader_waker, &mut ready);
        assert_eq!(late.mailbox.place(), 2);
        ready.sort();
        assert_eq!(ready, [0, 1, 2]);
        for s in &mut subs {
            assert_eq!(revisions(s), [Some(3), Some(4)]);
        }
        assert_eq!(revisions(&mut late), [Some(4)]);
        assert_eq!(d.metrics.deliveries.get(), 2 * 3 + 2 * 2 + 1);
    }

    #[test]
    fn an_inbox_without_room_puts_all_its_watchers_behind_until_each_rejoins() {
        let d = dispatcher(4);
        let inbox = Inbox::shared();
        let mut subs: Vec<_> = (0..2).map(|_| everything(&d, &inbox, 0, false)).collect();
        let reader = Waker::noop();
        let ready = &mut Vec::new();
        // Ten deliveries for a room of eight: none is posted.
        d.dispatch(
            &(1..=5)
                .map(|r| ev(EventType::Added, Some(obj(&r.to_string(), "", r)), None, r))
                .collect::<Vec<_>>(),
        );
        inbox.collect(reader, ready);
        for s in &mut subs {
            assert_eq!(revisions(s), [None]);
        }
        add_one(&d, 6);
        inbox.collect(reader, ready);
        assert_eq!(revisions(&mut subs[0]), [], "skipped while behind");
        // Each rejoins after reading the window through 6.
        subs[0].rejoin(6);
        add_one(&d, 7);
        inbox.collect(reader, ready);
        assert_eq!(revisions(&mut subs[0]), [Some(7)]);
        assert_eq!(revisions(&mut subs[1]), []);
        assert_eq!(
            d.metrics.deliveries.get(),
            1,
            "what was skipped is not counted"
        );
        d.close();
        inbox.collect(reader, ready);
        assert!(subs.iter().all(ended));
    }

    #[test]
    fn a_bookmark_never_takes_the_slot_kept_for_behind() {
        let d = dispatcher(3);
        let s = everything(&d, &Inbox::solo(), 0, true);
        let send = |rev: Revision| add_one(&d, rev);
        send(1);
        send(2);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        send(3);
        let got: Vec<_> = std::iter::from_fn(|| s.mailbox.try_recv())
            .map(|d| match d {
                Delivery::Event(v) => format!("event {}", v.revision),
                Delivery::Bookmark(r) => format!("bookmark {r}"),
                Delivery::Behind => "behind".to_owned(),
            })
            .collect();
        assert_eq!(got, ["event 1", "event 2", "behind"]);
    }

    #[test]
    fn closing_ends_each_queue_after_what_it_holds_and_later_ones_at_once() {
        let d = dispatcher(4);
        let before = everything(&d, &Inbox::solo(), 0, false);
        d.dispatch(&[ev(EventType::Added, Some(obj("a", "", 1)), None, 1)]);
        d.close();
        assert!(d.is_empty());
        d.dispatch(&[ev(EventType::Added, Some(obj("b", "", 2)), None, 2)]);
        assert!(matches!(before.mailbox.try_recv(), Some(Delivery::Event(v)) if v.revision == 1));
        assert!(ended(&before));
        let after = everything(&d, &Inbox::solo(), 2, true);
        assert!(ended(&after));
        assert!(d.is_empty());
    }

    #[test]
    fn each_event_is_encoded_once_per_type_for_all_its_watchers() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let encode: Encode = Arc::new(move |kind, _, revision| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Encoded {
                head: Bytes::from(format!("{kind}@{revision}")),
                body: Bytes::new(),
            }
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
            .map(|_| {
                d.register(
                    &Inbox::solo(),
                    on_node("node-1"),
                    Trigger::All,
                    0,
                    false,
                    false,
                )
            })
            .collect();
        let mut node2: Vec<_> = (0..50)
            .map(|_| {
                d.register(
                    &Inbox::solo(),
                    on_node("node-2"),
                    Trigger::All,
                    0,
                    false,
                    false,
                )
            })
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
        let encoded = |s: &mut Subscription| match s.mailbox.try_recv() {
            Some(Delivery::Event(view)) => view.encoded.clone().unwrap().to_bytes(),
            other => panic!("{other:?}"),
        };
        assert!(node1.iter_mut().all(|s| encoded(s) == "DELETED@6"));
        assert!(node2.iter_mut().all(|s| encoded(s) == "ADDED@6"));
    }

    #[tokio::test(start_paused = true)]
    async fn bookmarks_go_only_to_watchers_that_allow_them_and_never_backwards() {
        let d = dispatcher(16);
        let with = everything(&d, &Inbox::solo(), 10, true);
        let without = everything(&d, &Inbox::solo(), 10, false);
        d.progress(9);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(
            with.mailbox.try_recv().is_none(),
            "revision 9 is behind the watcher's start"
        );
        d.progress(12);
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(61));
        assert!(
            with.mailbox.try_recv().is_none(),
            "the retry is a second away"
        );
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(62));
        assert!(matches!(
            with.mailbox.try_recv(),
            Some(Delivery::Bookmark(12))
        ));
        assert!(without.mailbox.try_recv().is_none());
        d.send_due_bookmarks(Instant::now() + Duration::from_secs(63));
        assert!(
            with.mailbox.try_recv().is_none(),
            "the next bookmark is an interval away"
        );
    }
}
