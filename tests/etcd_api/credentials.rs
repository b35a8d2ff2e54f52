//! An etcd Watch stream lives only as long as its caller's credential and
//! rules allow it, as a `watchproxy.v1` watch does: an idle stream ends
//! when its token leaves its file, a watch of keys read from etcd
//! (`outside: forward`) ends at its JWT's `exp` and when a narrowed rule
//! no longer gives keys of no resource; each with the contract's reason.
//! On both serve paths.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use tonic::{Code, Status, Streaming};
use watchproxy::config::{Config, ServePath};
use watchproxy::etcdpb::etcdserverpb::{WatchRequest, WatchResponse};

use super::shared::*;

fn on_path(yaml: &str, path: ServePath) -> Config {
    let mut config = Config::from_yaml(yaml).unwrap();
    config.watch.serve_path = path;
    config
}

/// The reason of the ErrorInfo a status carries.
fn reason(status: &Status) -> String {
    let details = tonic_types::StatusExt::get_error_details(status);
    (details.error_info()).map_or_else(String::new, |i| i.reason.clone())
}

/// Reads `stream` until it ends, at most `within`: its status and when it
/// came. What else it sent is passed over.
async fn end_of(stream: &mut Streaming<WatchResponse>, within: Duration) -> (Status, SystemTime) {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Err(_) => panic!("the stream did not end within {within:?}"),
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => panic!("the stream ended with no status"),
            Ok(Err(status)) => return (status, SystemTime::now()),
        }
    }
}

/// Sends `create` on `tx` and waits for its `created` answer.
async fn created_on(
    tx: &tokio::sync::mpsc::Sender<WatchRequest>,
    stream: &mut Streaming<WatchResponse>,
    create: WatchRequest,
) -> WatchResponse {
    tx.send(create).await.unwrap();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the creation answered within 10 s")
            .unwrap()
            .expect("the stream is open");
        if r.created {
            return r;
        }
    }
}

/// A stream with no watch, answered once (a creation the rules refuse),
/// ends with CREDENTIAL_REVOKED once its token leaves the token file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_ends_when_its_token_leaves_its_file() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    put_pod(&mut e, "tenant-a", "a1", &[], "node-1").await;
    for path in PATHS {
        let dir = tempfile::tempdir().unwrap();
        let yaml = pods_yaml(&etcd.client_url, 64)
            .replace("resources:", "etcd_api: {enabled: true}\nresources:")
            + &tenant_auth(dir.path());
        let proxy = Proxy::start_config(on_path(&yaml, path)).await;
        let addr = proxy.addr;
        let (key, end) = ("/registry/pods/tenant-a/", "/registry/pods/tenant-a0");
        until_readable(addr, "alice-token", key, end).await;
        let (tx, mut alice) = as_caller::watch(addr, Some("alice-token")).await.unwrap();
        let refused = create("/registry/pods/tenant-b/", "/registry/pods/tenant-b0");
        let answered = created_on(&tx, &mut alice, refused).await;
        assert!(answered.canceled, "{path:?}: {answered:?}");

        let kept = TENANT_TOKENS.lines().filter(|l| !l.contains("alice"));
        write(
            dir.path(),
            "tokens.yaml",
            &kept.collect::<Vec<_>>().join("\n"),
        );
        let (status, _) = end_of(&mut alice, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{path:?}: {status:?}");
        assert_eq!(reason(&status), "CREDENTIAL_REVOKED", "{path:?}");
        let err = as_caller::range(addr, Some("alice-token"), key, end).await;
        assert_eq!(err.unwrap_err().code(), Code::Unauthenticated, "{path:?}");
    }
}

/// Every caller of the `system:serviceaccounts:ns` group may read
/// everything, keys of no resource too.
const NS_READS_ALL: &str = r#"
authorization:
  rules:
    - {subjects: ["group:system:serviceaccounts:ns"], resources: ["*"], namespaces: ["*"], verbs: [list, get, watch]}
"#;

