//! TLS for clients, on both serve paths: mutual TLS admits only clients
//! with a certificate from the configured CA, and rotated files are used
//! by new handshakes while open watches go on. Certificates are made here.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use rcgen::{CertifiedIssuer, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use watchproxy::config::{ClientAuth, Config, ServePath, TlsConfig};
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, EventType};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    // Replaced by rename, as cert-manager and projected volumes do.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// The server's TLS files, written in `dir`: a certificate for
/// `localhost` from `ca`, and `client_ca` to require client certificates
/// from.
fn server_tls(
    dir: &Path,
    ca: &CertifiedIssuer<'static, KeyPair>,
    client_ca: Option<&CertifiedIssuer<'static, KeyPair>>,
) -> TlsConfig {
    let (cert, key) = test_leaf(ca, "watchproxy", &["localhost"], false);
    TlsConfig {
        cert_file: write(dir, "tls.crt", &cert),
        key_file: write(dir, "tls.key", &key),
        client_ca_file: client_ca.map(|c| write(dir, "ca.crt", &c.pem())),
        client_auth: client_ca.map(|_| ClientAuth::Required),
    }
}

fn config(etcd: &Etcd, tls: TlsConfig, path: ServePath) -> Config {
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64");
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.tls = Some(tls);
    config.watch.serve_path = path;
    config.validate().unwrap();
    config
}

/// A client that trusts `ca_pem` and presents `identity`, if any.
async fn client(
    proxy: &Proxy,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> Result<WatchProxyClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{}", proxy.addr))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(WatchProxyClient::new(channel))
}

/// Whether a List through this client succeeds.
async fn lists(client: Result<WatchProxyClient<Channel>, tonic::transport::Error>) -> bool {
    let Ok(mut client) = client else {
        return false;
    };
    let req = pb::ListRequest {
        resource: "pods".into(),
        ..Default::default()
    };
    tokio::time::timeout(Duration::from_secs(10), client.list(req))
        .await
        .is_ok_and(|r| r.is_ok())
}

