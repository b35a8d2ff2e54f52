//! Watch: the same events as etcd's, field for field; cancelled with where
//! to start again when history is gone; each watch to its own prefix; a
//! stream that stops reading catches up or is cancelled.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use etcd_client::{
    Client, EventType, GetOptions, Txn, TxnOp, WatchFilterType, WatchOptions, WatchStream,
};
use watchproxy::config::{Config, ServePath};

use super::shared::*;

/// The (deleted, revision) of each event of `stream`, by watch, until
/// watch 0 has one at `until`.
async fn by_watch(stream: &mut WatchStream, until: i64) -> BTreeMap<i64, Vec<(i32, i64)>> {
    let mut by_watch = BTreeMap::<i64, Vec<(i32, i64)>>::new();
    let mut note = |r: &etcd_client::WatchResponse| {
        for ev in r.events() {
            let kind = matches!(ev.event_type(), EventType::Delete) as i32;
            let at = (kind, ev.kv().unwrap().mod_revision());
            by_watch.entry(r.watch_id()).or_default().push(at);
        }
    };
    let mut zero_at = 0;
    while zero_at < until {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .unwrap();
        if r.watch_id() == 0 {
            zero_at = (r.events().last()).map_or(zero_at, |e| e.kv().unwrap().mod_revision());
        }
        note(&r);
    }
    // The other watches' changes may come after watch 0's (a stream sends a
    // watch's changes taken together in one response): a progress answer
    // comes after every change up to the revision it names.
    stream.request_progress().await.unwrap();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the progress answer within 10 s")
            .unwrap()
            .unwrap();
        if r.watch_id() == -1 && r.events().is_empty() {
            return by_watch;
        }
        note(&r);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_show_what_etcd_shows_field_for_field() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    for path in PATHS {
        let (_proxy, mut w) = proxy(&etcd.client_url, path).await;
        // From a past revision, with the state before each change.
        let past = || {
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(before + 1)
                .with_prev_key()
        };
        let mut want = e.watch("/registry/pods/", Some(past())).await.unwrap();
        let mut got = w.watch("/registry/pods/", Some(past())).await.unwrap();
        created(&mut want).await;
        created(&mut got).await;
        let (want_events, _) = events_until(&mut want, head - 2).await;
        let (got_events, split) = events_until(&mut got, head - 2).await;
        assert_eq!(got_events, want_events, "{path:?}");
        assert!(!split, "{path:?}: a revision came in two responses");
        assert!(
            got_events.iter().any(|(_, kv, _)| kv.5 != 0),
            "a lease is shown"
        );

        // A second watch on the same stream: one namespace, deletions left
        // out, its id chosen by the client; from now on.
        let only_puts = || {
            WatchOptions::new()
                .with_prefix()
                .with_watch_id(7)
                .with_filters([WatchFilterType::NoDelete])
        };
        let now = e.get("/", None).await.unwrap().header().unwrap().revision();
        want.watch("/registry/pods/ns-1/", Some(only_puts()))
            .await
            .unwrap();
        got.watch("/registry/pods/ns-1/", Some(only_puts()))
            .await
            .unwrap();
        let (want_created, got_created) = (created(&mut want).await, created(&mut got).await);
        assert_eq!(
            (
                got_created.watch_id(),
                got_created.header().unwrap().revision()
            ),
            (7, now),
            "{path:?}"
        );
        assert_eq!(want_created.watch_id(), 7);
        // The same id again is refused, as etcd refuses it.
        want.watch("/registry/pods/ns-1/", Some(only_puts()))
            .await
            .unwrap();
        got.watch("/registry/pods/ns-1/", Some(only_puts()))
            .await
            .unwrap();
        let (want_dup, got_dup) = (created(&mut want).await, created(&mut got).await);
        assert!(got_dup.canceled() && want_dup.canceled());
        assert_eq!(got_dup.cancel_reason(), want_dup.cancel_reason());
        assert_eq!(got_dup.watch_id(), want_dup.watch_id());

        let mut c = etcd.client().await;
        let name = format!("later-{path:?}");
        let put = put_pod(&mut c, "ns-1", &name, &[], "n").await as i64;
        delete_key(&mut c, &format!("/registry/pods/ns-1/{name}")).await;
        let deleted = put_pod(&mut c, "ns-2", &name, &[], "n").await as i64;
        // Watch 0 sees all three; watch 7 only the creation.
        let (want_seen, got_seen) = (
            by_watch(&mut want, deleted).await,
            by_watch(&mut got, deleted).await,
        );
        assert_eq!(got_seen, want_seen, "{path:?}");
        assert_eq!(got_seen[&7], [(0, put)], "{path:?}");

        // A progress request: every watch has been shown all up to etcd's
        // revision at the request.
        let now = e.get("/", None).await.unwrap().header().unwrap().revision();
        got.request_progress().await.unwrap();
        let progress = tokio::time::timeout(Duration::from_secs(10), got.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                progress.watch_id(),
                progress.header().unwrap().revision(),
                progress.events().len()
            ),
            (-1, now, 0),
            "{path:?}: {progress:?}"
        );

        // Canceled on request.
        got.cancel(7).await.unwrap();
        let canceled = tokio::time::timeout(Duration::from_secs(10), got.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            canceled.canceled() && canceled.watch_id() == 7,
            "{canceled:?}"
        );
        e.delete(format!("/registry/pods/ns-2/{name}"), None)
            .await
            .unwrap();
    }
}

