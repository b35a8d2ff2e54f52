//! TLS to etcd: watchproxy reads an etcd that asks for client
//! certificates; a CA etcd's certificate is not from, or an expired
//! certificate of etcd's, fails the start with a clear error instead of
//! endless retries.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use watchproxy::config::Config;
use watchproxy_testkit::EtcdOptions;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The pods configuration for `etcd`, over TLS with these files.
fn config(etcd: &Etcd, ca: &str, cert: &str, key: &str) -> Config {
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64")
        .replace(
            "  request_timeout: 2s",
            // Room for the handshake on a loaded machine.
            &format!("  request_timeout: 10s\n  tls: {{ca_file: {ca}, cert_file: {cert}, key_file: {key}}}"),
        );
    let config = Config::from_yaml(&yaml).unwrap();
    config.validate().unwrap();
    config
}

async fn start_error(config: Config) -> String {
    let mut proxy = Proxy::start_config(config).await;
    let ended = tokio::time::timeout(Duration::from_secs(30), proxy.task.take().unwrap())
        .await
        .expect("the start fails within 30 s")
        .unwrap();
    format!("{:#}", ended.expect_err("the start fails"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchproxy_reads_an_etcd_that_asks_for_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd_ca, other_ca) = (test_ca("etcd ca"), test_ca("other ca"));
    let server = test_leaf(&etcd_ca, "etcd", &["localhost", "127.0.0.1"], false);
    let client = test_leaf(&etcd_ca, "watchproxy", &[], false);
    let files = |prefix: &str, (cert, key): &(String, String)| {
        (
            write(dir.path(), &format!("{prefix}.crt"), cert),
            write(dir.path(), &format!("{prefix}.key"), key),
        )
    };
    let (server_cert, server_key) = files("server", &server);
    let (client_cert, client_key) = files("client", &client);
    let ca_file = write(dir.path(), "ca.crt", &etcd_ca.pem());
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(etcd_ca.pem()))
        .identity(etcd_client::Identity::from_pem(&client.0, &client.1));
    let etcd = Etcd::start_with(EtcdOptions {
        extra_args: vec![
            format!("--cert-file={server_cert}"),
            format!("--key-file={server_key}"),
            format!("--trusted-ca-file={ca_file}"),
            "--client-cert-auth".into(),
        ],
        client_tls: Some(tls),
        ..EtcdOptions::default()
    })
    .await
    .unwrap();
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "").await;

    let proxy = Proxy::start_config(config(&etcd, &ca_file, &client_cert, &client_key)).await;
    let mut wp = proxy.client().await;
    wait_ready(&mut wp, "pods").await;
    assert_eq!(list_items(&mut wp, "pods").await.len(), 1);
    drop(proxy);

    let other = write(dir.path(), "other.crt", &other_ca.pem());
    let err = start_error(config(&etcd, &other, &client_cert, &client_key)).await;
    assert!(
        err.contains("TLS to etcd"),
        "a CA etcd's certificate is not from: {err}"
    );

    // etcd reads its certificate again for each handshake: from now on it
    // serves an expired one, which watchproxy refuses at start.
    let expired = test_leaf(&etcd_ca, "etcd", &["localhost", "127.0.0.1"], true);
    write(dir.path(), "server.crt", &expired.0);
    write(dir.path(), "server.key", &expired.1);
    let err = start_error(config(&etcd, &ca_file, &client_cert, &client_key)).await;
    assert!(
        err.contains("TLS to etcd") && err.to_lowercase().contains("expired"),
        "etcd's certificate expired: {err}"
    );
}
