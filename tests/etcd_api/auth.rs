//! The rules hold for etcd's API as for `watchproxy.v1`: each caller sees
//! only what its rules allow, and nothing outside them is sent.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, GetOptions, WatchOptions};
use watchproxy::config::Config;
use watchproxy::etcdpb::etcdserverpb::{WatchRequest, WatchResponse};

use super::shared::*;

/// Keys of a Range's pairs.
fn keys_of(r: &watchproxy::etcdpb::etcdserverpb::RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_hold_for_etcds_api_and_nothing_outside_them_is_sent() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    put_pod(&mut e, "tenant-a", "a1", &[], "node-1").await;
    put_pod(&mut e, "tenant-b", "b1", &[], "node-7").await;
    put_pod(&mut e, "tenant-b", "b2", &[], "node-2").await;
    let (_dir, proxy) = tenant_proxy(&etcd).await;
    let addr = proxy.addr;

    // Ranges: a namespace's, or what a forced selector leaves.
    let alice = as_caller::range(
        addr,
        Some("alice-token"),
        "/registry/pods/tenant-a/",
        "/registry/pods/tenant-a0",
    )
    .await
    .unwrap();
    assert_eq!(keys_of(&alice), ["/registry/pods/tenant-a/a1"]);
    for (key, end) in [
        ("/registry/pods/", "/registry/pods0"),
        ("/registry/pods/tenant-b/", "/registry/pods/tenant-b0"),
    ] {
        let denied = as_caller::range(addr, Some("alice-token"), key, end)
            .await
            .unwrap_err();
        assert_eq!(
            denied.code(),
            tonic::Code::PermissionDenied,
            "{key}: {denied:?}"
        );
    }
    let node = as_caller::range(
        addr,
        Some("node-token"),
        "/registry/pods/",
        "/registry/pods0",
    )
    .await
    .unwrap();
    assert_eq!(
        (keys_of(&node), node.count),
        (vec!["/registry/pods/tenant-b/b1".to_owned()], 1)
    );
    let nobody = as_caller::range(addr, None, "/registry/pods/", "/registry/pods0")
        .await
        .unwrap_err();
    assert_eq!(nobody.code(), tonic::Code::Unauthenticated);
    let nobody = as_caller::watch(addr, None).await.map(|_| ()).unwrap_err();
    assert_eq!(nobody.code(), tonic::Code::Unauthenticated);

    // Watches: one outside the rules is created and canceled with the
    // reason, as etcd refuses one; the node's sees only its pods, and a
    // pod moved away from it as a deletion.
    let (tx, mut alice) = as_caller::watch(addr, Some("alice-token")).await.unwrap();
    tx.send(create("/registry/pods/", "/registry/pods0"))
        .await
        .unwrap();
    let refused = alice.message().await.unwrap().unwrap();
    assert!(
        refused.created && refused.canceled && refused.cancel_reason.contains("may not"),
        "{refused:?}"
    );
    let (tx, mut node) = as_caller::watch(addr, Some("node-token")).await.unwrap();
    tx.send(create("/registry/pods/", "/registry/pods0"))
        .await
        .unwrap();
    let created = node.message().await.unwrap().unwrap();
    assert!(created.created && !created.canceled, "{created:?}");
    put_pod(&mut e, "tenant-a", "a2", &[], "node-2").await;
    let onto = put_pod(&mut e, "tenant-a", "a3", &[], "node-7").await as i64;
    let away = put_pod(&mut e, "tenant-b", "b1", &[], "node-2").await as i64;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let r = tokio::time::timeout(Duration::from_secs(10), node.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for ev in r.events {
            let kv = ev.kv.unwrap();
            seen.push((
                ev.r#type,
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.mod_revision,
            ));
        }
    }
    assert_eq!(
        seen,
        [
            (0, "/registry/pods/tenant-a/a3".to_owned(), onto),
            (1, "/registry/pods/tenant-b/b1".to_owned(), away)
        ]
    );
    drop(tx);
    // etcd's own login, as clients configured with a user and password
    // make it: the password is a token watchproxy accepts for that user.
    let url = format!("http://{addr}");
    let login = |user: &str, password: &str| {
        Some(etcd_client::ConnectOptions::new().with_user(user, password))
    };
    let mut alice = Client::connect([&url], login("alice", "alice-token"))
        .await
        .unwrap();
    let mine = alice
        .get(
            "/registry/pods/tenant-a/",
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = mine.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "/registry/pods/tenant-a/a1",
            "/registry/pods/tenant-a/a2",
            "/registry/pods/tenant-a/a3"
        ]
    );
    let others = alice
        .get(
            "/registry/pods/tenant-b/",
            Some(GetOptions::new().with_prefix()),
        )
        .await;
    assert!(
        matches!(others, Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::PermissionDenied)
    );
    let mut watch = alice
        .watch(
            "/registry/pods/tenant-a/",
            Some(WatchOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(!self::created(&mut watch).await.canceled());
    for (user, password) in [
        ("alice", "node-token"),
        ("alice", "wrong"),
        ("bob", "alice-token"),
    ] {
        let refused = Client::connect([&url], login(user, password))
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(
            refused.to_string().contains("authentication failed"),
            "{user}/{password}: {refused}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_outside_the_served_prefixes_names_only_what_the_caller_may_read() {
    let etcd = Etcd::start().await;
    let (_dir, proxy) = tenant_proxy(&etcd).await;
    let addr = proxy.addr;
    let (mine, theirs) = ("/registry/pods/", ["/registry/minions/", "/blobs/"]);
    // Every key: pods, nodes, blobs and what lies between.
    let refused = as_caller::range(addr, Some("alice-token"), "\0", "\0")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let message = refused.message();
    assert!(message.contains(mine), "{message}");
    for other in theirs {
        assert!(
            !message.contains(other),
            "alice may not read {other}: {message}"
        );
    }
    let (tx, mut watch) = as_caller::watch(addr, Some("alice-token")).await.unwrap();
    tx.send(create("\0", "\0")).await.unwrap();
    let canceled = watch.message().await.unwrap().unwrap();
    assert!(canceled.canceled, "{canceled:?}");
    for other in theirs {
        let reason = &canceled.cancel_reason;
        assert!(
            !reason.contains(other),
            "alice may not read {other}: {reason}"
        );
    }
    // bob reads nothing: no prefix is named to him.
    let refused = as_caller::range(addr, Some("bob-token"), "\0", "\0")
        .await
        .unwrap_err();
    assert!(!refused.message().contains("/registry/"), "{refused:?}");
}

const FORCED_TOKENS: &str = "
- {token: tenant-token, user: tenant-reader}
- {token: node-token, user: node-7}
";

/// A rule that forces a label selector, and one that forces a field
/// selector.
const FORCED_RULES: &str = r#"
auth:
  tokens_file: TOKENS
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["user:tenant-reader"]
      resources: ["pods"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
      label_selector: "tenant=a"
    - subjects: ["user:node-7"]
      resources: ["pods"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
      field_selector: "spec.nodeName={user}"
"#;

/// A watch of every pod with `prev_kv`, from `start_revision` (0: now).
fn create_with_prev(start_revision: i64) -> WatchRequest {
    use watchproxy::etcdpb::etcdserverpb::watch_request::RequestUnion;
    use watchproxy::etcdpb::etcdserverpb::WatchCreateRequest;
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"/registry/pods/".to_vec().into(),
            range_end: b"/registry/pods0".to_vec().into(),
            prev_kv: true,
            start_revision,
            ..Default::default()
        })),
    }
}

/// Each change `stream` shows up to revision `until`: its revision and
/// the revision of the earlier state it carries, if any.
async fn changes_until(
    stream: &mut tonic::Streaming<WatchResponse>,
    until: i64,
) -> Vec<(i64, Option<i64>)> {
    let mut seen = Vec::new();
    while seen.last().is_none_or(|(r, _)| *r < until) {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("changes within 10 s")
            .unwrap()
            .unwrap();
        assert!(!r.canceled, "{r:?}");
        for ev in r.events {
            let kv = ev.kv.unwrap();
            seen.push((kv.mod_revision, ev.prev_kv.map(|p| p.mod_revision)));
        }
    }
    seen
}

/// `prev_kv` carries only what the caller could see: an object that enters
/// a caller's forced selector (a label relabelled to it, a field moved to
/// it) is a creation for that caller and carries no earlier state, as etcd
/// sends none for a creation; one that stays in it carries its earlier
/// state. Live, and replayed from a start revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prev_kv_never_shows_a_state_outside_the_callers_rule() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let hidden = put_pod(&mut e, "ns", "p1", &[("tenant", "b")], "node-2").await as i64;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, FORCED_TOKENS).unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        + &FORCED_RULES.replace("TOKENS", &tokens.display().to_string());
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let addr = proxy.addr;
    until_readable(addr, "tenant-token", "/registry/pods/", "/registry/pods0").await;

    let (tenant_tx, mut tenant) = as_caller::watch(addr, Some("tenant-token")).await.unwrap();
    let (node_tx, mut node) = as_caller::watch(addr, Some("node-token")).await.unwrap();
    for (tx, stream) in [(&tenant_tx, &mut tenant), (&node_tx, &mut node)] {
        tx.send(create_with_prev(0)).await.unwrap();
        let created = stream.message().await.unwrap().unwrap();
        assert!(created.created && !created.canceled, "{created:?}");
    }
    // Into the tenant's label selector; then onto node-7, which keeps it
    // in the tenant's and brings it into the node's field selector.
    let relabelled = put_pod(&mut e, "ns", "p1", &[("tenant", "a")], "node-2").await as i64;
    let moved = put_pod(&mut e, "ns", "p1", &[("tenant", "a")], "node-7").await as i64;
    let tenant_sees = vec![(relabelled, None), (moved, Some(relabelled))];
    let node_sees = vec![(moved, None)];
    let mut shown = vec![
        ("tenant, live", changes_until(&mut tenant, moved).await),
        ("node, live", changes_until(&mut node, moved).await),
    ];
    // The same changes replayed from the window.
    for (token, what) in [
        ("tenant-token", "tenant, replayed"),
        ("node-token", "node, replayed"),
    ] {
        let (tx, mut replay) = as_caller::watch(addr, Some(token)).await.unwrap();
        tx.send(create_with_prev(relabelled)).await.unwrap();
        let created = replay.message().await.unwrap().unwrap();
        assert!(created.created && !created.canceled, "{created:?}");
        shown.push((what, changes_until(&mut replay, moved).await));
    }
    let want = [
        ("tenant, live", tenant_sees.clone()),
        ("node, live", node_sees.clone()),
        ("tenant, replayed", tenant_sees),
        ("node, replayed", node_sees),
    ];
    assert_eq!(
        shown, want,
        "(revision, the earlier state's revision); {hidden} was outside both rules"
    );
}