/// A stream of one watch is sent its live changes as soon as they come
/// (`watch.direct_delivery`): the responses are etcd's, a revision's
/// changes in one, whether the watch has id 0 or another, its range is
/// narrower than its resource or it filters, on every path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_watch_is_sent_its_live_changes_as_etcd_sends_them_on_every_path() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let mut key = 0;
    for (path, direct) in [
        (ServePath::Fast, true),
        (ServePath::Fast, false),
        (ServePath::Tonic, true),
    ] {
        let mut config = config(&etcd.client_url, path);
        config.watch.direct_delivery = direct;
        let (_proxy, mut w) = etcd_api_proxy(config).await;
        let all = || WatchOptions::new().with_prefix().with_prev_key();
        let ns1_puts = || {
            WatchOptions::new()
                .with_prefix()
                .with_watch_id(5)
                .with_filters([WatchFilterType::NoDelete])
        };
        let mut want = Vec::new();
        let mut got = Vec::new();
        for (client, streams) in [(&mut e, &mut want), (&mut w, &mut got)] {
            let mut a = client.watch("/registry/pods/", Some(all())).await.unwrap();
            let mut b = client
                .watch("/registry/pods/ns-1/", Some(ns1_puts()))
                .await
                .unwrap();
            created(&mut a).await;
            created(&mut b).await;
            streams.extend([a, b]);
        }
        key += 1;
        let (a, c, d) = (format!("a{key}"), format!("c{key}"), format!("d{key}"));
        put_pod(&mut e, "ns-1", &a, &[], "n").await;
        put_pod(&mut e, "ns-2", &a, &[], "n").await;
        put_pod(&mut e, "ns-1", &a, &[("v", "2")], "n").await;
        let txn = Txn::new().and_then([
            TxnOp::put(
                format!("/registry/pods/ns-1/{c}"),
                pod_json(&c, "ns-1", &[], "n"),
                None,
            ),
            TxnOp::put(
                format!("/registry/pods/ns-2/{d}"),
                pod_json(&d, "ns-2", &[], "n"),
                None,
            ),
        ]);
        e.txn(txn).await.unwrap();
        delete_key(&mut e, &format!("/registry/pods/ns-1/{a}")).await;
        let last = put_pod(&mut e, "ns-1", &d, &[], "n").await as i64;
        for (i, (want, got)) in want.iter_mut().zip(&mut got).enumerate() {
            let want = watch_events_until(want, last).await;
            let got = watch_events_until(got, last).await;
            assert_eq!(got, want, "{path:?} direct={direct}, stream {i}");
        }
    }
}

