//! Watch against a real etcd: order, types, versions, resume, bookmarks,
//! selectors and fan-out over one etcd watch.

use std::time::Duration;

use crate::common::*;
use tonic::Code;
use watchproxy::pb::{EventType, WatchRequest};

use EventType::{Added, Bookmark, Deleted, Modified};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_delivers_changes_in_etcd_order_with_types_and_versions() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let r0 = put_pod(&mut ec, "default", "a", &[], "n1").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let mut stream = open_watch(&mut client, watch_req("pods", "")).await;
    let initial = take_events(&mut stream, 1).await;
    assert_eq!(summary(&initial[0]), (Added, "default/a".into(), r0));

    let r1 = put_pod(&mut ec, "default", "b", &[], "n1").await;
    let r2 = put_pod(&mut ec, "default", "a", &[("x", "y")], "n2").await;
    let r3 = delete_key(&mut ec, "/registry/pods/default/a").await;
    let got = take_events(&mut stream, 3).await;
    let got: Vec<_> = got.iter().map(summary).collect();
    assert_eq!(
        got,
        [
            (Added, "default/b".into(), r1),
            (Modified, "default/a".into(), r2),
            (Deleted, "default/a".into(), r3)
        ]
    );
    // DELETED carries the last state, stamped with the deletion revision.
    let deleted = take_last_deleted(&mut client, r2).await;
    assert_eq!(deleted.0.get("x").map(String::as_str), Some("y"));
    assert_eq!(deleted.1, r3.to_string());
}

