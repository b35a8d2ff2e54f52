//! Bounded work per Range: at most `limits.max_page_size` pairs in one
//! answer (`more` set, as a limit sets it, so etcd's clients that page
//! read on), a single key at a past revision read from etcd as that key
//! alone, and reads of etcd's keys outside the served prefixes charged to
//! the caller's budget of costly reads.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, GetOptions, GetResponse, SortOrder, SortTarget, Txn, TxnOp};
use watchproxy::config::{Config, ServePath};

use super::shared::EVERYONE_READS_ALL;

fn pairs(r: &GetResponse) -> Vec<Kv> {
    r.kvs().iter().map(kv).collect()
}

/// Every pair of `key`'s prefix, read in answers of at most `limit`
/// (0: as many as the server gives), each from the key after the last,
/// while `more` says pairs are left: how etcd's clients page.
async fn read_by_more(c: &mut Client, key: &str, limit: i64) -> (Vec<Kv>, usize) {
    let end = format!("{}0", key.trim_end_matches('/'));
    let (mut from, mut all, mut answers) = (key.to_owned(), Vec::new(), 0);
    loop {
        let options = GetOptions::new().with_range(end.clone()).with_limit(limit);
        let r = c.get(from.clone(), Some(options)).await.unwrap();
        answers += 1;
        all.extend(pairs(&r));
        match r.kvs().last() {
            Some(last) if r.more() => from = format!("{}\0", last.key_str().unwrap()),
            _ => return (all, answers),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_holds_at_most_max_page_size_pairs_and_its_client_reads_on_by_more() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    for i in 0..10 {
        put_pod(&mut e, "ns-1", &format!("p-{i}"), &[], "node-1").await;
    }
    for path in [ServePath::Fast, ServePath::Tonic] {
        let yaml = pods_yaml(&etcd.client_url, 64)
            .replace("resources:", "etcd_api: {enabled: true}\nresources:")
            .replace("max_concurrent_unary: 4096", "max_page_size: 3");
        let mut config = Config::from_yaml(&yaml).unwrap();
        config.watch.serve_path = path;
        let (_proxy, mut w) = etcd_api_proxy(config).await;
        let prefix = || GetOptions::new().with_prefix();
        for (what, options, shown) in [
            ("no limit", prefix(), 3),
            ("a limit below the bound", prefix().with_limit(2), 2),
            ("a limit above the bound", prefix().with_limit(5), 3),
            (
                "sorted by mod revision",
                prefix().with_sort(SortTarget::Mod, SortOrder::Descend),
                3,
            ),
            ("keys only", prefix().with_keys_only(), 3),
        ] {
            let want = e
                .get("/registry/pods/", Some(options.clone()))
                .await
                .unwrap();
            let got = w.get("/registry/pods/", Some(options)).await.unwrap();
            assert_eq!(pairs(&got), pairs(&want)[..shown], "{path:?}, {what}");
            assert_eq!((got.count(), got.more()), (10, true), "{path:?}, {what}");
        }
        let counted = w
            .get("/registry/pods/", Some(prefix().with_count_only()))
            .await
            .unwrap();
        assert_eq!((counted.count(), counted.more()), (10, false), "{path:?}");
        // A client that pages by `more` reads everything, as from etcd.
        let (all, answers) = read_by_more(&mut w, "/registry/pods/", 0).await;
        let want = e.get("/registry/pods/", Some(prefix())).await.unwrap();
        assert_eq!(all, pairs(&want), "{path:?}");
        assert_eq!(answers, 4, "{path:?}: 10 pairs in answers of 3");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_key_at_a_past_revision_is_read_from_etcd_alone() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    // More pods in its namespace than one of etcd's pages holds.
    for batch in 0..12 {
        let puts = (0..100).map(|i| {
            let name = format!("p-{batch}-{i}");
            let key = format!("/registry/pods/big/{name}");
            TxnOp::put(key, pod_json(&name, "big", &[], "node-1"), None)
        });
        e.txn(Txn::new().and_then(puts.collect::<Vec<_>>()))
            .await
            .unwrap();
    }
    let past = put_pod(&mut e, "big", "first", &[], "node-1").await as i64;
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        .replace(
            "indexed_fields: [spec.nodeName]",
            "indexed_fields: [spec.nodeName]\n    cache: {min_events: 16, max_events: 64}",
        );
    let (proxy, mut w) = etcd_api_proxy(Config::from_yaml(&yaml).unwrap()).await;
    // More changes than the window keeps, so that `past` is read from
    // etcd.
    for i in 0..100 {
        put_pod(&mut e, "other", &format!("q-{i}"), &[], "node-1").await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pages = || {
        proxy.metric(
            "watchproxy_etcd_requests_total",
            "resource=\"pods\",request=\"exact_list_page\"",
        )
    };
    let before = pages();
    let key = "/registry/pods/big/first";
    let options = || Some(GetOptions::new().with_revision(past));
    let got = w.get(key, options()).await.unwrap();
    let want = e.get(key, options()).await.unwrap();
    assert_eq!(pairs(&got), pairs(&want));
    assert_eq!(got.count(), 1);
    assert_eq!(pages() - before, 1.0, "one read of etcd, of that key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_keys_outside_the_served_prefixes_are_bounded_and_costly() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    for i in 0..5 {
        e.put(format!("/other/{i}"), "o", None).await.unwrap();
    }
    put_pod(&mut e, "ns-1", "web", &[], "node-1").await;
    e.put("/registry/configmaps/ns-1/a", "between", None)
        .await
        .unwrap();
    e.put("/registry/minions/node-1", "{}", None).await.unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace(
            "resources:",
            "etcd_api: {enabled: true, outside: forward}\nresources:",
        )
        .replace(
            "max_concurrent_unary: 4096",
            "max_page_size: 2\n  costly_reads_per_user_per_second: 0.01\n  costly_read_burst_per_user: 2",
        )
        + EVERYONE_READS_ALL;
    let (_proxy, mut w) = etcd_api_proxy(Config::from_yaml(&yaml).unwrap()).await;
    let prefix = || Some(GetOptions::new().with_prefix());
    // Wholly outside: etcd's answer, cut at the bound.
    let got = w.get("/other/", prefix()).await.unwrap();
    let want = e.get("/other/", prefix()).await.unwrap();
    assert_eq!(pairs(&got), pairs(&want)[..2]);
    assert_eq!((got.count(), got.more()), (5, true));
    // Over the served prefixes and the keys between them.
    let got = w.get("/registry/", prefix()).await.unwrap();
    let want = e.get("/registry/", prefix()).await.unwrap();
    assert_eq!(pairs(&got), pairs(&want)[..2]);
    assert_eq!((got.count(), got.more()), (want.count(), true));
    // Two reads of etcd were the burst: the third is refused.
    let refused = w.get("/other/", prefix()).await.unwrap_err();
    let etcd_client::Error::GRpcStatus(status) = refused else {
        panic!("a status, not {refused:?}");
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // What the caches answer as they are is not charged.
    assert!(w.get("/registry/pods/", prefix()).await.is_ok());
}

/// A watch merged over the served prefixes and the keys between them
/// holds the changes of its parts until every part has got as far; while
/// the part watched on etcd is idle (etcd's progress notifications every
/// ten minutes, its default), what it holds is bounded in bytes: past
/// 16 MiB it is canceled with `compact_revision`, as a watch etcd
/// compacted, and its client reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_watch_holds_a_bounded_memory_while_a_part_lags() {
    let etcd = Etcd::start_with_default_progress().await;
    let mut e = etcd.client().await;
    let yaml = pods_yaml(&etcd.client_url, 64).replace(
        "resources:",
        "etcd_api: {enabled: true, outside: forward}\nresources:",
    ) + EVERYONE_READS_ALL;
    let (_proxy, mut w) = etcd_api_proxy(Config::from_yaml(&yaml).unwrap()).await;
    let mut merged = w
        .watch(
            "/registry/",
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let big = "x".repeat(100 << 10);
    let mut last = 0;
    for i in 0..200 {
        let name = format!("big-{i}");
        let value = format!(
            r#"{{"kind":"Pod","metadata":{{"name":"{name}","namespace":"ns"}},"data":"{big}"}}"#
        );
        let put = e.put(format!("/registry/pods/ns/{name}"), value, None);
        last = put.await.unwrap().header().unwrap().revision();
    }
    let canceled = loop {
        let r = tokio::time::timeout(Duration::from_secs(10), merged.message())
            .await
            .expect("the merged watch canceled within 10 s")
            .unwrap()
            .expect("the stream is open");
        if r.created() {
            continue;
        }
        assert!(r.events().is_empty(), "nothing is shown while a part lags");
        if r.canceled() {
            break r;
        }
    };
    let compact = canceled.compact_revision();
    assert!(compact > 1 && compact <= last + 1, "{canceled:?}");
}

/// etcd's answers are not bounded by gRPC's default 4 MiB a message: a
/// list page of many large objects, and a watch that catches up over
/// history (etcd sends up to 1,000 revisions in one response), are read
/// whole, as the Kubernetes apiserver reads them (up to 2 GiB). Bounded,
/// the cache never became ready and the catching-up watch failed again
/// at every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_etcd_over_four_mebibytes_are_read_whole() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let pad = "x".repeat(110 << 10);
    let n = 48;
    let first = e.put("/other/start", "", None).await.unwrap();
    let first = first.header().unwrap().revision();
    for i in 0..n {
        let name = format!("large-{i}");
        let pod = format!(
            r#"{{"kind":"Pod","metadata":{{"name":"{name}","namespace":"ns"}},"spec":{{"nodeName":"node-1"}},"pad":"{pad}"}}"#
        );
        e.put(format!("/registry/pods/ns/{name}"), pod, None)
            .await
            .unwrap();
        e.put(format!("/other/{name}"), pad.clone(), None)
            .await
            .unwrap();
    }
    let yaml = pods_yaml(&etcd.client_url, 64).replace(
        "resources:",
        "etcd_api: {enabled: true, outside: forward}\nresources:",
    ) + EVERYONE_READS_ALL;
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    // The first list page holds every pod: 5 MiB.
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let mut listed = 0;
    let mut token = String::new();
    loop {
        let page = client
            .list(watchproxy::pb::ListRequest {
                resource: "pods".into(),
                limit: 10,
                continue_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        listed += page.items.len();
        token = page.continue_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(listed, n);
    // Keys outside the served prefixes, watched on etcd from the start:
    // etcd's first response holds them all, and so does watchproxy's, as
    // etcd's Go client reads it (up to 2 GiB a message).
    let w = Client::connect([format!("http://{}", proxy.addr)], None)
        .await
        .unwrap();
    let mut w = w
        .watch_client()
        .max_decoding_message_size(i32::MAX as usize);
    let options = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_start_revision(first);
    let mut stream = w.watch("/other/", Some(options)).await.unwrap();
    let mut seen = 0;
    while seen < n + 1 {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the history within 10 s")
            .unwrap()
            .expect("the stream is open");
        assert!(!r.canceled(), "{r:?}");
        seen += r.events().len();
    }
    assert_eq!(seen, n + 1);
}