/// Where etcd's history is gone, watches are canceled with the revision
/// to start again from, as etcd cancels a watch of a compacted revision:
/// one that starts before the window, and open ones when watchproxy lost
/// etcd's history while cut off (the resync a `watchproxy.v1` watch is
/// shown). Never a silent gap (etcd's grpc-proxy issue 21813).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_whose_history_is_gone_are_canceled_with_where_to_start_again() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut e = etcd.client().await;
    put_pod(&mut e, "ns", "a", &[], "n").await;
    put_pod(&mut e, "ns", "a", &[("v", "2")], "n").await;
    compact_all(&mut e).await;
    let (_proxy, mut w) = proxy(&forwarder.url, ServePath::Fast).await;

    let old = || WatchOptions::new().with_prefix().with_start_revision(1);
    let mut want = e.watch("/registry/pods/", Some(old())).await.unwrap();
    let mut got = w.watch("/registry/pods/", Some(old())).await.unwrap();
    for stream in [&mut want, &mut got] {
        created(stream).await;
        let canceled = next(stream).await;
        assert!(
            canceled.canceled() && canceled.compact_revision() > 1,
            "{canceled:?}"
        );
        // From there it works.
        let again = WatchOptions::new()
            .with_prefix()
            .with_start_revision(canceled.compact_revision());
        stream.watch("/registry/pods/", Some(again)).await.unwrap();
        let created = created(stream).await;
        assert!(!created.canceled(), "{created:?}");
    }
    let put = put_pod(&mut e, "ns", "b", &[], "n").await as i64;
    assert_eq!(
        next(&mut got).await.events()[0]
            .kv()
            .unwrap()
            .mod_revision(),
        put
    );

    // Cut off while etcd's history moves past the cache's and is
    // compacted: the open watch learns it as a compaction.
    forwarder.cut();
    put_pod(&mut e, "ns", "c", &[], "n").await;
    delete_key(&mut e, "/registry/pods/ns/b").await;
    compact_all(&mut e).await;
    forwarder.restore();
    let canceled = next(&mut got).await;
    assert!(
        canceled.canceled() && canceled.compact_revision() > put,
        "{canceled:?}"
    );
    // Reading again at compact_revision - 1 and watching from
    // compact_revision misses nothing.
    let at = canceled.compact_revision() - 1;
    let state = w
        .get(
            "/registry/pods/",
            Some(GetOptions::new().with_prefix().with_revision(at)),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = state.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["/registry/pods/ns/a", "/registry/pods/ns/c"]);
    let from = WatchOptions::new()
        .with_prefix()
        .with_start_revision(canceled.compact_revision());
    got.watch("/registry/pods/", Some(from)).await.unwrap();
    assert!(!created(&mut got).await.canceled());
    let last = put_pod(&mut e, "ns", "d", &[], "n").await as i64;
    assert_eq!(
        next(&mut got).await.events()[0]
            .kv()
            .unwrap()
            .mod_revision(),
        last
    );
}

/// Watches of several prefixes on one stream, across an etcd restart:
/// each gets its own prefix's changes, every one of them, and no other's
/// (etcd's grpc-proxy issue 21881 sent one prefix's events to another's
/// watchers after a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_watch_keeps_to_its_own_prefix_across_an_etcd_restart() {
    let mut etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let start = put_pod(&mut e, "ns", "a", &[], "n").await as i64;
    e.put("/registry/minions/n1", "{}", None).await.unwrap();
    let (_proxy, mut w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let from = || WatchOptions::new().with_prefix().with_start_revision(start);
    let mut stream = w.watch("/registry/pods/", Some(from())).await.unwrap();
    stream
        .watch("/registry/minions/", Some(from()))
        .await
        .unwrap();
    // Ids are assigned in order from 0, as etcd assigns them.
    let (pods, nodes) = (0, 1);
    etcd.restart().await;
    let mut e = etcd.client().await;
    let mut written = BTreeMap::<i64, Vec<i64>>::new();
    for i in 0..5 {
        let pod = put_pod(&mut e, "ns", &format!("p{i}"), &[], "n").await as i64;
        let node = e
            .put(format!("/registry/minions/n{i}"), "{}", None)
            .await
            .unwrap();
        written.entry(pods).or_default().push(pod);
        written
            .entry(nodes)
            .or_default()
            .push(node.header().unwrap().revision());
    }
    written.get_mut(&pods).unwrap().insert(0, start);
    written.get_mut(&nodes).unwrap().insert(0, start + 1);
    let mut seen = BTreeMap::<i64, Vec<i64>>::new();
    let mut created = Vec::new();
    while seen.values().map(Vec::len).sum::<usize>() < 12 {
        let r = next(&mut stream).await;
        assert!(!r.canceled(), "{r:?}");
        if r.created() {
            created.push(r.watch_id());
        }
        for ev in r.events() {
            let key = ev.kv().unwrap().key_str().unwrap();
            let prefix = if r.watch_id() == pods {
                "/registry/pods/"
            } else {
                "/registry/minions/"
            };
            assert!(key.starts_with(prefix), "watch {} got {key}", r.watch_id());
            seen.entry(r.watch_id())
                .or_default()
                .push(ev.kv().unwrap().mod_revision());
        }
    }
    assert_eq!(seen, written);
    assert_eq!(created, [pods, nodes]);
}

