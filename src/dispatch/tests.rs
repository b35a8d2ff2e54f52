//! The dispatcher's unit tests.

use std::task::Waker;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::*;
use crate::object::Resource;
use crate::telemetry::Metrics;

fn resource() -> Resource {
    Resource::for_tests(&["spec.nodeName"])
}

fn obj(name: &str, node: &str, revision: Revision) -> Arc<Object> {
    let key = format!("/p/ns/{name}");
    Arc::new(Object::bare(
        &key,
        "ns",
        name,
        revision,
        Default::default(),
        &[node],
    ))
}

fn ev(
    kind: EventType,
    object: Option<Arc<Object>>,
    prev: Option<Arc<Object>>,
    revision: Revision,
) -> Arc<Event> {
    let e = Event::between(revision, prev, object).expect("an object or a previous one");
    assert_eq!(e.kind(), kind);
    Arc::new(e)
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
            Delivery::ResyncEnd(_) => panic!("no resync"),
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
    let behind = |d: &Dispatcher| {
        let m = &d.metrics;
        (
            m.behind.get(),
            m.behind_caught_up.get(),
            m.behind_ended.get(),
        )
    };
    assert_eq!(behind(&d), (1, 0, 0), "one watcher behind now");
    send(6);
    assert_eq!(revisions(&mut slow), []);
    // It read the window through 6 and rejoins: 6 is not sent again
    // when its dispatch comes late, 7 is sent.
    slow.rejoin(6);
    assert_eq!(behind(&d), (0, 1, 0), "it caught up");
    send(6);
    send(7);
    assert_eq!(revisions(&mut slow), [Some(7)]);
    assert_eq!(d.len(), 2);
    drop(fast);
    assert_eq!(d.len(), 1);
    // Behind again, and gone before it caught up.
    for rev in 8..=10 {
        send(rev);
    }
    assert_eq!(revisions(&mut slow), [Some(8), Some(9), None]);
    assert_eq!(behind(&d), (1, 1, 0));
    drop(slow);
    assert_eq!(behind(&d), (0, 1, 1), "its time behind ended with it");
    assert!(d.is_empty());
}

/// Records each wake, and whether the dispatcher's lock was free then.
struct Woken {
    dispatcher: Arc<Dispatcher>,
    unlocked: Mutex<Vec<bool>>,
}

impl std::task::Wake for Woken {
    fn wake(self: Arc<Self>) {
        let free = self.dispatcher.watchers.try_lock().is_some();
        self.unlocked.lock().push(free);
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
    assert_eq!(*woken.unlocked.lock(), [true, true], "once each, unlocked");
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
    w.unlocked.lock().len()
}

#[test]
fn watchers_sharing_an_inbox_get_each_batch_through_one_wake_of_their_reader() {
    let d = dispatcher(16);
    let inbox = Inbox::shared();
    let mut subs: Vec<_> = (0..3).map(|_| everything(&d, &inbox, 0, false)).collect();
    let places =
        |subs: &[Subscription]| -> Vec<Place> { subs.iter().map(|s| s.mailbox.place()).collect() };
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
    let left = subs.pop().unwrap().mailbox.place();
    let mut late = everything(&d, &inbox, 3, false);
    add_one(&d, 4);
    ready.clear();
    inbox.collect(&reader_waker, &mut ready);
    assert_ne!(late.mailbox.place(), left, "the same slot, another version");
    ready.sort();
    let mut expected = places(&subs);
    expected.push(late.mailbox.place());
    expected.sort();
    assert_eq!(ready, expected);
    for s in &mut subs {
        assert_eq!(revisions(s), [Some(3), Some(4)]);
    }
    assert_eq!(revisions(&mut late), [Some(4)]);
    assert_eq!(d.metrics.deliveries.get(), 2 * 3 + 2 * 2 + 1);
}

#[test]
fn queues_read_by_one_stream_name_its_place_and_a_sort_now_keeps_the_names_for_the_reader() {
    let d = dispatcher(16);
    let inbox = Inbox::shared();
    let stream = inbox.reserve();
    let mut subs: Vec<_> = (0..2).map(|_| everything(&d, &inbox, 0, false)).collect();
    subs.iter()
        .for_each(|s| s.mailbox.report_as(stream.place()));
    let reader = counting();
    let reader_waker = Waker::from(reader.clone());
    let mut ready = Vec::new();
    inbox.collect(&reader_waker, &mut ready);
    add_one(&d, 1);
    inbox.collect(&reader_waker, &mut ready);
    assert_eq!(
        ready,
        [stream.place(), stream.place()],
        "the stream, for each"
    );
    for s in &mut subs {
        assert_eq!(revisions(s), [Some(1)]);
    }

    // The stream sorts what was posted itself: its queues hold it at
    // once, and the reader, woken by the post, is given the names at its
    // collection.
    let before = woken(&reader);
    add_one(&d, 2);
    inbox.sort_now();
    for s in &mut subs {
        assert_eq!(s.mailbox.try_recv().map(|d| d.revision()), Some(2));
    }
    assert_eq!(woken(&reader), before + 1, "the reader is woken once");
    ready.clear();
    inbox.collect(&reader_waker, &mut ready);
    assert_eq!(ready, [stream.place(), stream.place()]);
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
            Delivery::ResyncEnd(r) => format!("resync end {r}"),
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
    let encode: Encode = Arc::new(move |kind, _, revision, _| {
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
