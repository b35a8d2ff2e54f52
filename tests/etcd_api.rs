//! etcd's own API served from the caches, tried with etcd's clients: the
//! Rust `etcd-client` and `etcdctl`, each call made against etcd itself
//! and against watchproxy and compared field for field.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use watchproxy::config::{Config, ServePath};

const PATHS: [ServePath; 2] = [ServePath::Fast, ServePath::Tonic];

fn config(etcd_url: &str, path: ServePath) -> Config {
    let yaml =
        pods_yaml(etcd_url, 256).replace("resources:", "etcd_api: {enabled: true}\nresources:");
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config
}

async fn proxy(etcd_url: &str, path: ServePath) -> (Proxy, Client) {
    etcd_api_proxy(config(etcd_url, path)).await
}

/// Writes of every kind etcd records: creations, a transaction of two
/// keys, an update, a key with a lease, a deletion, and keys of other
/// resources and of none. Returns etcd's revision after them.
async fn write_history(c: &mut Client) -> i64 {
    put_pod(c, "ns-1", "web-1", &[("app", "web")], "node-1").await;
    put_pod(c, "ns-1", "web-2", &[("app", "web")], "node-2").await;
    put_pod(c, "ns-2", "db-1", &[("app", "db")], "node-1").await;
    let txn = Txn::new()
        .when([Compare::version(
            "/registry/pods/ns-2/db-2",
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                "/registry/pods/ns-2/db-2",
                pod_json("db-2", "ns-2", &[], "node-2"),
                None,
            ),
            TxnOp::put(
                "/registry/pods/ns-1/web-1",
                pod_json("web-1", "ns-1", &[("v", "2")], "node-1"),
                None,
            ),
        ]);
    c.txn(txn).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    let leased = pod_json("leased", "ns-3", &[], "node-3");
    let options = etcd_client::PutOptions::new().with_lease(lease);
    c.put("/registry/pods/ns-3/leased", leased, Some(options))
        .await
        .unwrap();
    put_pod(c, "ns-1", "web-2", &[("app", "web"), ("v", "3")], "node-2").await;
    delete_key(c, "/registry/pods/ns-2/db-1").await;
    c.put("/registry/minions/node-1", "{}", None).await.unwrap();
    c.put("/registry/configmaps/ns-1/cm", "{}", None)
        .await
        .unwrap();
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

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

/// The (deleted, revision) of each event of `stream`, by watch, until
/// watch 0 has one at `until`.
async fn by_watch(stream: &mut WatchStream, until: i64) -> BTreeMap<i64, Vec<(i32, i64)>> {
    let mut by_watch = BTreeMap::<i64, Vec<(i32, i64)>>::new();
    while by_watch
        .get(&0)
        .is_none_or(|v| v.last().is_none_or(|l| l.1 < until))
    {
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

/// A call of etcd's API as `token`'s caller, with a client that sends the
/// bearer token watchproxy reads.
mod as_caller {
    use http::uri::PathAndQuery;
    use tonic::metadata::MetadataValue;
    use tonic::transport::Channel;
    use tonic::{Request, Status, Streaming};
    use tonic_prost::ProstCodec;
    use watchproxy::etcdpb::etcdserverpb::{
        RangeRequest, RangeResponse, WatchRequest, WatchResponse,
    };

    async fn grpc(addr: std::net::SocketAddr) -> tonic::client::Grpc<Channel> {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        grpc
    }

    fn with_token<T>(token: Option<&str>, message: T) -> Request<T> {
        let mut req = Request::new(message);
        if let Some(token) = token {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
            req.metadata_mut().insert("authorization", value);
        }
        req
    }

    pub async fn range(
        addr: std::net::SocketAddr,
        token: Option<&str>,
        key: &str,
        end: &str,
    ) -> Result<RangeResponse, Status> {
        let req = RangeRequest {
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
            ..Default::default()
        };
        let path = PathAndQuery::from_static("/etcdserverpb.KV/Range");
        let mut grpc = grpc(addr).await;
        let answer = grpc
            .unary(with_token(token, req), path, ProstCodec::default())
            .await;
        answer.map(|r| r.into_inner())
    }

    /// A Watch stream: its requests' sender and its responses.
    pub async fn watch(
        addr: std::net::SocketAddr,
        token: Option<&str>,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<WatchRequest>,
            Streaming<WatchResponse>,
        ),
        Status,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let path = PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        let mut grpc = grpc(addr).await;
        let answer = grpc
            .streaming(with_token(token, requests), path, ProstCodec::default())
            .await?;
        Ok((tx, answer.into_inner()))
    }
}

const TOKENS: &str = "
- {token: alice-token, user: alice, groups: [tenant-a]}
- {token: node-token, user: node-7}
";

const RULES: &str = r#"
auth:
  tokens_file: TOKENS
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["group:tenant-a"]
      resources: ["pods"]
      namespaces: ["tenant-a"]
      verbs: ["list", "get", "watch"]
    - subjects: ["user:node-7"]
      resources: ["pods"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
      field_selector: "spec.nodeName={user}"
"#;

fn create(key: &str, end: &str) -> WatchRequest {
    use watchproxy::etcdpb::etcdserverpb::watch_request::RequestUnion;
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
            ..Default::default()
        })),
    }
}

