//! etcd's API over keys outside the served prefixes, with
//! `etcd_api.outside: forward`: a range between several served prefixes is
//! their caches' keys merged with etcd's for the keys between them, and a
//! range outside them all is etcd's; each compared with etcd's own answer,
//! field for field and event for event.

use crate::common::*;
use etcd_client::{Client, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions};
use watchproxy::config::{Config, ServePath};

use super::shared::EVERYONE_READS_ALL;

fn config(etcd_url: &str, path: ServePath) -> Config {
    let yaml = pods_yaml(etcd_url, 256).replace(
        "resources:",
        "etcd_api: {enabled: true, outside: forward}\nresources:",
    ) + EVERYONE_READS_ALL;
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config
}

async fn proxy(etcd_url: &str, path: ServePath) -> (Proxy, Client) {
    etcd_api_proxy(config(etcd_url, path)).await
}

/// Writes under both served prefixes, between them (`configmaps`,
/// `/registry/a`) and outside `/registry/` (`/other/`); one transaction
/// over three of them, its keys in key order (as the merge orders a
/// revision's events across prefixes). etcd's revision after them.
async fn write(c: &mut Client, tag: &str) -> i64 {
    put_pod(c, "ns-1", &format!("web-{tag}"), &[], "node-1").await;
    c.put(format!("/registry/minions/node-{tag}"), "{}", None)
        .await
        .unwrap();
    c.put(format!("/registry/configmaps/ns-1/{tag}"), "a", None)
        .await
        .unwrap();
    c.put(format!("/other/{tag}"), "o", None).await.unwrap();
    let txn = Txn::new().and_then([
        TxnOp::put(format!("/registry/a/{tag}"), "in a gap", None),
        TxnOp::put(format!("/registry/minions/node-{tag}"), "{\"v\":2}", None),
        TxnOp::put(
            format!("/registry/pods/ns-1/web-{tag}"),
            pod_json(&format!("web-{tag}"), "ns-1", &[("v", "2")], "node-1"),
            None,
        ),
    ]);
    c.txn(txn).await.unwrap();
    delete_key(c, &format!("/registry/configmaps/ns-1/{tag}")).await;
    delete_key(c, &format!("/registry/pods/ns-1/web-{tag}")).await;
    c.put(format!("/other/{tag}"), "o2", None).await.unwrap();
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_over_and_outside_the_served_prefixes_answer_as_etcd_does() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = write(&mut e, "1").await;
    let head = write(&mut e, "2").await;
    let (proxy, mut w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let prefix = || GetOptions::new().with_prefix();
    let cases: Vec<(&str, &str, GetOptions)> = vec![
        ("over both prefixes and the gaps", "/registry/", prefix()),
        (
            "at a past revision",
            "/registry/",
            prefix().with_revision(before),
        ),
        ("serializable", "/registry/", prefix().with_serializable()),
        ("a limit", "/registry/", prefix().with_limit(3)),
        (
            "sorted by mod revision",
            "/registry/",
            prefix().with_sort(SortTarget::Mod, SortOrder::Descend),
        ),
        ("a count", "/registry/", prefix().with_count_only()),
        ("keys only", "/registry/", prefix().with_keys_only()),
        (
            "from a key on",
            "/registry/minions/",
            GetOptions::new().with_from_key(),
        ),
        ("a prefix without its slash", "/registry/pods", prefix()),
        ("wholly in a gap", "/registry/configmaps/", prefix()),
        ("wholly outside", "/other/", prefix()),
        ("one key outside", "/other/1", GetOptions::new()),
        ("everything", "\0", GetOptions::new().with_from_key()),
    ];
    for (what, key, options) in cases {
        let want = e.get(key, Some(options.clone())).await.unwrap();
        let got = w.get(key, Some(options)).await.unwrap();
        let pairs = |r: &etcd_client::GetResponse| r.kvs().iter().map(kv).collect::<Vec<_>>();
        assert_eq!(pairs(&got), pairs(&want), "{what}");
        assert_eq!(
            (got.count(), got.more(), got.header().unwrap().revision()),
            (want.count(), want.more(), head),
            "{what}: count, more and revision"
        );
    }
    assert!(
        proxy.metric("watchproxy_etcd_api_forwarded_total", "call=\"range\"") >= 10.0,
        "forwarded reads are counted"
    );
    // etcd's own refusal of a forwarded read reaches the client as etcd
    // gave it.
    e.compact(before, None).await.unwrap();
    let old = Some(prefix().with_revision(before - 5));
    let status = |r: Result<etcd_client::GetResponse, etcd_client::Error>| match r {
        Err(etcd_client::Error::GRpcStatus(s)) => (s.code(), s.message().to_owned()),
        other => panic!("a status, not {other:?}"),
    };
    assert_eq!(
        status(w.get("/other/", old.clone()).await),
        status(e.get("/other/", old).await)
    );
}

/// The events up to `until`: a watch may have sent more in the response
/// that reached it, and etcd's and watchproxy's responses cut apart.
fn up_to(mut events: Vec<Ev>, until: i64) -> Vec<Ev> {
    events.retain(|(_, kv, _)| kv.2 <= until);
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_over_and_outside_the_served_prefixes_show_etcds_events_in_etcds_order() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let start = e.get("/", None).await.unwrap().header().unwrap().revision();
    write(&mut e, "past").await;
    for path in [ServePath::Fast, ServePath::Tonic] {
        let (proxy, mut w) = proxy(&etcd.client_url, path).await;
        for (what, key) in [
            ("over several prefixes", "/registry/"),
            ("outside", "/other/"),
        ] {
            let past = || {
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(start + 1)
                    .with_prev_key()
            };
            // Up to the last write under `/registry/`.
            let head = e.get("/", None).await.unwrap().header().unwrap().revision() - 1;
            let mut want = e.watch(key, Some(past())).await.unwrap();
            let mut got = w.watch(key, Some(past())).await.unwrap();
            created(&mut want).await;
            assert!(!created(&mut got).await.canceled(), "{path:?}, {what}");
            let want_past = up_to(events_until(&mut want, head).await.0, head);
            let (got_past, split) = events_until(&mut got, head).await;
            let got_past = up_to(got_past, head);
            assert_eq!(got_past, want_past, "{path:?}, {what}: from the past");
            assert!(!split, "{path:?}, {what}: a revision came in two responses");

            // From now on: the parts wait for each other, idle ones too.
            let from_now = || WatchOptions::new().with_prefix().with_prev_key();
            let mut want = e.watch(key, Some(from_now())).await.unwrap();
            let mut got = w.watch(key, Some(from_now())).await.unwrap();
            created(&mut want).await;
            assert!(!created(&mut got).await.canceled(), "{path:?}, {what}");
            let mut c = etcd.client().await;
            let now = write(&mut c, &format!("{path:?}-{}", key.len())).await;
            let want_now = up_to(events_until(&mut want, now - 1).await.0, now - 1);
            let (got_now, split) = events_until(&mut got, now - 1).await;
            let got_now = up_to(got_now, now - 1);
            assert_eq!(got_now, want_now, "{path:?}, {what}: from now");
            assert!(!split, "{path:?}, {what}: a revision came in two responses");
        }
        assert!(proxy.metric("watchproxy_etcd_api_forwarded_total", "call=\"watch\"") >= 4.0);
    }
}