/// Re-reads the DELETED event by resuming from `after`.
async fn take_last_deleted(
    client: &mut watchproxy::pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
    after: u64,
) -> (std::collections::BTreeMap<String, String>, String) {
    let mut stream = client
        .watch(watch_req("pods", &after.to_string()))
        .await
        .unwrap()
        .into_inner();
    let e = take_events(&mut stream, 1).await.remove(0);
    assert_eq!(e.r#type, Deleted as i32);
    let o = e.object.unwrap();
    (o.labels, o.resource_version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_version_gets_exactly_the_later_events() {
    let (etcd, _proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;

    let mut revs = Vec::new();
    for i in 0..30 {
        revs.push(put_pod(&mut ec, "default", &format!("p{}", i % 7), &[], "").await);
    }
    // Writes elsewhere do not appear.
    ec.put("/other/key", "x", None).await.unwrap();
    for from in [revs[0], revs[12], revs[29]] {
        let mut stream = client
            .watch(watch_req("pods", &from.to_string()))
            .await
            .unwrap()
            .into_inner();
        let want: Vec<u64> = revs.iter().copied().filter(|r| *r > from).collect();
        let got: Vec<u64> = take_versions(&mut stream, want.len()).await;
        assert_eq!(got, want, "resume from {from}");
        // Nothing more than that: the next event is the next write.
        let next = put_pod(&mut ec, "default", "after", &[], "").await;
        revs.push(next);
        assert_eq!(summary(&take_events(&mut stream, 1).await[0]).2, next);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_before_the_window_is_out_of_range_with_the_current_version() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..5 {
        put_pod(&mut ec, "default", &format!("p{i}"), &[], "").await;
    }
    // etcd keeps history from 6 on, so the window read at start does too.
    ec.compact(6, None).await.unwrap();
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let err = client.watch(watch_req("pods", "2")).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("too old resource version"),
        "{}",
        err.message()
    );
    assert!(err.message().contains("current: 6"), "{}", err.message());
    assert_eq!(
        err.metadata()
            .get("watchproxy-current-resource-version")
            .unwrap(),
        "6"
    );
    // From the compaction point on, a resume is exact.
    assert!(client.watch(watch_req("pods", "5")).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_initial_events_ends_with_a_bookmark_then_streams_changes() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "a", "x", &[("app", "web")], "").await;
    put_pod(&mut ec, "a", "y", &[("app", "db")], "").await;
    let last = put_pod(&mut ec, "b", "z", &[("app", "web")], "").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let req = WatchRequest {
        label_selector: "app=web".into(),
        send_initial_events: true,
        allow_bookmarks: true,
        ..watch_req("pods", "")
    };
    let mut stream = open_watch(&mut client, req).await;
    let mut initial = Vec::new();
    let end = loop {
        let e = next_event(&mut stream).await.unwrap().unwrap();
        if e.r#type == Bookmark as i32 {
            break e;
        }
        initial.push(summary(&e));
    };
    assert!(end.initial_events_end);
    assert!(end.object.unwrap().resource_version.parse::<u64>().unwrap() >= last);
    assert_eq!(
        initial
            .iter()
            .map(|s| (s.0, s.1.as_str()))
            .collect::<Vec<_>>(),
        [(Added, "a/x"), (Added, "b/z")]
    );
    let r = put_pod(&mut ec, "c", "w", &[("app", "web")], "").await;
    assert_eq!(
        summary(&take_events(&mut stream, 1).await[0]),
        (Added, "c/w".into(), r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watchers_that_allow_bookmarks_get_them_periodically() {
    let (etcd, _proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;

    let with = WatchRequest {
        allow_bookmarks: true,
        ..watch_req("pods", "0")
    };
    let mut with = open_watch(&mut client, with).await;
    let without = WatchRequest {
        timeout_seconds: 4,
        ..watch_req("pods", "0")
    };
    let mut without = open_watch(&mut client, without).await;
    // Another prefix moves etcd's revision; progress notifications carry it
    // to the idle resource, and bookmarks to its watchers.
    let elsewhere = ec
        .put("/other/x", "1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision() as u64;
    let mut newest = 0;
    for _ in 0..10 {
        let e = next_event(&mut with).await.unwrap().unwrap();
        assert_eq!(e.r#type, Bookmark as i32);
        let o = e.object.unwrap();
        assert!(
            o.name.is_empty() && o.value.is_empty(),
            "a bookmark carries only a version"
        );
        newest = o.resource_version.parse().unwrap();
        if newest >= elsewhere {
            break;
        }
    }
    assert!(newest >= elsewhere, "bookmarks advance with etcd progress");
    // The watcher that did not ask for bookmarks sees nothing until its
    // timeout ends the stream cleanly.
    assert!(next_event(&mut without).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_timeout_ends_the_stream_with_ok() {
    let (_etcd, proxy, mut client) = start_ready().await;
    let started = std::time::Instant::now();
    let req = WatchRequest {
        timeout_seconds: 1,
        ..watch_req("pods", "0")
    };
    let mut stream = open_watch(&mut client, req).await;
    assert!(
        next_event(&mut stream).await.unwrap().is_none(),
        "the stream ends with OK"
    );
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"timeout\""
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_the_client_cancels_ends_even_when_nothing_is_sent_to_it() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let watchers = || proxy.metric("watchproxy_watchers", "resource=\"pods\"");
    let gone = || {
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"client_gone\"",
        )
    };
    // Both on one connection, which stays open: one watch sees every
    // change, the other's selector matches nothing, so nothing is sent
    // on its stream after the client resets it.
    let mut busy = open_watch(&mut client, watch_req("pods", "0")).await;
    let idle = open_watch(
        &mut client,
        WatchRequest {
            field_selector: "spec.nodeName=nowhere".into(),
            ..watch_req("pods", "0")
        },
    )
    .await;
    wait_until("both watches registered", || watchers() == 2.0).await;
    assert_eq!(watchers(), 2.0, "both watches registered");
    drop(idle);
    wait_until("the cancelled watch ended", || {
        watchers() == 1.0 && gone() == 1.0
    })
    .await;
    assert_eq!(
        (watchers(), gone()),
        (1.0, 1.0),
        "the cancelled watch ended within 10 s"
    );
    let r = put_pod(&mut ec, "ns", "after", &[], "node-1").await;
    assert_eq!(take_versions(&mut busy, 1).await, vec![r]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_object_watch_sees_only_that_object() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "target", &[], "").await;
    put_pod(&mut ec, "other", "target", &[], "").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let req = WatchRequest {
        namespace: "ns".into(),
        name: "target".into(),
        ..watch_req("pods", "")
    };
    let mut stream = open_watch(&mut client, req).await;
    assert_eq!(
        summary(&take_events(&mut stream, 1).await[0]).1,
        "ns/target"
    );
    put_pod(&mut ec, "ns", "bystander", &[], "").await;
    put_pod(&mut ec, "other", "target", &[("v", "2")], "").await;
    let r = put_pod(&mut ec, "ns", "target", &[("v", "2")], "").await;
    assert_eq!(
        summary(&take_events(&mut stream, 1).await[0]),
        (Modified, "ns/target".into(), r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_turn_changes_into_added_and_deleted_per_watcher() {
    let (etcd, _proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let watch = |field: &str, label: &str| WatchRequest {
        field_selector: field.into(),
        label_selector: label.into(),
        ..watch_req("pods", "0")
    };
    let mut node1 = open_watch(&mut client, watch("spec.nodeName=node-1", "")).await;
    let mut node2 = open_watch(&mut client, watch("spec.nodeName=node-2", "")).await;
    let mut web = open_watch(&mut client, watch("", "app=web")).await;

    let r1 = put_pod(&mut ec, "ns", "p", &[], "node-1").await;
    let r2 = put_pod(&mut ec, "ns", "p", &[("app", "web")], "node-2").await;
    let r3 = put_pod(&mut ec, "ns", "p", &[], "node-2").await;
    let n1: Vec<_> = take_events(&mut node1, 2)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        n1,
        [(Added, "ns/p".into(), r1), (Deleted, "ns/p".into(), r2)]
    );
    let n2: Vec<_> = take_events(&mut node2, 2)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        n2,
        [(Added, "ns/p".into(), r2), (Modified, "ns/p".into(), r3)]
    );
    let w = take_events(&mut web, 2).await;
    assert_eq!(
        w.iter().map(summary).collect::<Vec<_>>(),
        [(Added, "ns/p".into(), r2), (Deleted, "ns/p".into(), r3)]
    );
    // The DELETED for the label watcher shows the last state it matched.
    assert_eq!(
        w[1].object
            .as_ref()
            .unwrap()
            .labels
            .get("app")
            .map(String::as_str),
        Some("web")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_watchers_share_one_etcd_watch_and_all_see_every_event() {
    const WATCHERS: usize = 300;
    const WRITES: usize = 25;
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let before = etcd.metric("etcd_debugging_mvcc_watcher_total");

    let mut streams = Vec::new();
    for i in 0..WATCHERS {
        // Spread over a few connections, as real clients would be.
        let mut c = if i % 50 == 0 {
            proxy.client().await
        } else {
            client.clone()
        };
        streams.push(open_watch(&mut c, watch_req("pods", "0")).await);
        if i % 50 == 0 {
            client = c;
        }
    }
    let mut revs = Vec::new();
    for i in 0..WRITES {
        revs.push(put_pod(&mut ec, "ns", &format!("p{i}"), &[], "").await);
    }
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let got: Vec<u64> = take_versions(&mut s, WRITES).await;
                (got, s)
            })
        })
        .collect();
    let mut open = Vec::new();
    for r in readers {
        let (got, stream) = r.await.unwrap();
        assert_eq!(got, revs, "every watcher sees every event, in order");
        open.push(stream);
    }
    // One etcd watch per configured resource (three here), however many clients.
    let watchers = etcd.metric("etcd_debugging_mvcc_watcher_total");
    assert_eq!(
        watchers, 3.0,
        "etcd watchers before clients: {before}, after: {watchers}"
    );
    assert_eq!(
        proxy.metric("watchproxy_watchers", "resource=\"pods\""),
        WATCHERS as f64
    );
    // Each event was encoded once, however many watchers got it.
    assert_eq!(
        proxy.metric("watchproxy_encodings_total", "resource=\"pods\""),
        WRITES as f64
    );
    assert!(
        proxy.metric("watchproxy_deliveries_total", "resource=\"pods\"")
            >= (WATCHERS * WRITES) as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_compressed_when_accepted_whether_or_not_the_request_is() {
    use tonic::codec::CompressionEncoding::Gzip;
    let (etcd, proxy, client) = start_ready().await;
    let mut ec = etcd.client().await;
    let start = put_pod(&mut ec, "default", "a", &[], "").await;
    // Served by the connection itself; the other, with its request
    // compressed, by the gRPC routes; a third does not accept gzip.
    let plain = client.clone().accept_compressed(Gzip);
    let compressed = plain.clone().send_compressed(Gzip);
    let mut streams = Vec::new();
    for (mut c, encoding) in [
        (plain, Some("gzip")),
        (compressed, Some("gzip")),
        (client, None),
    ] {
        let answer = c
            .watch(watch_req("pods", &start.to_string()))
            .await
            .unwrap();
        let got = answer.metadata().get("grpc-encoding");
        assert_eq!(got.map(|v| v.to_str().unwrap()), encoding);
        streams.push(answer.into_inner());
    }
    let next = put_pod(&mut ec, "default", "b", &[], "").await;
    for s in &mut streams {
        assert_eq!(take_versions(s, 1).await, [next]);
    }

    // Switched off, no watch is compressed.
    let mut config =
        watchproxy::config::Config::from_yaml(&pods_yaml(&etcd.client_url, 64)).unwrap();
    config.watch.compression = Vec::new();
    let off = Proxy::start_config(config).await;
    let mut c = off.client().await.accept_compressed(Gzip);
    wait_ready(&mut c, "pods").await;
    let answer = c
        .watch(watch_req("pods", &start.to_string()))
        .await
        .unwrap();
    assert_eq!(answer.metadata().get("grpc-encoding"), None);
    assert_eq!(take_versions(&mut answer.into_inner(), 1).await, [next]);
    drop((proxy, off));
}