use watchproxy::etcdpb::etcdserverpb::{WatchCreateRequest, WatchRequest};

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
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        + &RULES.replace("TOKENS", &tokens.display().to_string());
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let addr = proxy.addr;
    let mut ready = false;
    for _ in 0..100 {
        if as_caller::range(
            addr,
            Some("alice-token"),
            "/registry/pods/tenant-a/",
            "/registry/pods/tenant-a0",
        )
        .await
        .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "alice reads her namespace");

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

/// The next response of `stream` within 10 s.
async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a response within 10 s")
        .unwrap()
        .expect("the stream is open")
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

/// `etcdctl` (etcd's own command line client) against `endpoint`, its
/// JSON output of `args`.
fn etcdctl(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let etcdctl = watchproxy_testkit::require(
        "etcdctl",
        "install it with `sudo apt-get install -y etcd-client` (Debian/Ubuntu), or run ./scripts/test.sh, which installs it",
    );
    let out = std::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "-w", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The responses `etcdctl watch args` prints until it has shown `events`
/// events, without their headers (watchproxy names no cluster or member).
async fn etcdctl_watch(endpoint: &str, args: &[&str], events: usize) -> Vec<serde_json::Value> {
    use tokio::io::AsyncBufReadExt;
    let etcdctl = watchproxy_testkit::require(
        "etcdctl",
        "install it with `sudo apt-get install -y etcd-client`",
    );
    let mut child = tokio::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "-w", "json", "watch"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut out, mut seen) = (Vec::new(), 0);
    while seen < events {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("etcdctl prints within 10 s")
            .unwrap()
            .expect("etcdctl still runs");
        let Ok(mut response) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        response.as_object_mut().unwrap().remove("Header");
        seen += response["Events"].as_array().map_or(0, Vec::len);
        out.push(response);
    }
    child.kill().await.unwrap();
    out
}