/// An etcd client that stops reading falls behind without holding up
/// others: it catches up from the window with nothing lost, and one that
/// stays away past the window is canceled with where to start again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_stops_reading_catches_up_from_the_window_or_is_canceled() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let start = put_pod(&mut e, "ns", "p", &[], "n").await as i64;
    // A queue of 2 per watcher and a window of at most 256 events.
    let yaml = pods_yaml(&etcd.client_url, 2)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        .replace(
            "indexed_fields: [spec.nodeName]",
            "indexed_fields: [spec.nodeName]\n    cache: {min_events: 16, max_events: 256}",
        );
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    // Each on its own connection: streams not read hold their
    // connection's flow-control window, on the client's side too.
    let url = format!("http://{}", proxy.addr);
    let from = || WatchOptions::new().with_prefix().with_start_revision(start);
    let mut watches = Vec::new();
    for _ in 0..3 {
        let mut w = Client::connect([&url], None).await.unwrap();
        watches.push(w.watch("/registry/pods/", Some(from())).await.unwrap());
    }
    let (mut gone, mut stalled, mut prompt) = (
        watches.pop().unwrap(),
        watches.pop().unwrap(),
        watches.pop().unwrap(),
    );
    for stream in [&mut prompt, &mut stalled, &mut gone] {
        created(stream).await;
    }
    // More than the client's HTTP/2 windows (2 MiB for a stream) and the
    // server's bound on what a connection holds unsent (1 MiB) take: the
    // watchers that do not read fall behind their queues.
    let padded = |name: &str| pod_json(name, "ns", &[], "n") + &" ".repeat(48 * 1024);
    let mut last = 0;
    for i in 0..120 {
        let key = format!("/registry/pods/ns/p{}", i % 5);
        last = e
            .put(key, padded("p"), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    // The prompt one has everything while the others read nothing.
    let mut revisions = Vec::new();
    while revisions.last() != Some(&last) {
        for ev in next(&mut prompt).await.events() {
            revisions.push(ev.kv().unwrap().mod_revision());
        }
    }
    assert_eq!(revisions, (start..=last).collect::<Vec<_>>());
    // The stalled one reads now, and has every revision, once.
    let mut caught_up = Vec::new();
    while caught_up.last() != Some(&last) {
        let r = next(&mut stalled).await;
        assert!(!r.canceled(), "{r:?}");
        caught_up.extend(r.events().iter().map(|ev| ev.kv().unwrap().mod_revision()));
    }
    assert_eq!(caught_up, revisions);
    let behind = proxy.metric("watchproxy_watchers_fell_behind_total", "resource=\"pods\"");
    assert!(
        behind >= 2.0,
        "the two that did not read fell behind: {behind}"
    );
    // Past the window: 300 more writes while `gone` reads nothing.
    for i in 0..300 {
        let key = format!("/registry/pods/ns/q{}", i % 5);
        e.put(key, padded("q"), None).await.unwrap();
    }
    let canceled = loop {
        let r = next(&mut gone).await;
        if r.canceled() {
            break r;
        }
    };
    assert!(canceled.compact_revision() > start, "{canceled:?}");
}
