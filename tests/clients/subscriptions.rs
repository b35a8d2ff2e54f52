//! The Rust informer's subscriptions, as client-go's event handlers are,
//! against a real etcd and watchproxy: a slow one never holds up the
//! informer, falls behind and ends with the store's objects; one made after
//! sync gets every object once, then the changes after.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use parking_lot::Mutex;
use watchproxy_client::{Client, Event, Informer, Store};

type View = Arc<Mutex<BTreeMap<String, String>>>;

/// key → version, as the store holds them.
fn store_view(store: &Store) -> BTreeMap<String, String> {
    (store.list().iter())
        .map(|o| (o.key.clone(), o.resource_version.clone()))
        .collect()
}

fn take(view: &View, event: &Event) {
    match event {
        Event::Added(o) | Event::Modified { new: o, .. } => {
            view.lock()
                .insert(o.key.clone(), o.resource_version.clone());
        }
        Event::Deleted(o) => {
            view.lock().remove(&o.key);
        }
        Event::Relisted { .. } => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_never_holds_the_informer_and_a_late_one_gets_every_object_once() {
    let (etcd, proxy, _client) = start_ready().await;
    let mut ec = etcd.client().await;
    for i in 0..5 {
        put_pod(&mut ec, "ns", &format!("q{i}"), &[("app", "web")], "node-0").await;
    }
    let client = Client::builder(format!("http://{}", proxy.addr))
        .connect_lazy()
        .unwrap();
    let running = Informer::new(client, "pods").start();
    let store = running.store();

    // A subscriber that takes 100 ms a change, with a queue of 4.
    let mut slow = running.subscribe(4);
    let (slow_view, slow_calls) = (View::default(), Arc::new(AtomicU64::new(0)));
    let (view, calls) = (slow_view.clone(), slow_calls.clone());
    let slow_task = tokio::spawn(async move {
        while let Some(event) = slow.next().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
            take(&view, &event);
            calls.fetch_add(1, Ordering::Relaxed);
        }
        slow
    });
    tokio::time::timeout(Duration::from_secs(20), running.wait_until_synced())
        .await
        .expect("synced")
        .unwrap();

    // A burst it cannot keep up with: the store takes all of it at once.
    let burst = 60;
    for i in 0..burst {
        let generation = i.to_string();
        let labels = [("app", "web"), ("gen", generation.as_str())];
        put_pod(&mut ec, "ns", &format!("p{}", i % 10), &labels, "node-1").await;
    }
    put_pod(&mut ec, "ns", "marker", &[("app", "web")], "node-0").await;
    wait_until("the store has the marker", || {
        store.get("ns", "marker").is_some()
    })
    .await;
    let changes = 5 + 1 + burst + 1;
    let slow_then = slow_calls.load(Ordering::Relaxed);
    assert!(
        slow_then < changes / 2,
        "the slow subscriber held the informer up: {slow_then} of {changes} calls made"
    );
    wait_until("the slow subscriber catches up with the store", || {
        *slow_view.lock() == store_view(&store)
    })
    .await;
    let slow_total = slow_calls.load(Ordering::Relaxed);
    eprintln!("slow subscriber: {slow_then} calls when the store had the marker, {slow_total} to catch up, for {changes} changes");
    assert!(
        slow_total < changes,
        "the difference, not every change: {slow_total} calls for {changes} changes"
    );

    // One made after sync: every object once, as Added, then what comes.
    let mut late = running.subscribe(1024);
    let held = store_view(&store);
    let mut first = Vec::new();
    while first.len() < held.len() {
        let next = tokio::time::timeout(Duration::from_secs(5), late.next()).await;
        match next.expect("the store's objects").expect("open") {
            Event::Added(o) => first.push(o.key.clone()),
            other => panic!("{other:?} before the store's objects"),
        }
    }
    first.sort();
    assert_eq!(first, held.keys().cloned().collect::<Vec<_>>());
    let after = put_pod(&mut ec, "ns", "after", &[("app", "web")], "node-0").await;
    let next = tokio::time::timeout(Duration::from_secs(5), late.next()).await;
    match next.expect("the change after").expect("open") {
        Event::Added(o) => assert_eq!(
            (o.name.as_str(), o.resource_version.clone()),
            ("after", after.to_string())
        ),
        other => panic!("{other:?}"),
    }

    // The informer stops: each subscription ends once read.
    running.stop().await.unwrap();
    let slow = tokio::time::timeout(Duration::from_secs(10), slow_task)
        .await
        .expect("the slow subscription ends")
        .unwrap();
    assert!(slow.fell_behind() >= 1, "its queue of 4 filled");
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        while late.next().await.is_some() {}
    });
    rest.await.expect("the late subscription ends");
}