/// A watch of keys outside every served prefix, read from etcd, ends
/// within 2 s of its JWT's `exp` with CREDENTIAL_EXPIRED, while changes
/// of those keys go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_watch_ends_within_2_s_of_its_jwts_exp() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    for path in PATHS {
        let dir = tempfile::tempdir().unwrap();
        let k1 = issuer("k1");
        let jwks = write(dir.path(), "jwks.json", &k1.jwks);
        let yaml = pods_yaml(&etcd.client_url, 64).replace(
            "resources:",
            "etcd_api: {enabled: true, outside: forward}\nresources:",
        ) + &JWT_AUTH.replace("JWKS", &jwks.display().to_string())
            + NS_READS_ALL;
        let proxy = Proxy::start_config(on_path(&yaml, path)).await;
        let addr = proxy.addr;
        let exp = now() + 3;
        let token = k1.token("k1", exp);
        until_readable(addr, &token, "/registry/pods/", "/registry/pods0").await;
        let (tx, mut stream) = as_caller::watch(addr, Some(&token)).await.unwrap();
        let answered = created_on(&tx, &mut stream, create("/other/", "/other0")).await;
        assert!(!answered.canceled, "{path:?}: {answered:?}");

        let writes = async {
            for i in 0..40 {
                e.put(format!("/other/{i}"), "v", None).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let ((status, at), ()) = tokio::join!(end_of(&mut stream, Duration::from_secs(10)), writes);
        let late = at.duration_since(UNIX_EPOCH + Duration::from_secs(exp));
        let late = late.expect("not before exp");
        eprintln!("{path:?}: the forwarded watch ended {late:?} after its JWT's exp");
        assert!(
            late <= Duration::from_secs(2),
            "{path:?}: ended {late:?} after exp"
        );
        assert_eq!(status.code(), Code::Unauthenticated, "{path:?}: {status:?}");
        assert_eq!(reason(&status), "CREDENTIAL_EXPIRED", "{path:?}");
    }
}

const ROOT_TOKENS: &str = "- {token: root-token, user: root}\n";

/// root may read every resource; keys of no resource only while its rule
/// names no resource (`*`).
fn rules(tokens: &Path, resources: &str) -> String {
    format!(
        r#"
auth:
  tokens_file: {}
  allow_plaintext_tokens: true
authorization:
  rules:
    - {{subjects: ["user:root"], resources: [{resources}], namespaces: ["*"], verbs: [list, get, watch]}}
"#,
        tokens.display()
    )
}

/// A rule narrowed from every resource to the served ones leaves the
/// scope of each cache part as it was, but no longer gives keys of no
/// resource: a watch merged over the gaps between the prefixes and one
/// wholly outside them end with ACCESS_CHANGED; a watch of pods alone
/// goes on and sees the next change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_rule_ends_the_watches_of_keys_of_no_resource() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    put_pod(&mut e, "ns-1", "web-1", &[], "node-1").await;
    for path in PATHS {
        let dir = tempfile::tempdir().unwrap();
        let tokens = write(dir.path(), "tokens.yaml", ROOT_TOKENS);
        let serve = match path {
            ServePath::Fast => "fast",
            ServePath::Tonic => "tonic",
        };
        let config = |resources: &str| {
            pods_yaml(&etcd.client_url, 64)
                .replace(
                    "resources:",
                    "etcd_api: {enabled: true, outside: forward}\nresources:",
                )
                .replace(
                    "  watcher_queue: 64",
                    &format!("  watcher_queue: 64\n  serve_path: {serve}"),
                )
                + &rules(&tokens, resources)
        };
        let file = write(dir.path(), "config.yaml", &config(r#""*""#));
        let proxy = Proxy::start_config(Config::from_file(&file).unwrap()).await;
        let addr = proxy.addr;
        until_readable(addr, "root-token", "/registry/pods/", "/registry/pods0").await;
        let mut open = Vec::new();
        for (key, end) in [
            ("/registry/", "/registry0"),
            ("/other/", "/other0"),
            ("/registry/pods/", "/registry/pods0"),
        ] {
            let (tx, mut stream) = as_caller::watch(addr, Some("root-token")).await.unwrap();
            let answered = created_on(&tx, &mut stream, create(key, end)).await;
            assert!(!answered.canceled, "{path:?} {key}: {answered:?}");
            open.push((tx, stream));
        }

        write(dir.path(), "config.yaml", &config("pods, nodes"));
        let [(_m, merged), (_o, outside), (_p, pods)] = &mut open[..] else {
            unreachable!()
        };
        for (what, stream) in [("merged", merged), ("outside", outside)] {
            let (status, _) = end_of(stream, Duration::from_secs(10)).await;
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{path:?} {what}: {status:?}"
            );
            assert_eq!(reason(&status), "ACCESS_CHANGED", "{path:?} {what}");
        }
        let revision = put_pod(&mut e, "ns-1", "web-1", &[("v", "2")], "node-1").await;
        let next = tokio::time::timeout(Duration::from_secs(10), pods.message())
            .await
            .expect("the pods watch goes on")
            .unwrap()
            .expect("the pods watch is open");
        let kv = next.events[0].kv.as_ref().unwrap();
        assert_eq!(kv.mod_revision, revision as i64, "{path:?}");
    }
}