async fn mutual_tls_admits_only_certificates_from_the_client_ca(path: ServePath) {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let rev = put_pod(&mut ec, "ns", "a", &[], "").await;
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca, other_ca) = (
        test_ca("server ca"),
        test_ca("client ca"),
        test_ca("other ca"),
    );
    let tls = server_tls(dir.path(), &server_ca, Some(&client_ca));
    let mut config = config(&etcd, tls, path);
    // The certificate names the caller: only alice may read.
    config.authorization = Some(
        serde_yaml_ng::from_str(
            r#"{rules: [{subjects: ["user:alice"], resources: ["*"], namespaces: ["*"], verbs: [list, get, watch]}]}"#,
        )
        .unwrap(),
    );
    let proxy = Proxy::start_config(config).await;
    let trust = server_ca.pem();

    let alice = test_leaf(&client_ca, "alice", &[], false);
    let mut ok = client(&proxy, &trust, Some(&alice)).await.unwrap();
    wait_ready(&mut ok, "pods").await;
    let mut watch = open_watch(&mut ok, watch_req("pods", "")).await;
    let first = take_events(&mut watch, 1).await;
    assert_eq!(summary(&first[0]), (EventType::Added, "ns/a".into(), rev));

    assert!(
        !lists(client(&proxy, &trust, None).await).await,
        "no certificate"
    );
    let stranger = test_leaf(&other_ca, "mallory", &[], false);
    assert!(
        !lists(client(&proxy, &trust, Some(&stranger)).await).await,
        "a certificate from another CA"
    );
    let expired = test_leaf(&client_ca, "alice", &[], true);
    assert!(
        !lists(client(&proxy, &trust, Some(&expired)).await).await,
        "an expired certificate"
    );
    let bob = test_leaf(&client_ca, "bob", &[], false);
    let mut bob = client(&proxy, &trust, Some(&bob)).await.unwrap();
    let denied = bob
        .list(pb::ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(
        denied.message().starts_with("bob may not list pods"),
        "{denied:?}"
    );
    // Probes that cannot present a certificate use the plain-text health
    // port, which serves nothing else.
    let channel = Channel::from_shared(format!("http://{}", proxy.health_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let check = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "liveness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(check.status(), ServingStatus::Serving);
    let mut other = WatchProxyClient::new(channel);
    let refused = other
        .list(pb::ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
    let plain = WatchProxyClient::connect(format!("http://{}", proxy.addr)).await;
    assert!(!lists(plain).await, "plain text on the TLS port");
    assert!(
        proxy.metric("watchproxy_tls_handshakes_total", "result=\"failed\"") >= 3.0,
        "refused handshakes are counted"
    );
    // The one admitted client still works after the refusals.
    assert!(lists(Ok(ok)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_certificates_from_the_client_ca_on_the_fast_path() {
    mutual_tls_admits_only_certificates_from_the_client_ca(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_certificates_from_the_client_ca_on_the_tonic_path() {
    mutual_tls_admits_only_certificates_from_the_client_ca(ServePath::Tonic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_files_serve_new_handshakes_while_open_watches_go_on() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (test_ca("old ca"), test_ca("new ca"));
    let tls = server_tls(dir.path(), &old_ca, None);
    let cert_file = tls.cert_file.clone();
    let proxy = Proxy::start_config(config(&etcd, tls, ServePath::Fast)).await;
    let mut first = client(&proxy, &old_ca.pem(), None).await.unwrap();
    wait_ready(&mut first, "pods").await;
    let mut watch = open_watch(&mut first, watch_req("pods", "")).await;

    // A file that cannot be used: counted, and the pair in use stays.
    write(dir.path(), "tls.crt", "not a certificate");
    let failed = || proxy.metric("watchproxy_tls_reloads_total", "result=\"failed\"");
    wait_until("the bad file is seen and refused", || failed() >= 1.0).await;
    assert!(lists(client(&proxy, &old_ca.pem(), None).await).await);

    // A new pair from another CA: new handshakes use it within seconds.
    let new = test_leaf(&new_ca, "watchproxy", &["localhost"], false);
    write(dir.path(), "tls.key", &new.1);
    write(dir.path(), "tls.crt", &new.0);
    let mut rotated = false;
    for _ in 0..100 {
        if lists(client(&proxy, &new_ca.pem(), None).await).await {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rotated, "{} in use within 10 s", cert_file.display());
    assert!(
        !lists(client(&proxy, &old_ca.pem(), None).await).await,
        "the old certificate is no longer offered"
    );

    // The watch opened before the rotation goes on.
    let rev = put_pod(&mut ec, "ns", "after", &[], "").await;
    let e = take_events(&mut watch, 1).await;
    assert_eq!(summary(&e[0]), (EventType::Added, "ns/after".into(), rev));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_and_python_clients_speak_mutual_tls() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[("app", "web")], "").await;
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (test_ca("server ca"), test_ca("client ca"));
    let tls = server_tls(dir.path(), &server_ca, Some(&client_ca));
    let proxy = Proxy::start_config(config(&etcd, tls, ServePath::Fast)).await;
    let (cert, key) = test_leaf(&client_ca, "alice", &[], false);
    let trust = |ca: &str| {
        watchproxy_client::ClientTlsConfig::new()
            .ca_certificate(watchproxy_client::Certificate::from_pem(ca))
            .identity(watchproxy_client::Identity::from_pem(&cert, &key))
            .domain_name("localhost")
    };
    let endpoint = format!("https://{}", proxy.addr);

    // A server certificate from another CA fails at connect, clearly.
    let other = test_ca("other ca").pem();
    let refused = (watchproxy_client::Client::builder(&endpoint).tls(trust(&other)))
        .connect()
        .await
        .err()
        .expect("a server the CA did not sign is refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");

    let client = (watchproxy_client::Client::builder(&endpoint).tls(trust(&server_ca.pem())))
        .connect()
        .await
        .unwrap();
    let informer = watchproxy_client::Informer::new(client, "pods").start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_until_synced())
        .await
        .expect("synced over mTLS")
        .unwrap();
    assert!(informer.store().get("ns", "a").is_some());

    let file = |name: &str, text: &str| write(dir.path(), name, text).display().to_string();
    let (ca, cert, key) = (
        file("client-trust.crt", &server_ca.pem()),
        file("client.crt", &cert),
        file("client.key", &key),
    );
    let out = python3()
        .args([
            "-m",
            "watchproxy",
            "--ca",
            &ca,
            "--cert",
            &cert,
            "--key",
            &key,
        ])
        .arg(format!("localhost:{}", proxy.addr.port()))
        .args(["get", "pods", "ns", "a"])
        .output()
        .expect("python3 with the package's requirements: run ./scripts/install-deps.sh");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && printed.contains(r#""name": "a""#),
        "{printed} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The command line, as kubectl's flags say it.
    let cli = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_watchproxy"))
            .args(["get", "pods", "a", "-n", "ns", "-o", "name"])
            .args(["--server", &format!("localhost:{}", proxy.addr.port())])
            .args(["--ca", &ca])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = cli(&["--cert", &cert, "--key", &key]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pods/a\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without its certificate, the server refuses the caller.
    let out = cli(&[]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
}
