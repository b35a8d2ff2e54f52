//! Failures on either side: etcd restarts, compaction while watchproxy is
//! cut off, slow clients, undecodable values and shutdown. Watchers either
//! continue without a gap or get an error they can resume from.

mod common;

use std::time::Duration;

use common::*;
use tonic::transport::Channel;
use tonic::Code;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::EventType;

use EventType::{Added, Deleted, Modified};

/// Watches from `from` until `done` says the versions seen are enough,
/// resuming after each resumable error from the version the error names
/// (or the last one seen). Returns the events' versions and the number of
/// resumes.
async fn follow(
    client: &mut WatchProxyClient<Channel>,
    from: u64,
    done: impl Fn(&[u64]) -> bool,
) -> (Vec<u64>, usize) {
    let mut seen = Vec::new();
    let mut last = from;
    let mut resumes = 0;
    while !done(&seen) {
        let stream = client.watch(watch_req("pods", &last.to_string())).await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(e) if e.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => panic!("watch from {last}: {e:?}"),
        };
        loop {
            match next_event(&mut stream).await {
                Ok(Some(e)) if e.r#type == EventType::Bookmark as i32 => {}
                Ok(Some(e)) => {
                    let rv = summary(&e).2;
                    seen.push(rv);
                    last = rv;
                    if done(&seen) {
                        break;
                    }
                }
                Ok(None) => panic!("stream ended without an error"),
                Err(s) => {
                    assert!(
                        matches!(s.code(), Code::Aborted | Code::Unavailable),
                        "{s:?}"
                    );
                    if s.metadata()
                        .contains_key("watchproxy-resume-resource-version")
                    {
                        last = resume_version(&s);
                    }
                    resumes += 1;
                    break;
                }
            }
        }
    }
    (seen, resumes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_recovers_when_etcd_restarts_and_watchers_see_no_gap() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let start = list_version(&mut client, "pods", "").await;

    // The watch is open across the restart.
    let mut watcher = client.clone();
    let follower = tokio::spawn(async move {
        let distinct = |seen: &[u64]| {
            let mut d = seen.to_vec();
            d.dedup();
            d.len() >= 20
        };
        tokio::time::timeout(
            Duration::from_secs(30),
            follow(&mut watcher, start, distinct),
        )
        .await
        .expect("the watch catches up after etcd restarts")
    });
    let mut revs = Vec::new();
    let mut ec = etcd.client().await;
    for i in 0..10 {
        revs.push(put_pod(&mut ec, "ns", &format!("before-{i}"), &[], "").await);
    }
    etcd.restart().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        revs.push(put_pod(&mut ec, "ns", &format!("after-{i}"), &[], "").await);
    }
    let (seen, _) = follower.await.unwrap();
    let mut dedup = seen.clone();
    dedup.dedup();
    assert_eq!(
        dedup, revs,
        "every event once, in order, across the restart"
    );
    assert_eq!(
        proxy.metric("watchproxy_relists_total", "resource=\"pods\""),
        0.0,
        "a restart needs no relist"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_while_cut_off_relists_and_emits_the_difference() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "keep", &[], "").await;
    put_pod(&mut ec, "ns", "change", &[("v", "1")], "").await;
    put_pod(&mut ec, "ns", "gone", &[], "").await;
    let proxy = Proxy::start(&forwarder.url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let mut stream = open_watch(&mut client, watch_req("pods", "")).await;
    assert_eq!(take_events(&mut stream, 3).await.len(), 3);
    let before = list_version(&mut client, "pods", "0").await;

    forwarder.cut();
    put_pod(&mut ec, "ns", "change", &[("v", "2")], "").await;
    let changed = put_pod(&mut ec, "ns", "change", &[("v", "3")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/gone").await;
    let added = put_pod(&mut ec, "ns", "new", &[], "").await;
    let compact_at = put_pod(&mut ec, "ns", "short-lived", &[], "").await;
    let last = delete_key(&mut ec, "/registry/pods/ns/short-lived").await;
    ec.compact(compact_at as i64, None).await.unwrap();
    forwarder.restore();

    let got: Vec<_> = take_events(&mut stream, 3)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        got,
        [
            (Modified, "ns/change".into(), changed),
            (Added, "ns/new".into(), added),
            (Deleted, "ns/gone".into(), last),
        ],
        "the difference, each change at its own revision, deletions at the list revision"
    );
    assert_eq!(
        proxy.metric("watchproxy_relists_total", "resource=\"pods\""),
        1.0
    );
    // A client that saw the state before the outage resumes through the
    // same difference from the window.
    let mut resumed = client
        .watch(watch_req("pods", &before.to_string()))
        .await
        .unwrap()
        .into_inner();
    let again: Vec<_> = take_events(&mut resumed, 3)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(again, got);
    let names: Vec<String> = list_items(&mut client, "pods")
        .await
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(names, ["change", "keep", "new"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_aborted_and_resumes_without_loss_while_a_fast_one_keeps_up() {
    const WRITES: usize = 600;
    let etcd = Etcd::start().await;
    let proxy = Proxy::start_with(&etcd.client_url, 16).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let start: u64 = list_version(&mut client, "pods", "").await;

    // The slow client has a connection of its own and does not read.
    let mut slow_client = proxy.client().await;
    let mut slow = slow_client
        .watch(watch_req("pods", &start.to_string()))
        .await
        .unwrap()
        .into_inner();
    let mut fast = client
        .watch(watch_req("pods", &start.to_string()))
        .await
        .unwrap()
        .into_inner();
    let fast_reader = tokio::spawn(async move {
        take_events(&mut fast, WRITES)
            .await
            .iter()
            .map(|e| summary(e).2)
            .collect::<Vec<_>>()
    });
    let mut ec = etcd.client().await;
    let big = "x".repeat(8 * 1024);
    let mut revs = Vec::new();
    for i in 0..WRITES {
        let key = format!("/registry/pods/ns/p{}", i % 50);
        let value = format!(r#"{{"metadata":{{"labels":{{"i":"{i}"}}}},"pad":"{big}"}}"#);
        revs.push(
            ec.put(key, value, None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision() as u64,
        );
    }
    assert_eq!(
        fast_reader.await.unwrap(),
        revs,
        "the fast watcher got everything"
    );

    // Now the slow one reads: what was queued, then ABORTED with a version.
    let mut got = Vec::new();
    let (status, delivered) = until_error(&mut slow).await;
    got.extend(delivered);
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let resume = resume_version(&status);
    assert!(
        got.len() < WRITES,
        "the slow watcher was cut before the end"
    );
    assert!(status.message().contains(&resume.to_string()));
    assert_eq!(
        proxy.metric("watchproxy_watchers_ended_total", "reason=\"slow\""),
        1.0
    );
    let end = *revs.last().unwrap();
    let (rest, _) = follow(&mut slow_client, resume, |seen: &[u64]| {
        seen.last() == Some(&end)
    })
    .await;
    let mut all: Vec<u64> = got.into_iter().filter(|r| *r <= resume).collect();
    all.extend(rest);
    assert_eq!(all, revs, "delivered + resumed = every event exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_values_are_skipped_and_counted_without_stopping_the_stream() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    ec.put("/registry/pods/ns/listed-bad", "not json", None)
        .await
        .unwrap();
    ec.put("/registry/pods/no-namespace", "{}", None)
        .await
        .unwrap();
    put_pod(&mut ec, "ns", "good", &[], "").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    assert_eq!(list_items(&mut client, "pods").await.len(), 1);
    assert_eq!(
        proxy.metric("watchproxy_undecodable_values_total", "resource=\"pods\""),
        2.0
    );

    let mut stream = open_watch(&mut client, watch_req("pods", "0")).await;
    take_events(&mut stream, 1).await;
    ec.put("/registry/pods/ns/watched-bad", "{\"metadata\":", None)
        .await
        .unwrap();
    ec.put(
        "/registry/pods/ns/labels-bad",
        r#"{"metadata":{"labels":{"a":1}}}"#,
        None,
    )
    .await
    .unwrap();
    // A known object whose new value is undecodable leaves the cache.
    let gone = ec
        .put("/registry/pods/ns/good", "[]", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision() as u64;
    let fine = put_pod(&mut ec, "ns", "fine", &[], "").await;
    let got: Vec<_> = take_events(&mut stream, 2)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        got,
        [
            (Deleted, "ns/good".into(), gone),
            (Added, "ns/fine".into(), fine)
        ]
    );
    assert_eq!(
        proxy.metric("watchproxy_undecodable_values_total", "resource=\"pods\""),
        5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_watches_with_unavailable_and_the_version_to_resume_from() {
    let (etcd, mut proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut stream = open_watch(&mut client, watch_req("pods", "0")).await;
    let rev = put_pod(&mut ec, "ns", "a", &[], "").await;
    take_events(&mut stream, 1).await;

    let reader = tokio::spawn(async move { until_error(&mut stream).await.0 });
    proxy.stop().await;
    let status = reader.await.unwrap();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(resume_version(&status) >= rev);
}
