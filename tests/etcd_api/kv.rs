//! KV.Range: answered as etcd answers it, and refused as etcd refuses.

use crate::common::*;
use etcd_client::{GetOptions, SortOrder, SortTarget};
use watchproxy::config::ServePath;

use super::shared::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_answers_as_etcd_does() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    for path in PATHS {
        let (_proxy, mut w) = proxy(&etcd.client_url, path).await;
        let prefix = || GetOptions::new().with_prefix();
        let cases: Vec<(&str, &str, GetOptions)> = vec![
            ("a resource", "/registry/pods/", prefix()),
            ("a namespace", "/registry/pods/ns-1/", prefix()),
            ("part of a namespace", "/registry/pods/ns-1/web-", prefix()),
            ("one key", "/registry/pods/ns-3/leased", GetOptions::new()),
            (
                "an absent key",
                "/registry/pods/ns-9/none",
                GetOptions::new(),
            ),
            ("a limit", "/registry/pods/", prefix().with_limit(2)),
            ("keys only", "/registry/pods/", prefix().with_keys_only()),
            ("a count", "/registry/pods/", prefix().with_count_only()),
            (
                "serializable",
                "/registry/pods/",
                prefix().with_serializable(),
            ),
            (
                "a past revision",
                "/registry/pods/",
                prefix().with_revision(before + 3),
            ),
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
                prefix()
                    .with_sort(SortTarget::Version, SortOrder::Descend)
                    .with_limit(1),
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
            w.get("/registry/pods/", Some(prefix()))
                .await
                .unwrap()
                .kvs()
                .iter()
                .any(|k| k.lease() != 0),
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
    let (proxy, mut w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let status = |r: Result<etcd_client::GetResponse, etcd_client::Error>| match r {
        Err(etcd_client::Error::GRpcStatus(s)) => (code_name(s.code()), s.message().to_owned()),
        other => panic!("a status, not {other:?}"),
    };
    // etcd's own messages, which its clients match on.
    let compacted = Some(GetOptions::new().with_prefix().with_revision(start));
    assert_eq!(
        status(e.get("/registry/pods/", compacted.clone()).await),
        status(w.get("/registry/pods/", compacted).await)
    );
    let future = Some(GetOptions::new().with_prefix().with_revision(start + 100));
    assert_eq!(
        status(e.get("/registry/pods/", future.clone()).await),
        status(w.get("/registry/pods/", future).await)
    );
    // Keys no one resource holds.
    for (key, options) in [
        ("/registry/configmaps/", GetOptions::new().with_prefix()),
        ("/registry/pods", GetOptions::new().with_prefix()),
        ("/registry/pods/", GetOptions::new().with_from_key()),
        ("/registry/", GetOptions::new().with_prefix()),
    ] {
        let (code, message) = status(w.get(key, Some(options)).await);
        assert_eq!(code, "FAILED_PRECONDITION", "{key}: {message}");
        assert!(
            message.contains("/registry/pods/") && message.contains("/registry/minions/"),
            "{message}"
        );
    }
    // Writes, and etcd's other services.
    let put = w.put("/registry/pods/ns-1/a", "x", None).await.unwrap_err();
    let etcd_client::Error::GRpcStatus(s) = put else {
        panic!("{put:?}")
    };
    assert_eq!(s.code(), tonic::Code::Unimplemented, "{s:?}");
    assert!(
        s.message().contains("etcd itself") && s.message().contains("KV.Put"),
        "{}",
        s.message()
    );
    let lease = w.lease_grant(10, None).await.unwrap_err();
    assert!(lease.to_string().contains("Lease.LeaseGrant"), "{lease}");
    // Nothing of it reached etcd.
    assert_eq!(
        e.get("/registry/pods/ns-1/a", None).await.unwrap().kvs()[0]
            .value_str()
            .unwrap(),
        pod_json("a", "ns-1", &[("v", "2")], "n")
    );
    drop(proxy);
}
