//! etcd's own API served from the caches, tried with etcd's clients: the
//! Rust `etcd-client` and `etcdctl`, each call made against etcd itself
//! and against watchproxy and compared field for field.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, SortOrder, SortTarget, Txn,
    TxnOp, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use watchproxy::config::{Config, ServePath};

const PATHS: [ServePath; 2] = [ServePath::Fast, ServePath::Tonic];

fn config(etcd: &Etcd, path: ServePath) -> Config {
    let yaml = pods_yaml(&etcd.client_url, 256).replace(
        "resources:",
        "etcd_api: {enabled: true}\nresources:",
    );
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config
}

/// watchproxy with etcd's API, and an etcd client of it once its caches
/// answer.
async fn proxy(etcd: &Etcd, path: ServePath) -> (Proxy, Client) {
    let proxy = Proxy::start_config(config(etcd, path)).await;
    let mut client = Client::connect([format!("http://{}", proxy.addr)], None)
        .await
        .unwrap();
    let mut last = None;
    for _ in 0..100 {
        let pods = client.get("/registry/pods/", Some(GetOptions::new().with_prefix())).await;
        let nodes = client.get("/registry/minions/", Some(GetOptions::new().with_prefix())).await;
        match pods.and(nodes) {
            Ok(_) => return (proxy, client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("watchproxy's etcd API did not answer within 10 s: {last:?}");
}

/// A pair as every field of it reads.
type Kv = (String, i64, i64, i64, String, i64);

fn kv(kv: &KeyValue) -> Kv {
    (
        kv.key_str().unwrap().to_owned(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.value_str().unwrap().to_owned(),
        kv.lease(),
    )
}

/// Writes of every kind etcd records: creations, a transaction of two
/// keys, an update, a key with a lease, a deletion, and keys of other
/// resources and of none. Returns etcd's revision after them.
async fn write_history(c: &mut Client) -> i64 {
    put_pod(c, "ns-1", "web-1", &[("app", "web")], "node-1").await;
    put_pod(c, "ns-1", "web-2", &[("app", "web")], "node-2").await;
    put_pod(c, "ns-2", "db-1", &[("app", "db")], "node-1").await;
    let txn = Txn::new()
        .when([Compare::version("/registry/pods/ns-2/db-2", CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put("/registry/pods/ns-2/db-2", pod_json("db-2", "ns-2", &[], "node-2"), None),
            TxnOp::put("/registry/pods/ns-1/web-1", pod_json("web-1", "ns-1", &[("v", "2")], "node-1"), None),
        ]);
    c.txn(txn).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    let leased = pod_json("leased", "ns-3", &[], "node-3");
    let options = etcd_client::PutOptions::new().with_lease(lease);
    c.put("/registry/pods/ns-3/leased", leased, Some(options)).await.unwrap();
    put_pod(c, "ns-1", "web-2", &[("app", "web"), ("v", "3")], "node-2").await;
    delete_key(c, "/registry/pods/ns-2/db-1").await;
    c.put("/registry/minions/node-1", "{}", None).await.unwrap();
    c.put("/registry/configmaps/ns-1/cm", "{}", None).await.unwrap();
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_answers_as_etcd_does() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    for path in PATHS {
        let (_proxy, mut w) = proxy(&etcd, path).await;
        let prefix = || GetOptions::new().with_prefix();
        let cases: Vec<(&str, &str, GetOptions)> = vec![
            ("a resource", "/registry/pods/", prefix()),
            ("a namespace", "/registry/pods/ns-1/", prefix()),
            ("part of a namespace", "/registry/pods/ns-1/web-", prefix()),
            ("one key", "/registry/pods/ns-3/leased", GetOptions::new()),
            ("an absent key", "/registry/pods/ns-9/none", GetOptions::new()),
            ("a limit", "/registry/pods/", prefix().with_limit(2)),
            ("keys only", "/registry/pods/", prefix().with_keys_only()),
            ("a count", "/registry/pods/", prefix().with_count_only()),
            ("serializable", "/registry/pods/", prefix().with_serializable()),
            ("a past revision", "/registry/pods/", prefix().with_revision(before + 3)),
            (
                "a past revision with a limit",
                "/registry/pods/",
                prefix().with_revision(before + 4).with_limit(1),
            ),
            (
                "sorted by mod revision, descending",
                "/registry/pods/",
                prefix().with_sort(SortTarget::Mod, SortOrder::Descend),
            ),
            (
                "sorted by version, limited",
                "/registry/pods/",
                prefix().with_sort(SortTarget::Version, SortOrder::Descend).with_limit(1),
            ),
            (
                "sorted by key, descending",
                "/registry/pods/",
                prefix().with_sort(SortTarget::Key, SortOrder::Descend),
            ),
            (
                "mod revisions from",
                "/registry/pods/",
                prefix().with_min_mod_revision(before + 4),
            ),
            (
                "create revisions up to",
                "/registry/pods/",
                prefix().with_max_create_revision(before + 3),
            ),
            ("a cluster-scoped resource", "/registry/minions/", prefix()),
        ];
        for (what, key, options) in cases {
            let want = e.get(key, Some(options.clone())).await.unwrap();
            let got = w.get(key, Some(options)).await.unwrap();
            let pairs = |r: &etcd_client::GetResponse| r.kvs().iter().map(kv).collect::<Vec<_>>();
            assert_eq!(pairs(&got), pairs(&want), "{path:?}, {what}");
            assert_eq!(
                (got.count(), got.more()),
                (want.count(), want.more()),
                "{path:?}, {what}: count and more"
            );
            assert_eq!(got.header().unwrap().revision(), head, "{path:?}, {what}");
        }
        assert!(
            w.get("/registry/pods/", Some(prefix())).await.unwrap().kvs().iter().any(|k| k.lease() != 0),
            "the lease is shown"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_etcd_refuses_or_watchproxy_does_not_serve_gets_a_clear_status() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let start = put_pod(&mut e, "ns-1", "a", &[], "n").await as i64;
    put_pod(&mut e, "ns-1", "a", &[("v", "2")], "n").await;
    e.compact(start + 1, None).await.unwrap();
    let (proxy, mut w) = proxy(&etcd, ServePath::Fast).await;
    let status = |r: Result<etcd_client::GetResponse, etcd_client::Error>| match r {
        Err(etcd_client::Error::GRpcStatus(s)) => (code_name(s.code()), s.message().to_owned()),
        other => panic!("a status, not {other:?}"),
    };
    // etcd's own messages, which its clients match on.
    let compacted = Some(GetOptions::new().with_prefix().with_revision(start));
    assert_eq!(status(e.get("/registry/pods/", compacted.clone()).await), status(w.get("/registry/pods/", compacted).await));
    let future = Some(GetOptions::new().with_prefix().with_revision(start + 100));
    assert_eq!(status(e.get("/registry/pods/", future.clone()).await), status(w.get("/registry/pods/", future).await));
    // Keys no one resource holds.
    for (key, options) in [
        ("/registry/configmaps/", GetOptions::new().with_prefix()),
        ("/registry/pods", GetOptions::new().with_prefix()),
        ("/registry/pods/", GetOptions::new().with_from_key()),
        ("/registry/", GetOptions::new().with_prefix()),
    ] {
        let (code, message) = status(w.get(key, Some(options)).await);
        assert_eq!(code, "FailedPrecondition", "{key}: {message}");
        assert!(message.contains("/registry/pods/") && message.contains("/registry/minions/"), "{message}");
    }
    // Writes, and etcd's other services.
    let put = w.put("/registry/pods/ns-1/a", "x", None).await.unwrap_err();
    let etcd_client::Error::GRpcStatus(s) = put else { panic!("{put:?}") };
    assert_eq!(s.code(), tonic::Code::Unimplemented, "{s:?}");
    assert!(s.message().contains("etcd itself") && s.message().contains("KV.Put"), "{}", s.message());
    let lease = w.lease_grant(10, None).await.unwrap_err();
    assert!(lease.to_string().contains("Lease.LeaseGrant"), "{lease}");
    // Nothing of it reached etcd.
    assert_eq!(e.get("/registry/pods/ns-1/a", None).await.unwrap().kvs()[0].value_str().unwrap(), pod_json("a", "ns-1", &[("v", "2")], "n"));
    drop(proxy);
}

/// Every event of `stream` until one at `until` or later, as it reads,
/// and whether a revision was ever split between two responses.
async fn events_until(stream: &mut WatchStream, until: i64) -> (Vec<(i32, Kv, Option<Kv>)>, bool) {
    let mut events = Vec::new();
    let mut last_revision_of_a_response = 0;
    let mut split = false;
    while events.last().is_none_or(|(_, kv, _): &(i32, Kv, Option<Kv>)| kv.2 < until) {
        let r: WatchResponse = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .expect("the stream is open");
        assert!(!r.canceled(), "{r:?}");
        let first = r.events().first().map(|e| e.kv().unwrap().mod_revision());
        split |= first.is_some() && first == Some(last_revision_of_a_response);
        for e in r.events() {
            let kind = match e.event_type() {
                EventType::Put => 0,
                EventType::Delete => 1,
            };
            events.push((kind, kv(e.kv().unwrap()), e.prev_kv().map(kv)));
        }
        if let Some(e) = r.events().last() {
            last_revision_of_a_response = e.kv().unwrap().mod_revision();
        }
    }
    (events, split)
}

/// The (deleted, revision) of each event of `stream`, by watch, until
/// watch 0 has one at `until`.
async fn by_watch(stream: &mut WatchStream, until: i64) -> BTreeMap<i64, Vec<(i32, i64)>> {
    let mut by_watch = BTreeMap::<i64, Vec<(i32, i64)>>::new();
    while by_watch.get(&0).is_none_or(|v| v.last().is_none_or(|l| l.1 < until)) {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .unwrap();
        for ev in r.events() {
            let kind = matches!(ev.event_type(), EventType::Delete) as i32;
            let at = (kind, ev.kv().unwrap().mod_revision());
            by_watch.entry(r.watch_id()).or_default().push(at);
        }
    }
    by_watch
}

async fn created(stream: &mut WatchStream) -> WatchResponse {
    let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("created within 10 s")
        .unwrap()
        .unwrap();
    assert!(r.created(), "{r:?}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_show_what_etcd_shows_field_for_field() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    for path in PATHS {
        let (_proxy, mut w) = proxy(&etcd, path).await;
        // From a past revision, with the state before each change.
        let past = || WatchOptions::new().with_prefix().with_start_revision(before + 1).with_prev_key();
        let mut want = e.watch("/registry/pods/", Some(past())).await.unwrap();
        let mut got = w.watch("/registry/pods/", Some(past())).await.unwrap();
        created(&mut want).await;
        created(&mut got).await;
        let (want_events, _) = events_until(&mut want, head - 2).await;
        let (got_events, split) = events_until(&mut got, head - 2).await;
        assert_eq!(got_events, want_events, "{path:?}");
        assert!(!split, "{path:?}: a revision came in two responses");
        assert!(got_events.iter().any(|(_, kv, _)| kv.5 != 0), "a lease is shown");

        // A second watch on the same stream: one namespace, deletions left
        // out, its id chosen by the client; from now on.
        let only_puts = || {
            WatchOptions::new()
                .with_prefix()
                .with_watch_id(7)
                .with_filters([WatchFilterType::NoDelete])
        };
        let now = e.get("/", None).await.unwrap().header().unwrap().revision();
        want.watch("/registry/pods/ns-1/", Some(only_puts())).await.unwrap();
        got.watch("/registry/pods/ns-1/", Some(only_puts())).await.unwrap();
        let (want_created, got_created) = (created(&mut want).await, created(&mut got).await);
        assert_eq!((got_created.watch_id(), got_created.header().unwrap().revision()), (7, now), "{path:?}");
        assert_eq!(want_created.watch_id(), 7);
        // The same id again is refused, as etcd refuses it.
        want.watch("/registry/pods/ns-1/", Some(only_puts())).await.unwrap();
        got.watch("/registry/pods/ns-1/", Some(only_puts())).await.unwrap();
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
        let (want_seen, got_seen) = (by_watch(&mut want, deleted).await, by_watch(&mut got, deleted).await);
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
            (progress.watch_id(), progress.header().unwrap().revision(), progress.events().len()),
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
        assert!(canceled.canceled() && canceled.watch_id() == 7, "{canceled:?}");
        e.delete(format!("/registry/pods/ns-2/{name}"), None).await.unwrap();
    }
}
