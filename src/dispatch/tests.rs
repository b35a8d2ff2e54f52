//! The dispatcher's unit tests.

use std::task::Waker;

use tokio::time::Instant;

use super::*;
use crate::object::Resource;
use crate::telemetry::Metrics;

pub(super) fn resource() -> Resource {
    Resource::for_tests(&["spec.nodeName"])
}

pub(super) fn obj(name: &str, node: &str, revision: Revision) -> Arc<Object> {
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

pub(super) fn ev(
    kind: EventType,
    object: Option<Arc<Object>>,
    prev: Option<Arc<Object>>,
    revision: Revision,
) -> Arc<Event> {
    let e = Event::between(revision, prev, object).expect("an object or a previous one");
    assert_eq!(e.kind(), kind);
    Arc::new(e)
}

pub(super) fn on_node(node: &str) -> Predicate {
    Predicate::new(&resource(), "", "", "", &format!("spec.nodeName={node}")).unwrap()
}

pub(super) fn dispatcher(queue: usize) -> Arc<Dispatcher> {
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
        Some((EventType::Deleted, &before))
    );
    assert_eq!(
        transition(&on_node("node-2"), &e),
        Some((EventType::Added, &after))
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
        Some((EventType::Modified, &after))
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
pub(super) fn everything(
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
pub(super) fn add_one(d: &Dispatcher, rev: Revision) {
    d.dispatch(&[ev(
        EventType::Added,
        Some(obj(&rev.to_string(), "", rev)),
        None,
        rev,
    )])
}

pub(super) fn revisions(s: &mut Subscription) -> Vec<Option<Revision>> {
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

pub(super) fn ended(s: &Subscription) -> bool {
    let mut cx = std::task::Context::from_waker(Waker::noop());
    matches!(s.mailbox.poll_recv(&mut cx), std::task::Poll::Ready(None))
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
