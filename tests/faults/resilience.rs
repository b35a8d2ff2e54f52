//! Failures on either side: etcd restarts, compaction while watchproxy is
//! cut off, stalled clients, undecodable values and shutdown. Watchers either
//! continue without a gap or get an error they can resume from.

use std::time::Duration;

use crate::common::*;
use tonic::transport::Channel;
use tonic::Code;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, EventType};

use EventType::{Added, Bookmark, Deleted, Modified};

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
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
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

/// (type, namespace/name, value, version, resume version, resync) of an
/// event.
type Shown = (EventType, String, String, u64, u64, bool);

fn shown(e: &pb::WatchEvent) -> Shown {
    let (kind, name, rv) = summary(e);
    let o = e.object.clone().unwrap_or_default();
    let name = if kind == Bookmark {
        String::new()
    } else {
        name
    };
    let resume = e.resume_resource_version.parse().unwrap_or(0);
    let value = String::from_utf8(o.value.to_vec()).unwrap();
    (kind, name, value, rv, resume, e.resync)
}

/// The next `n` events of `stream`, bookmarks that close nothing left out.
async fn take_shown(stream: &mut tonic::Streaming<pb::WatchEvent>, n: usize) -> Vec<Shown> {
    let mut got = Vec::new();
    while got.len() < n {
        let e = next_event(stream)
            .await
            .unwrap()
            .expect("the stream goes on");
        if e.r#type != Bookmark as i32 || e.resync {
            got.push(shown(&e));
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_while_cut_off_resyncs_open_watches_with_each_objects_own_version() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "keep", &[], "").await;
    put_pod(&mut ec, "ns", "change", &[("v", "1")], "").await;
    put_pod(&mut ec, "ns", "gone", &[], "").await;
    let proxy = Proxy::start(&forwarder.url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let watch = |rv: &str, allow_bookmarks: bool| pb::WatchRequest {
        allow_bookmarks,
        ..watch_req("pods", rv)
    };
    let mut marked = open_watch(&mut client, watch("", true)).await;
    let mut plain = open_watch(&mut client, watch("", false)).await;
    assert_eq!(take_events(&mut marked, 3).await.len(), 3);
    assert_eq!(take_events(&mut plain, 3).await.len(), 3);
    let before = list_version(&mut client, "pods", "0").await;

    forwarder.cut();
    put_pod(&mut ec, "ns", "change", &[("v", "2")], "").await;
    put_pod(&mut ec, "ns", "change", &[("v", "3")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/gone").await;
    put_pod(&mut ec, "ns", "new", &[], "").await;
    let compact_at = put_pod(&mut ec, "ns", "short-lived", &[], "").await;
    let last = delete_key(&mut ec, "/registry/pods/ns/short-lived").await;
    ec.compact(compact_at as i64, None).await.unwrap();
    forwarder.restore();

    // What etcd holds at the list's version, each key with its own mod
    // revision; the deleted key is shown at the list's version.
    let at_last = |name: &str| {
        let mut ec = ec.clone();
        let key = format!("/registry/pods/ns/{name}");
        async move {
            let got = ec
                .get(
                    key,
                    Some(etcd_client::GetOptions::new().with_revision(last as i64)),
                )
                .await
                .unwrap();
            let kv = &got.kvs()[0];
            (kv.value_str().unwrap().to_owned(), kv.mod_revision() as u64)
        }
    };
    let (change, change_rev) = at_last("change").await;
    let (new, new_rev) = at_last("new").await;
    let gone = pod_json("gone", "ns", &[], "");
    let expected: Vec<Shown> = vec![
        (
            Modified,
            "ns/change".into(),
            change,
            change_rev,
            before,
            true,
        ),
        (Deleted, "ns/gone".into(), gone, last, before, true),
        (Added, "ns/new".into(), new, new_rev, before, true),
        (Bookmark, String::new(), String::new(), last, last, true),
    ];
    assert_eq!(
        take_shown(&mut marked, 4).await,
        expected,
        "a resync, marked, from {before} to {last}, each object at its own version"
    );
    // Without bookmarks: the same events, and no closing bookmark; the
    // first event after them is not marked.
    let after_it = put_pod(&mut ec, "ns", "later", &[], "").await;
    let mut without = take_shown(&mut plain, 4).await;
    assert_eq!(without[..3], expected[..3]);
    let later = without.pop().unwrap();
    assert_eq!(
        (later.0, later.1.as_str(), later.3, later.4, later.5),
        (Added, "ns/later", after_it, after_it, false)
    );
    assert_eq!(
        proxy.metric("watchproxy_relists_total", "resource=\"pods\""),
        1.0
    );
    // A client that saw the state before the outage resumes through the
    // same resync from the window; one inside the lost history is refused;
    // one from the bookmark resumes after it.
    let mut resumed = open_watch(&mut client, watch(&before.to_string(), true)).await;
    assert_eq!(take_shown(&mut resumed, 4).await, expected);
    let inside = client
        .watch(watch(&(before + 1).to_string(), true))
        .await
        .map(|r| r.into_inner());
    let refused = match inside {
        Err(status) => status,
        Ok(mut s) => s.message().await.expect_err("refused"),
    };
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let mut from_end = open_watch(&mut client, watch(&last.to_string(), true)).await;
    let e = take_events(&mut from_end, 1).await;
    assert_eq!(summary(&e[0]), (Added, "ns/later".into(), after_it));
    assert_eq!(e[0].resume_resource_version, after_it.to_string());
    assert!(!e[0].resync);
    let items = list_items(&mut client, "pods").await;
    let names: Vec<&str> = items.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["change", "keep", "later", "new"]);
    let change = items.iter().find(|o| o.name == "change").unwrap();
    assert_eq!(change.resource_version, change_rev.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_history_lost_end_a_compaction_while_cut_off_ends_open_watches() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "").await;
    let yaml = pods_yaml(&forwarder.url, 64).replace(
        "    indexed_fields: [spec.nodeName]\n",
        "    indexed_fields: [spec.nodeName]\n    cache: {on_history_lost: end}\n",
    );
    let proxy = Proxy::start_config(watchproxy::config::Config::from_yaml(&yaml).unwrap()).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let mut stream = open_watch(&mut client, watch_req("pods", "")).await;
    assert_eq!(take_events(&mut stream, 1).await.len(), 1);
    let before = list_version(&mut client, "pods", "0").await;

    forwarder.cut();
    put_pod(&mut ec, "ns", "b", &[], "").await;
    let compact_at = put_pod(&mut ec, "ns", "c", &[], "").await;
    ec.compact(compact_at as i64, None).await.unwrap();
    forwarder.restore();

    let ended = loop {
        match next_event(&mut stream).await {
            Ok(Some(e)) if e.r#type == EventType::Bookmark as i32 => {}
            Ok(other) => panic!("no events of a lost history: {other:?}"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::OutOfRange, "{ended:?}");
    // Resuming from before is refused; a new list and watch go on.
    let resumed = client.watch(watch_req("pods", &before.to_string())).await;
    let refused = match resumed {
        Err(status) => status,
        Ok(s) => s.into_inner().message().await.expect_err("refused"),
    };
    assert_eq!(refused.code(), Code::OutOfRange);
    assert_eq!(list_items(&mut client, "pods").await.len(), 3);
}

/// The events `write_big(_, writes)` makes.
fn events_written(writes: usize) -> usize {
    (0..writes).map(|i| if i % 7 == 0 { 3 } else { 1 }).sum()
}

/// Writes `writes` changes of ~8 KiB to pods, every seventh one a
/// transaction of three keys; returns each event's revision in order.
async fn write_big(ec: &mut etcd_client::Client, writes: usize) -> Vec<u64> {
    use etcd_client::{Txn, TxnOp};
    let big = "x".repeat(8 * 1024);
    let value = |i: usize| format!(r#"{{"metadata":{{"labels":{{"i":"{i}"}}}},"pad":"{big}"}}"#);
    let mut revs = Vec::new();
    for i in 0..writes {
        let key = |k: usize| format!("/registry/pods/ns/p{}", (i + k) % 50);
        let (revision, events) = if i % 7 == 0 {
            let puts: Vec<TxnOp> = (0..3)
                .map(|k| TxnOp::put(key(k * 17), value(i), None))
                .collect();
            let r = ec.txn(Txn::new().and_then(puts)).await.unwrap();
            (r.header().unwrap().revision(), 3)
        } else {
            let r = ec.put(key(0), value(i), None).await.unwrap();
            (r.header().unwrap().revision(), 1)
        };
        revs.extend(std::iter::repeat_n(revision as u64, events));
    }
    revs
}

/// Opens, from the current version, a watch on a connection of its own
/// that does not read and one that does; writes `writes` big changes and
/// checks the reading watch got every event. Returns the unread watch (with
/// its client, which holds the connection) and the events' revisions.
async fn stall_one_while_writing(
    etcd: &Etcd,
    proxy: &Proxy,
    writes: usize,
) -> (
    WatchProxyClient<Channel>,
    tonic::Streaming<pb::WatchEvent>,
    Vec<u64>,
) {
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let start: u64 = list_version(&mut client, "pods", "").await;
    let mut stalled_client = proxy.client().await;
    let stalled = open_watch(&mut stalled_client, watch_req("pods", &start.to_string())).await;
    let mut reading = open_watch(&mut client, watch_req("pods", &start.to_string())).await;
    let mut ec = etcd.client().await;
    let writer = tokio::spawn(async move { write_big(&mut ec, writes).await });
    let seen: Vec<u64> = take_versions(&mut reading, events_written(writes)).await;
    let revs = writer.await.unwrap();
    assert_eq!(seen, revs, "the reading watcher got everything");
    (stalled_client, stalled, revs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watcher_falls_behind_and_catches_up_from_the_window_without_loss() {
    const WRITES: usize = 600;
    let etcd = Etcd::start().await;
    let proxy = Proxy::start_with(&etcd.client_url, 16).await;
    let (_stalled_client, mut stalled, revs) = stall_one_while_writing(&etcd, &proxy, WRITES).await;
    assert!(
        proxy.metric("watchproxy_watchers_fell_behind_total", "resource=\"pods\"") >= 1.0,
        "the stalled watcher's queue filled"
    );

    // The stalled one reads now: everything, in order, exactly once, part
    // of it from the window, and then it is live again.
    let caught_up: Vec<u64> = take_versions(&mut stalled, revs.len()).await;
    assert_eq!(caught_up, revs, "every event exactly once, in order");
    assert!(proxy.metric("watchproxy_replayed_events_total", "resource=\"pods\"") > 0.0);
    let mut ec = etcd.client().await;
    let live = put_pod(&mut ec, "ns", "after", &[], "").await;
    let e = next_event(&mut stalled).await.unwrap().unwrap();
    assert_eq!(summary(&e), (Added, "ns/after".into(), live));
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"expired\""
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_the_window_is_ended_out_of_range_and_relists() {
    let etcd = Etcd::start().await;
    let yaml = pods_yaml(&etcd.client_url, 64);
    let mut config = watchproxy::config::Config::from_yaml(&yaml).unwrap();
    let window = &mut config.resources[0].cache;
    (window.min_events, window.max_events, window.freshness) = (128, 128, Duration::ZERO);
    let proxy = Proxy::start_config(config).await;
    // More than the client connection buffers (flow-control windows).
    let (_stalled_client, mut stalled, revs) = stall_one_while_writing(&etcd, &proxy, 1000).await;

    let (status, delivered) = until_error(&mut stalled).await;
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("fell behind"), "{status:?}");
    let info = tonic_types::StatusExt::get_error_details(&status)
        .error_info()
        .cloned()
        .unwrap();
    assert_eq!(info.reason, "FELL_OUT_OF_WINDOW");
    assert!(info.metadata.contains_key("oldest_resource_version"));
    assert_eq!(
        delivered[..],
        revs[..delivered.len()],
        "what was delivered has no gap"
    );
    assert!(delivered.len() < revs.len());
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"expired\""
        ),
        1.0
    );
    // The client re-lists and watches from the list: nothing is lost.
    let mut client = proxy.client().await;
    let now = list_version(&mut client, "pods", "").await;
    assert_eq!(now, *revs.last().unwrap());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_does_not_answer_pings_is_closed_and_one_that_does_stays() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let etcd = Etcd::start().await;
    let config = pods_config_with_limits(
        &etcd.client_url,
        "max_concurrent_unary: 4096\n  keepalive_interval: 200ms\n  keepalive_timeout: 200ms",
    );
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let mut answering = open_watch(&mut client, watch_req("pods", "0")).await;

    // A peer that opens HTTP/2 and then goes silent.
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    silent
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut read))
        .await
        .expect("the silent connection is closed")
        .unwrap();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= read.len() {
        let len = u32::from_be_bytes([0, read[at], read[at + 1], read[at + 2]]) as usize;
        frames.push((read[at + 3], read[at + 4]));
        at += 9 + len;
    }
    assert!(
        frames.contains(&(6, 0)),
        "a PING before the close: {frames:?}"
    );

    // The client that answers (h2 does by itself) still gets events.
    let mut ec = etcd.client().await;
    let rev = put_pod(&mut ec, "ns", "after-pings", &[], "").await;
    let event = take_events(&mut answering, 1).await.remove(0);
    assert_eq!(summary(&event).2, rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aged_connection_ends_its_watches_with_the_version_to_resume_from() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let yaml = pods_yaml(&etcd.client_url, 64).replace(
        "limits:\n",
        "limits:\n  max_connection_age: 2s\n  max_connection_age_grace: 1s\n",
    );
    let proxy = Proxy::start_config(watchproxy::config::Config::from_yaml(&yaml).unwrap()).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let from = list_version(&mut client, "pods", "").await;
    let mut stream = open_watch(&mut client, watch_req("pods", &from.to_string())).await;
    let first = put_pod(&mut ec, "ns", "a", &[], "").await;
    assert_eq!(take_versions(&mut stream, 1).await, [first]);

    // Within 2 s ± 10 %: UNAVAILABLE, naming the version to resume from.
    let started = std::time::Instant::now();
    let (status, _) = until_error(&mut stream).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let info = tonic_types::StatusExt::get_error_details(&status)
        .error_info()
        .cloned()
        .unwrap();
    assert_eq!(info.reason, "CONNECTION_AGED");
    // The last version all of whose events the watch was sent: the
    // window shows that the one event of `first` was its whole revision.
    let resume: u64 = info.metadata["resume_resource_version"].parse().unwrap();
    assert_eq!(resume, first);

    // A new connection resumes from it without a gap, and nothing comes
    // twice.
    let second = put_pod(&mut ec, "ns", "b", &[], "").await;
    let mut fresh = proxy.client().await;
    let mut resumed = open_watch(&mut fresh, watch_req("pods", &resume.to_string())).await;
    assert_eq!(take_versions(&mut resumed, 1).await, [second]);
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"connection_aged\""
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_long_outage_watches_recover_soon_after_etcd_answers_not_after_the_backoff() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "before", &[], "").await;
    let proxy = Proxy::start(&forwarder.url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let rv = list_version(&mut client, "pods", "0").await;
    let mut stream = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;

    // Long enough for the reflector's backoff to reach several seconds
    // (from 100 ms, doubling, jittered).
    forwarder.cut();
    tokio::time::sleep(Duration::from_secs(20)).await;
    forwarder.restore();
    let restored = std::time::Instant::now();
    let written = put_pod(&mut ec, "ns", "after", &[], "").await;
    assert_eq!(take_versions(&mut stream, 1).await, [written]);
    let took = restored.elapsed();
    println!("the watch delivered {took:?} after etcd was reachable again");
    // Within a second of the first probe that finds etcd back, probes
    // coming at most once a second: well before a backoff of seconds ends.
    assert!(
        took < Duration::from_secs(3),
        "the watch went on {took:?} after etcd was back"
    );
}

/// etcd compacted to its head, with one resource's prefix empty: the
/// history read at start begins at the compaction point, where no state
/// before it can be read, and the cache still becomes ready at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cache_starts_when_etcd_is_compacted_to_its_head() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "n").await;
    put_pod(&mut ec, "ns", "a", &[("v", "2")], "n").await;
    compact_all(&mut ec).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    // `nodes` has no key at all.
    for resource in ["pods", "nodes"] {
        tokio::time::timeout(Duration::from_secs(10), wait_ready(&mut client, resource))
            .await
            .unwrap_or_else(|_| panic!("{resource} ready within 10 s"));
    }
}
