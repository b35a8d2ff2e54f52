//! Credential files that fail closed: a token file that is removed or
//! does not parse ends every token it held, their watches with them.

use std::time::Duration;

use tonic::transport::Channel;
use tonic::Code;
use watchproxy::config::ServePath;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;

use crate::common::*;
use crate::stay_authorized::{
    config_text, list_as, read_until_end, reason_and_resume, start_from, tls_client, watch_from,
    TwoUsers,
};
use watchproxy::pb;

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

/// A client CA taken out of `client_ca_file` ends the watches of the
/// connections whose certificates it signed, with CREDENTIAL_REVOKED, and
/// refuses their calls after; a certificate of the CA now in the file is
/// served.
async fn client_ca_rotated_out(path: ServePath) {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, old_ca, new_ca) = (test_ca("server-ca"), test_ca("old-ca"), test_ca("new-ca"));
    let tls = mutual_tls(dir.path(), &server_ca, &old_ca.pem(), "ca.crt");
    let file = write(dir.path(), "config.yaml", &config_text(&etcd, path, &tls));
    let proxy = start_from(&file).await;
    let agent = leaf_until(&old_ca, "agent", now() + 600);
    let mut client = tls_client(&proxy, &server_ca.pem(), &agent).await;
    wait_ready(&mut client, "pods").await;
    let from = list_version(&mut client, "pods", "").await;
    let mut stream = open_watch(&mut client, watch_from("", from)).await;

    write(dir.path(), "ca.crt", &new_ca.pem());
    let (status, _, _) = read_until_end(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{path:?}: {status:?}");
    assert_eq!(
        reason_and_resume(&status).0,
        "CREDENTIAL_REVOKED",
        "{path:?}"
    );
    let err = (client.list(pb::ListRequest {
        resource: "pods".into(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(
        reason_and_resume(&err).0,
        "CREDENTIAL_REVOKED",
        "{path:?}: {err:?}"
    );

    let fresh = leaf_until(&new_ca, "agent", now() + 600);
    let mut client = tls_client(&proxy, &server_ca.pem(), &fresh).await;
    assert!(list_version(&mut client, "pods", "").await > 0, "{path:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_rotated_out_ends_its_connections_watches_on_the_fast_path() {
    client_ca_rotated_out(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_rotated_out_ends_its_connections_watches_on_the_tonic_path() {
    client_ca_rotated_out(ServePath::Tonic).await;
}

/// A user name is a user of the authenticator that names it: a token that
/// names a certificate's user does not spend that user's budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_naming_a_certificates_user_spends_its_own_budget() {
    use tonic::transport::{Certificate, ClientTlsConfig};
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (test_ca("server-ca"), test_ca("client-ca"));
    let (cert, key) = test_leaf(&server_ca, "watchproxy", &["localhost"], false);
    let tokens = write(
        dir.path(),
        "tokens.yaml",
        "- {token: alice-token, user: alice}\n",
    );
    let extra = format!(
        "tls: {{cert_file: {}, key_file: {}, client_ca_file: {}, client_auth: optional}}\n\
         auth: {{tokens_file: {}}}\n",
        write(dir.path(), "tls.crt", &cert).display(),
        write(dir.path(), "tls.key", &key).display(),
        write(dir.path(), "ca.crt", &client_ca.pem()).display(),
        tokens.display(),
    );
    let text = config_text(&etcd, ServePath::Fast, &extra).replace(
        "max_concurrent_unary: 4096",
        "max_concurrent_unary: 4096\n  max_watchers_per_user: 1",
    );
    let proxy = start_from(&write(dir.path(), "config.yaml", &text)).await;
    let alice = leaf_until(&client_ca, "alice", now() + 600);
    let mut certified = tls_client(&proxy, &server_ca.pem(), &alice).await;
    wait_ready(&mut certified, "pods").await;
    let from = list_version(&mut certified, "pods", "").await;
    let _held = open_watch(&mut certified, watch_from("", from)).await;

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca.pem()))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", proxy.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut tokened = WatchProxyClient::new(channel);
    let call = tokened
        .watch(as_caller("alice-token", watch_from("", from)))
        .await;
    assert!(
        call.is_ok(),
        "the token's alice has a place of her own: {call:?}"
    );
    let again = certified.watch(watch_from("", from)).await.unwrap_err();
    assert_eq!(
        again.code(),
        Code::ResourceExhausted,
        "the certificate's alice has used hers"
    );
}