/// `etcdctl get` and `etcdctl watch` print the same through watchproxy as
/// from etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_reads_and_watches_through_watchproxy_as_from_etcd() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    let (proxy, _w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let (direct, through) = (
        etcd.client_url.trim_start_matches("http://").to_owned(),
        proxy.addr.to_string(),
    );
    let past = (before + 2).to_string();
    for args in [
        &["get", "--prefix", "/registry/pods/"][..],
        &["get", "--prefix", "/registry/pods/ns-1/", "--limit", "1"],
        &["get", "--prefix", "/registry/pods/", "--rev", &past],
        &[
            "get",
            "--prefix",
            "/registry/pods/",
            "--keys-only",
            "--sort-by",
            "MODIFY",
            "--order",
            "DESCEND",
        ],
        &["get", "--prefix", "/registry/minions/"],
        &["get", "/registry/pods/ns-3/leased", "--consistency", "s"],
    ] {
        let (mut want, mut got) = (etcdctl(&direct, args), etcdctl(&through, args));
        assert_eq!(got["header"]["revision"], head, "{args:?}");
        for v in [&mut want, &mut got] {
            v.as_object_mut().unwrap().remove("header");
        }
        assert_eq!(got, want, "{args:?}");
    }
    let rev = (before + 1).to_string();
    let args = ["--prefix", "/registry/pods/", "--rev", &rev, "--prev-kv"];
    let want = etcdctl_watch(&direct, &args, 8).await;
    let got = etcdctl_watch(&through, &args, 8).await;
    let events = |responses: &[serde_json::Value]| -> Vec<serde_json::Value> {
        responses
            .iter()
            .flat_map(|r| r["Events"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert_eq!(events(&got), events(&want));
    assert_eq!(events(&got).len(), 8);
}

/// Python's aetcd (etcd's asyncio client) reads and watches through
/// watchproxy as from etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pythons_aetcd_reads_and_watches_through_watchproxy_as_from_etcd() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    write_history(&mut e).await;
    let (proxy, _w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let run = |host: String, port: String| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/etcd_client.py");
        let start = (before + 1).to_string();
        let mut python = python3();
        let ok = python3()
            .args(["-c", "import aetcd"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 with aetcd is required: run ./scripts/install-deps.sh, which installs it into the project's .venv");
        let out = python
            .args([script, &host, &port, "/registry/pods/", &start, "8"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = etcd
        .client_url
        .trim_start_matches("http://")
        .rsplit_once(':')
        .unwrap();
    let want = run(direct.0.to_owned(), direct.1.to_owned());
    let got = run("127.0.0.1".into(), proxy.addr.port().to_string());
    assert_eq!(got.lines().count(), 10, "{got}");
    for (got, want) in got.lines().zip(want.lines()) {
        assert_eq!(got, want);
    }
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

mod campaign {
    //! watchproxy-check's informers written against etcd's own API,
    //! proven against etcd's recorded history under faults: etcd's watch
    //! guarantees (ordered, unique, reliable, atomic per revision,
    //! resumable, bookmarkable) through watchproxy.

    use super::*;
    use watchproxy_check::writer::Writes;
    use watchproxy_check::{Api, Check, Options};

    fn options(etcd: &Etcd, watchproxy: String, seed: u64, misbehave: bool) -> Options {
        Options {
            etcd: etcd.client_url.clone(),
            watchproxy: vec![watchproxy],
            resource: "pods".into(),
            prefix: "/registry/pods".into(),
            watchers: 12,
            rate: 40,
            duration: Duration::from_secs(5),
            settle: Duration::from_secs(20),
            seed,
            misbehave,
            identities: Vec::new(),
            writes: Writes::Mixed,
            readers: 0,
            api: Api::Etcd,
        }
    }

    async fn through(
        name: &str,
        options: Options,
        fault: impl std::future::Future<Output = ()>,
        heal: impl std::future::Future<Output = ()>,
    ) -> watchproxy_check::Report {
        let mut check = Check::start(options).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        fault.await;
        check.writes_done().await.unwrap();
        heal.await;
        let report = check.finish().await.unwrap();
        eprintln!("{name}: {report}");
        assert!(report.passed(), "{name}:\n{report}");
        assert!(report.checked > 0, "{name}: events were checked");
        report
    }

    fn etcd_api_proxy_yaml(etcd_url: &str) -> Config {
        config(etcd_url, ServePath::Fast)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_stalling_and_vanishing_etcd_clients() {
        let etcd = Etcd::start().await;
        let proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
        let options = options(&etcd, format!("http://{}", proxy.addr), 21, true);
        let r = through("etcd clients, misbehaving", options, async {}, async {}).await;
        assert!(r.resumes > 0, "the vanishing clients resumed: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_clients_through_a_compaction_while_cut_off() {
        let etcd = Etcd::start().await;
        let forwarder = Forwarder::start(&etcd.client_url).await;
        let proxy = Proxy::start_config(etcd_api_proxy_yaml(&forwarder.url)).await;
        let mut ec = etcd.client().await;
        let options = options(&etcd, format!("http://{}", proxy.addr), 22, false);
        let heal = async {
            compact_all(&mut ec).await;
            forwarder.restore();
        };
        let r = through(
            "etcd clients, compaction while cut off",
            options,
            async { forwarder.cut() },
            heal,
        )
        .await;
        assert!(r.relists > 12, "canceled watches read again: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_clients_resume_through_a_watchproxy_restart() {
        let etcd = Etcd::start().await;
        let mut proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
        let addr = proxy.addr;
        let options = options(&etcd, format!("http://{addr}"), 24, false);
        let restart = async {
            proxy.stop().await;
            let listener = listener_at(addr).await;
            proxy = Proxy::start_on(etcd_api_proxy_yaml(&etcd.client_url), listener).await;
        };
        let r = through(
            "etcd clients, watchproxy restarted",
            options,
            restart,
            async {},
        )
        .await;
        assert!(
            r.resumes > 0,
            "the clients resumed from their revisions: {r}"
        );
        drop(proxy);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_clients_through_etcd_killed_and_restarted() {
        let mut etcd = Etcd::start().await;
        let proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
        let options = options(&etcd, format!("http://{}", proxy.addr), 23, false);
        through(
            "etcd clients, etcd killed and restarted",
            options,
            etcd.restart(),
            async {},
        )
        .await;
    }
}
