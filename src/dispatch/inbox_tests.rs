//! The inboxes' unit tests: queues of several watchers read by one task,
//! their wakes, their room, and the places they report.

use std::task::Waker;

use parking_lot::Mutex;

use super::tests::{add_one, dispatcher, ended, ev, everything, obj, revisions};
use super::*;

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
fn a_delivery_that_empties_a_shared_queue_says_so_and_a_solo_one_never_does() {
    let d = dispatcher(16);
    let shared = Inbox::shared();
    let s = everything(&d, &shared, 0, false);
    let solo = everything(&d, &Inbox::solo(), 0, false);
    let reader = Waker::from(counting());
    let mut cx = std::task::Context::from_waker(Waker::noop());
    assert!(solo.mailbox.poll_take(&mut cx).is_pending());
    add_one(&d, 1);
    add_one(&d, 2);
    shared.collect(&reader, &mut Vec::new());
    let emptied = |m: &Mailbox, cx: &mut std::task::Context<'_>| match m.poll_take(cx) {
        std::task::Poll::Ready(Some((_, emptied))) => emptied,
        other => panic!("a delivery, not {other:?}"),
    };
    assert!(!emptied(&s.mailbox, &mut cx), "one more is queued");
    assert!(emptied(&s.mailbox, &mut cx), "the last one queued");
    assert!(s.mailbox.poll_take(&mut cx).is_pending());
    assert!(!emptied(&solo.mailbox, &mut cx));
    assert!(
        !emptied(&solo.mailbox, &mut cx),
        "a solo inbox sorts on demand"
    );
}

#[test]
fn a_change_taken_from_the_sort_is_never_queued_and_one_behind_a_queued_one_waits_its_turn() {
    let d = dispatcher(16);
    let inbox = Inbox::shared();
    let (a, b) = (
        everything(&d, &inbox, 0, false),
        everything(&d, &inbox, 0, false),
    );
    let reader = Waker::from(counting());
    let mut ready = Vec::new();
    // b refuses its first change (say its client gave no room): queued.
    add_one(&d, 1);
    let mut offered = Vec::new();
    inbox.collect_taking(&reader, &mut ready, |o: Offer<'_>| {
        let (place, view) = (o.queue, o.view);
        offered.push((place, view.revision));
        place == a.mailbox.place()
    });
    let (pa, pb) = (a.mailbox.place(), b.mailbox.place());
    offered.sort();
    let mut both = [(pa, 1), (pb, 1)];
    both.sort();
    assert_eq!(offered, both);
    assert_eq!(ready, [pb], "only the queue that got it is named");
    // Both would take the next: a's is taken, b's goes behind its first.
    add_one(&d, 2);
    offered.clear();
    ready.clear();
    inbox.collect_taking(&reader, &mut ready, |o: Offer<'_>| {
        let (place, view) = (o.queue, o.view);
        offered.push((place, view.revision));
        true
    });
    assert_eq!(offered, [(pa, 2)], "b's queue is not empty: not offered");
    assert!(ready.is_empty(), "b was named already");
    assert!(a.mailbox.try_recv().is_none(), "a's changes were taken");
    let mut b = b;
    assert_eq!(revisions(&mut b), [Some(1), Some(2)]);
    // A queue ended (its grant did) is offered nothing more.
    a.mailbox.alarm()();
    add_one(&d, 3);
    offered.clear();
    inbox.collect_taking(&reader, &mut ready, |o: Offer<'_>| {
        let (place, view) = (o.queue, o.view);
        offered.push((place, view.revision));
        true
    });
    assert_eq!(offered, [(pb, 3)]);
    assert!(ready.contains(&pa), "named for its end");
    assert!(!ready.contains(&pb), "b's was taken");
    // A queue read by another's reader (an etcd Watch stream's watch) is
    // offered by the place it is named by, and its own.
    let stream = inbox.reserve();
    b.mailbox.report_as(stream.place());
    add_one(&d, 4);
    let mut named = Vec::new();
    inbox.collect_taking(&reader, &mut ready, |o: Offer<'_>| {
        named.push((o.by, o.queue, o.view.revision, o.alone()));
        false
    });
    assert_eq!(named, [(stream.place(), pb, 4, true)]);
    assert!(ready.contains(&stream.place()), "refused: its reader named");
}
