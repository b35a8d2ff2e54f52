//! Identities and authorization rules end to end: bearer tokens name
//! callers, rules allow verbs on resources in namespaces through
//! selectors, and nothing a caller may not see reaches it.

use crate::common::*;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use watchproxy::config::Config;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, EventType};

/// The pods configuration with the tenant fixture's tokens (written in
/// `dir`) and rules.
fn with_rules(etcd: &Etcd, dir: &std::path::Path) -> Config {
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64")
        + &tenant_auth(dir);
    Config::from_yaml(&yaml).unwrap()
}

fn list(namespace: &str) -> pb::ListRequest {
    pb::ListRequest {
        resource: "pods".into(),
        namespace: namespace.into(),
        ..Default::default()
    }
}

fn names(items: &[pb::Object]) -> Vec<String> {
    items
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_read_only_what_the_rules_allow() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "tenant-a", "p1", &[], "node-1").await;
    put_pod(&mut ec, "tenant-b", "p2", &[], "node-7").await;
    put_pod(&mut ec, "tenant-a", "p3", &[], "node-7").await;
    let dir = tempfile::tempdir().unwrap();
    let config = with_rules(&etcd, dir.path());
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    let mut ready = false;
    for _ in 0..100 {
        if client
            .list(as_caller("alice-token", list("tenant-a")))
            .await
            .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "pods did not become ready");

    // Without an identity, or with a token nobody has: UNAUTHENTICATED,
    // and the token is never echoed. Health stays reachable for probes.
    let err = client.list(list("tenant-a")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = client
        .list(as_caller("guess-1234", list("tenant-a")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(!err.message().contains("guess-1234"), "{}", err.message());
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");

    // A tenant reads its namespace, and nothing wider or elsewhere.
    let own = client
        .list(as_caller("alice-token", list("tenant-a")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&own.items), ["tenant-a/p1", "tenant-a/p3"]);
    for (what, ns) in [("all namespaces", ""), ("another namespace", "tenant-b")] {
        let err = client
            .list(as_caller("alice-token", list(ns)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{what}: {err:?}");
    }
    let get = |ns: &str, name: &str| pb::GetRequest {
        resource: "pods".into(),
        namespace: ns.into(),
        name: name.into(),
        ..Default::default()
    };
    let err = client
        .get(as_caller("alice-token", get("tenant-b", "p2")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = client
        .list(as_caller("bob-token", list("tenant-a")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "no rule names bob");

    // A node reads exactly its own pods, in every namespace; no count of
    // the others, and a Get of another node's pod finds nothing.
    let page = client
        .list(as_caller(
            "node-token",
            pb::ListRequest {
                limit: 1,
                ..list("")
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&page.items), ["tenant-a/p3"]);
    assert_eq!(page.remaining_item_count, None);
    let rest = client
        .list(as_caller(
            "node-token",
            pb::ListRequest {
                continue_token: page.continue_token.clone(),
                ..list("")
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&rest.items), ["tenant-b/p2"]);
    let err = client
        .list(as_caller(
            "alice-token",
            pb::ListRequest {
                continue_token: page.continue_token,
                ..list("tenant-a")
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "another caller's token");
    let err = client
        .get(as_caller("node-token", get("tenant-a", "p1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let p3 = client
        .get(as_caller("node-token", get("tenant-a", "p3")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p3.name, "p3");

    // Its watch turns pods moving on and off the node into ADDED and
    // DELETED, and shows nothing of the rest.
    let mut watch = client
        .watch(as_caller("node-token", watch_req("pods", "")))
        .await
        .unwrap()
        .into_inner();
    let initial = take_events(&mut watch, 2).await;
    let initial: Vec<_> = initial.iter().map(|e| summary(e).1).collect();
    assert_eq!(initial, ["tenant-a/p3", "tenant-b/p2"]);
    put_pod(&mut ec, "tenant-a", "other", &[], "node-1").await;
    let on = put_pod(&mut ec, "tenant-a", "p1", &[], "node-7").await;
    let off = put_pod(&mut ec, "tenant-a", "p3", &[], "node-2").await;
    let events: Vec<_> = take_events(&mut watch, 2)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        events,
        [
            (EventType::Added, "tenant-a/p1".into(), on),
            (EventType::Deleted, "tenant-a/p3".into(), off),
        ]
    );

    let denied = |verb: &str| {
        let labels = format!("resource=\"pods\",verb=\"{verb}\"");
        proxy.metric("watchproxy_authz_denied_total", &labels)
    };
    assert_eq!((denied("list"), denied("get")), (3.0, 1.0));
    assert!(proxy.metric("watchproxy_auth_failures_total", "reason=\"unknown_token\"") >= 1.0);
    assert!(proxy.metric("watchproxy_auth_failures_total", "reason=\"no_identity\"") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_take_another_users_share() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_rules(&etcd, dir.path());
    config.limits.max_watchers_per_user = Some(1);
    config.limits.unary_per_user_per_second = Some(0.5);
    config.limits.unary_burst_per_user = 2;
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    let watch = |token| {
        let mut client = client.clone();
        async move {
            client
                .watch(as_caller(
                    token,
                    pb::WatchRequest {
                        namespace: "tenant-a".into(),
                        ..watch_req("pods", "")
                    },
                ))
                .await
        }
    };
    let mut first = None;
    for _ in 0..100 {
        if let Ok(w) = watch("alice-token").await {
            first = Some(w);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(first.is_some(), "pods did not become ready");
    let err = watch("alice-token").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("alice is over its limit"), "{err:?}");
    assert!(
        watch("node-token").await.is_ok(),
        "another user keeps its place"
    );
    drop(first);
    let mut again = false;
    for _ in 0..50 {
        if watch("alice-token").await.is_ok() {
            again = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(again, "a closed watch gives its place back");

    // Two calls at once, then one each two seconds; the refusal says when.
    for _ in 0..2 {
        client
            .list(as_caller("node-token", list("")))
            .await
            .unwrap();
    }
    let err = client
        .list(as_caller("node-token", list("")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("retry in"), "{err:?}");
    use tonic_types::StatusExt;
    let retry = err.get_details_retry_info().expect("retry advice");
    assert!(retry
        .retry_delay
        .is_some_and(|d| d <= std::time::Duration::from_secs(2)));
    assert!(
        client
            .list(as_caller("alice-token", list("tenant-a")))
            .await
            .is_ok(),
        "another user's calls go on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_jwt_names_its_caller() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "").await;
    let dir = tempfile::tempdir().unwrap();
    let pair = rcgen::KeyPair::generate().unwrap();
    let raw = pair.public_key_raw();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        format!(
            r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"k1","x":"{}","y":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode(&raw[1..33]),
            URL_SAFE_NO_PAD.encode(&raw[33..65])
        ),
    )
    .unwrap();
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64")
        + &format!(
            r#"
auth:
  allow_plaintext_tokens: true
  jwt: {{jwks_file: {}, issuer: "https://kubernetes.default.svc", audiences: [watchproxy]}}
authorization:
  rules:
    - {{subjects: ["group:system:serviceaccounts:ns"], resources: [pods], namespaces: [ns], verbs: [list]}}
"#,
            jwks.display()
        );
    let config = Config::from_yaml(&yaml).unwrap();
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    let sign = |exp: u64| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let claims = serde_json::json!({
            "sub": "system:serviceaccount:ns:reader",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:ns"],
            "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"], "exp": exp,
        });
        encode(&header, &claims, &key).unwrap()
    };
    let good = sign(now + 600);
    let mut listed = None;
    for _ in 0..100 {
        if let Ok(r) = client.list(as_caller(&good, list("ns"))).await {
            listed = Some(r.into_inner());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(names(&listed.expect("listed").items), ["ns/a"]);
    let err = client
        .list(as_caller(&sign(now - 3600), list("ns")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("expired"), "{err:?}");
    let err = client.list(as_caller(&good, list(""))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_the_cache_cannot_answer_as_it_is_have_a_budget_per_user() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_rules(&etcd, dir.path());
    config.limits.costly_reads_per_user_per_second = Some(0.01);
    config.limits.costly_read_burst_per_user = 2;
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_until_listed(&mut client, "alice-token").await;
    let mut revisions = Vec::new();
    for v in 0..4 {
        let rv = put_pod(&mut ec, "tenant-a", "p", &[("v", &v.to_string())], "").await;
        revisions.push(rv);
    }
    put_pod(&mut ec, "tenant-a", "q", &[], "").await;
    let exact = |token: &str, rv: u64| {
        as_caller(
            token,
            pb::ListRequest {
                resource_version: rv.to_string(),
                resource_version_match: pb::ResourceVersionMatch::Exact as i32,
                ..list("tenant-a")
            },
        )
    };
    // Each is the state at an old revision, rebuilt from the window.
    for rv in &revisions[..2] {
        let page = client.list(exact("alice-token", *rv)).await.unwrap();
        assert_eq!(page.into_inner().resource_version, rv.to_string());
    }
    let err = client
        .list(exact("alice-token", revisions[2]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .contains("reads per second from etcd or of old versions"),
        "{err:?}"
    );
    use tonic_types::StatusExt;
    assert!(err.get_details_retry_info().is_some(), "retry advice");
    // What the cache holds as it is stays open to the user, and another
    // user has a budget of its own.
    assert!(client
        .list(as_caller("alice-token", list("tenant-a")))
        .await
        .is_ok());
    assert!(
        client
            .list(exact("alice-token", revisions[0]))
            .await
            .is_ok(),
        "kept: not rebuilt"
    );
    assert!(client.list(exact("node-token", revisions[3])).await.is_ok());
}

/// Waits until `token`'s caller lists tenant-a.
async fn wait_until_listed(client: &mut WatchProxyClient<Channel>, token: &str) {
    for _ in 0..100 {
        if client
            .list(as_caller(token, list("tenant-a")))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("pods did not become ready");
}

/// RequestProgress and List tell a caller only what its rules cover: the
/// state digest (over every object of the resource) goes only to a rule
/// over the whole resource, and only such a caller may bookmark every
/// watch of it.
/// A namespace's reader and a node's reader (a forced field selector) get
/// the versions, no digest, and PERMISSION_DENIED for the bookmarks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_shows_and_bookmarks_only_what_the_rules_cover() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "tenant-a", "p1", &[], "node-7").await;
    put_pod(&mut ec, "tenant-b", "p2", &[], "node-2").await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_config(with_rules(&etcd, dir.path())).await;
    let mut client = proxy.client().await;
    wait_until_listed(&mut client, "alice-token").await;
    let progress = |namespace: &str, bookmark_watches| pb::ProgressRequest {
        resource: "pods".into(),
        namespace: namespace.into(),
        bookmark_watches,
    };
    for (token, namespace) in [("alice-token", "tenant-a"), ("node-token", "")] {
        let answer = client
            .request_progress(as_caller(token, progress(namespace, false)))
            .await
            .unwrap()
            .into_inner();
        assert!(!answer.resource_version.is_empty(), "{token}: {answer:?}");
        assert_eq!(answer.state_digest, "", "{token}: the digest of every pod");
        let page = client
            .list(as_caller(token, list(namespace)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            page.state_digest, "",
            "{token}: a page with the digest of every pod"
        );
        let refused = client
            .request_progress(as_caller(token, progress(namespace, true)))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{token}: {refused:?}"
        );
        assert!(refused.message().contains("bookmark"), "{refused:?}");
    }
}
