//! Credential files that fail closed: a token file that is removed or
//! does not parse ends every token it held, their watches with them.

use std::time::Duration;

use tonic::transport::Channel;
use tonic::Code;
use watchproxy::config::ServePath;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;

use crate::common::*;
use crate::stay_authorized::{list_as, read_until_end, reason_and_resume, TwoUsers};

async fn unusable_token_file(path: ServePath) {
    let TwoUsers {
        etcd: _etcd,
        dir,
        tokens,
        proxy,
        mut client,
        mut alice,
        mut bob,
        ..
    } = TwoUsers::start(path).await;
    let unusable = |proxy: &Proxy| {
        let text = http_get(&proxy.metrics_addr.to_string(), "/metrics");
        metric_value(
            &text,
            "watchproxy_credential_files_unusable_total",
            "file=\"tokens\"",
        )
    };
    assert_eq!(unusable(&proxy), 0.0);
    std::fs::remove_file(&tokens).unwrap();
    for (who, watch) in [("alice", &mut alice), ("bob", &mut bob)] {
        let (status, _, _) = read_until_end(watch, Duration::from_secs(10)).await;
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{path:?} {who}: {status:?}"
        );
        assert_eq!(reason_and_resume(&status).0, "CREDENTIAL_REVOKED", "{who}");
    }
    assert_eq!(unusable(&proxy), 1.0, "{path:?}");
    let err = list_as(&mut client, "bob-1").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{path:?}");

    // A file that does not parse, after one that did: the same.
    std::fs::write(
        dir.path().join("tokens.yaml"),
        "- {token: bob-2, user: bob}\n",
    )
    .unwrap();
    let served = until_listed(&mut client, "bob-2", true).await;
    assert!(served, "{path:?}: the file written again is read");
    std::fs::write(dir.path().join("tokens.yaml"), "- {token: [unclosed").unwrap();
    let refused = until_listed(&mut client, "bob-2", false).await;
    assert!(
        refused,
        "{path:?}: a file that does not parse ends its tokens"
    );
    assert_eq!(unusable(&proxy), 2.0, "{path:?}");
}

/// Whether, within 5 s, a List with `token` comes to succeed (`served`) or
/// to be refused.
async fn until_listed(client: &mut WatchProxyClient<Channel>, token: &str, served: bool) -> bool {
    for _ in 0..50 {
        if list_as(client, token).await.is_ok() == served {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_that_cannot_be_used_ends_its_tokens_on_the_fast_path() {
    unusable_token_file(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_that_cannot_be_used_ends_its_tokens_on_the_tonic_path() {
    unusable_token_file(ServePath::Tonic).await;
}
