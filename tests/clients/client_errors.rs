//! Every class of failure a client can meet, decoded from the status
//! details the same way by the Rust client and by grpcio (the Python
//! package): the reason, the versions in the metadata, the retry advice
//! and the fields of a bad request.

use crate::common::*;
use serde_json::Value;
use watchproxy::config::Config;
use watchproxy_client::pb::{GetRequest, ListRequest, WatchRequest};
use watchproxy_client::{Client, Error};

const TOKENS: &str = "
- {token: alice-token, user: alice}
- {token: bob-token, user: bob}
- {token: carol-token, user: carol}
";

const RULES: &str = r#"
auth:
  tokens_file: TOKENS
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["user:alice", "user:carol"]
      resources: ["pods", "nodes", "blobs"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
"#;

/// What a decoded failure says, in the terms both clients share.
#[derive(Debug, PartialEq)]
struct Decoded {
    code: String,
    reason: Option<String>,
    metadata: Vec<String>,
    retry: bool,
    violations: Vec<String>,
}

fn from_rust(e: &Error) -> Decoded {
    Decoded {
        code: code_name(e.code()),
        reason: e.reason().map(|r| r.as_str().to_owned()),
        metadata: e.metadata().keys().cloned().collect(),
        retry: e.retry_delay().is_some(),
        violations: e
            .field_violations()
            .iter()
            .map(|v| v.field.clone())
            .collect(),
    }
}

fn from_python(line: &Value) -> Decoded {
    let mut metadata: Vec<String> = line["metadata"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    metadata.sort();
    Decoded {
        code: line["code"].as_str().unwrap().to_owned(),
        reason: line["reason"].as_str().map(String::from),
        metadata,
        retry: !line["retry_delay"].is_null(),
        violations: (line["violations"].as_array().unwrap().iter())
            .map(|v| v[0].as_str().unwrap().to_owned())
            .collect(),
    }
}

/// Runs `python -m watchproxy` with `args` as the holder of `token`; the
/// failure it printed.
fn python(dir: &std::path::Path, addr: &str, token: &str, args: &[&str]) -> Decoded {
    let token_file = dir.join(format!("{token}.txt"));
    std::fs::write(&token_file, token).unwrap();
    let out = python3()
        .args(["-m", "watchproxy", "--token-file"])
        .arg(&token_file)
        .arg(addr)
        .args(args)
        .output()
        .expect("python3 with grpcio and grpcio-status is required: run ./scripts/install-deps.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    from_python(&serde_json::from_str(stderr.lines().last().unwrap()).unwrap())
}

async fn watch_error(client: &Client, request: WatchRequest) -> Error {
    match client.watch(request).await {
        Err(e) => e,
        Ok(mut watch) => loop {
            match watch.next().await {
                Err(e) => break e,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the watch ended without an error"),
            }
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_class_is_decoded_alike_by_the_rust_client_and_by_grpcio() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[("app", "web")], "").await;
    let now = put_pod(&mut ec, "ns", "b", &[("app", "web")], "").await;
    ec.compact(now as i64, None).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let yaml =
        pods_yaml(&etcd.client_url, 64) + &RULES.replace("TOKENS", &tokens.display().to_string());
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.limits.max_watchers_per_user = Some(1);
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let addr = proxy.addr.to_string();
    let as_user = |token: &str| {
        Client::builder(format!("http://{addr}"))
            .token(token)
            .connect_lazy()
            .unwrap()
    };
    let (alice, bob, carol) = (
        as_user("alice-token"),
        as_user("bob-token"),
        as_user("carol-token"),
    );
    for _ in 0..100 {
        if alice
            .list(ListRequest {
                resource: "pods".into(),
                ..Default::default()
            })
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let pods = |f: fn(&mut ListRequest)| {
        let mut r = ListRequest {
            resource: "pods".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let too_large = (now + 1000).to_string();

    // carol holds her one watch, so her next is over her limit.
    let mut held = carol
        .watch(WatchRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    held.next().await.unwrap();

    let cases: Vec<(Error, &str, Vec<&str>, &str, &str)> = vec![
        (
            alice
                .list(pods(|r| r.resource = "secrets".into()))
                .await
                .unwrap_err(),
            "alice-token",
            vec!["list", "secrets"],
            "NOT_FOUND",
            "UNKNOWN_RESOURCE",
        ),
        (
            (alice.get(GetRequest {
                resource: "pods".into(),
                namespace: "ns".into(),
                name: "missing".into(),
                ..Default::default()
            }))
            .await
            .unwrap_err(),
            "alice-token",
            vec!["get", "pods", "ns", "missing"],
            "NOT_FOUND",
            "NOT_FOUND",
        ),
        (
            alice
                .list(pods(|r| r.label_selector = "app in (a".into()))
                .await
                .unwrap_err(),
            "alice-token",
            vec!["list", "pods", "--selector", "app in (a"],
            "INVALID_ARGUMENT",
            "BAD_SELECTOR",
        ),
        (
            watch_error(
                &alice,
                WatchRequest {
                    resource: "pods".into(),
                    resource_version: "1".into(),
                    ..Default::default()
                },
            )
            .await,
            "alice-token",
            vec!["watch", "pods", "--resource-version", "1"],
            "OUT_OF_RANGE",
            "TOO_OLD_RESOURCE_VERSION",
        ),
        (
            (alice.get(GetRequest {
                resource: "pods".into(),
                namespace: "ns".into(),
                name: "a".into(),
                resource_version: too_large.clone(),
                ..Default::default()
            }))
            .await
            .unwrap_err(),
            "alice-token",
            vec!["get", "pods", "ns", "a", "--resource-version", &too_large],
            "UNAVAILABLE",
            "TOO_LARGE_RESOURCE_VERSION",
        ),
        (
            watch_error(
                &carol,
                WatchRequest {
                    resource: "pods".into(),
                    ..Default::default()
                },
            )
            .await,
            "carol-token",
            vec!["watch", "pods"],
            "RESOURCE_EXHAUSTED",
            "LIMIT",
        ),
        (
            as_user("wrong").list(pods(|_| ())).await.unwrap_err(),
            "wrong",
            vec!["list", "pods"],
            "UNAUTHENTICATED",
            "UNAUTHENTICATED",
        ),
        (
            bob.list(pods(|_| ())).await.unwrap_err(),
            "bob-token",
            vec!["list", "pods"],
            "PERMISSION_DENIED",
            "PERMISSION_DENIED",
        ),
    ];
    for (rust, token, args, code, reason) in cases {
        let decoded = from_rust(&rust);
        assert_eq!(
            (decoded.code.as_str(), decoded.reason.as_deref()),
            (code, Some(reason)),
            "{rust}"
        );
        let by_grpcio = tokio::task::block_in_place(|| python(dir.path(), &addr, token, &args));
        assert_eq!(decoded, by_grpcio, "{args:?}");
        match reason {
            "BAD_SELECTOR" => assert_eq!(decoded.violations, ["label_selector"]),
            "TOO_OLD_RESOURCE_VERSION" => {
                let version = |v: Option<&str>| v.unwrap().parse::<u64>().unwrap();
                assert!(version(rust.oldest_resource_version()) > 1, "{rust:?}");
                assert_eq!(version(rust.current_resource_version()), now, "{rust:?}");
            }
            "TOO_LARGE_RESOURCE_VERSION" => assert!(rust.retry_delay().is_some()),
            _ => {}
        }
    }
    drop(held);
}
