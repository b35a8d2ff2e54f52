//! Test harness: a real etcd in a temporary directory on free loopback
//! ports, watchproxy served in-process, and helpers to drive both.
#![allow(dead_code)] // each test binary uses a different part of the harness

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::Client;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use watchproxy::config::Config;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, WatchEvent};
use watchproxy::Listeners;

mod auth;
mod etcd_clients;
mod forwarder;
mod informers;

#[allow(unused_imports)]
pub use auth::{as_caller, issuer, now, tenant_auth, write, Issuer, JWT_AUTH, TENANT_TOKENS};
#[allow(unused_imports)]
pub use etcd_clients::{created, etcd_api_proxy, events_until, kv, watch_events_until, Ev, Kv};
#[allow(unused_imports)]
pub use forwarder::Forwarder;
#[allow(unused_imports)]
pub use informers::{
    lines_of, node_informer, python3, python_aio_informer, python_informer, External, Mirror,
};
pub use watchproxy_testkit::{http_get, metric_value, Etcd};

/// [`PODS_CONFIG`] for `etcd_url` with a watcher queue of 64 and `limits`
/// (YAML lines under `limits:`) in place of the default limits.
pub fn pods_config_with_limits(etcd_url: &str, limits: &str) -> Config {
    let yaml = PODS_CONFIG
        .replace("ETCD", etcd_url)
        .replace("QUEUE", "64")
        .replace("max_concurrent_unary: 4096", limits);
    Config::from_yaml(&yaml).unwrap()
}

/// [`PODS_CONFIG`] for `etcd_url` with a watcher queue of 64, and `more`
/// (top-level YAML: `auth`, `authorization`, …) after it.
pub fn pods_config_and(etcd_url: &str, more: &str) -> Config {
    let yaml = PODS_CONFIG.replace("ETCD", etcd_url).replace("QUEUE", "64") + more;
    Config::from_yaml(&yaml).unwrap()
}

pub const PODS_CONFIG: &str = r#"
etcd:
  endpoints: ["ETCD"]
  request_timeout: 2s
watch:
  bookmark_interval: 1s
  freshness_wait: 2s
  watcher_queue: QUEUE
limits:
  max_concurrent_unary: 4096
shutdown_grace: 5s
resources:
  - name: pods
    prefix: /registry/pods
    selectable_fields: [spec.nodeName, status.phase]
    indexed_fields: [spec.nodeName]
  - name: nodes
    prefix: /registry/minions
    namespaced: false
  - name: blobs
    prefix: /blobs
    namespaced: false
    format: raw
"#;

/// A listener on `addr` again, once the instance that had it let it go.
pub async fn listener_at(addr: SocketAddr) -> tokio::net::TcpListener {
    for _ in 0..50 {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot bind {addr} again");
}

/// [`PODS_CONFIG`] for `etcd_url` (one or more endpoints) with a watcher
/// queue of `queue`, as YAML to amend.
pub fn pods_yaml(etcd_url: &str, queue: usize) -> String {
    PODS_CONFIG
        .replace("ETCD", etcd_url)
        .replace("QUEUE", &queue.to_string())
}

/// watchproxy served in-process; stopped on drop.
pub struct Proxy {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// Plain-text `grpc.health.v1` only.
    pub health_addr: SocketAddr,
    /// Kubernetes' API, when the configuration enables it.
    pub kubernetes_addr: Option<SocketAddr>,
    pub shutdown: CancellationToken,
    pub task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Proxy {
    pub async fn start(etcd_url: &str) -> Proxy {
        Self::start_with(etcd_url, 256).await
    }

    pub async fn start_with(etcd_url: &str, queue: usize) -> Proxy {
        Self::start_config(Config::from_yaml(&pods_yaml(etcd_url, queue)).unwrap()).await
    }

    pub async fn start_config(config: Config) -> Proxy {
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(config, grpc).await
    }

    /// Serves on a given listener, e.g. the port of an instance stopped
    /// before, so clients reconnect to the same address.
    pub async fn start_on(config: Config, grpc: tokio::net::TcpListener) -> Proxy {
        let kubernetes = match config.kubernetes_api.enabled {
            true => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
            false => None,
        };
        Self::start_listening(config, grpc, kubernetes).await
    }

    /// [`Proxy::start_on`], Kubernetes' API on a given listener too.
    pub async fn start_listening(
        config: Config,
        grpc: tokio::net::TcpListener,
        kubernetes: Option<tokio::net::TcpListener>,
    ) -> Proxy {
        if std::env::var_os("RUST_LOG").is_some() {
            watchproxy::telemetry::init_logging(false);
        }
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, metrics_addr) = (grpc.local_addr().unwrap(), metrics.local_addr().unwrap());
        let health_addr = health.local_addr().unwrap();
        let kubernetes_addr = kubernetes.as_ref().map(|l| l.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(watchproxy::run(
            config,
            Listeners {
                grpc,
                metrics: Some(metrics),
                health: Some(health),
                kubernetes,
            },
            shutdown.clone(),
        ));
        Proxy {
            addr,
            metrics_addr,
            health_addr,
            kubernetes_addr,
            shutdown,
            task: Some(task),
        }
    }

    pub async fn client(&self) -> WatchProxyClient<Channel> {
        WatchProxyClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        metric_value(
            &http_get(&self.metrics_addr.to_string(), "/metrics"),
            name,
            labels,
        )
    }

    /// Stops the service and waits until every task has exited.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("watchproxy stops within 20 s")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn pod_json(name: &str, ns: &str, labels: &[(&str, &str)], node: &str) -> String {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    })
    .to_string()
}

/// Compacts all of etcd's history up to its current revision. A history
/// already compacted there (no write since the last call) is no error.
pub async fn compact_all(c: &mut Client) {
    let head = c.get("/", None).await.unwrap().header().unwrap().revision();
    match c.compact(head, None).await {
        Ok(_) => {}
        Err(etcd_client::Error::GRpcStatus(s))
            if s.code() == tonic::Code::OutOfRange && s.message().contains("compacted") => {}
        Err(e) => panic!("compacting to {head}: {e}"),
    }
}

/// Puts a pod; returns the revision of the write.
pub async fn put_pod(
    c: &mut Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    node: &str,
) -> u64 {
    let key = format!("/registry/pods/{ns}/{name}");
    let r = c
        .put(key, pod_json(name, ns, labels, node), None)
        .await
        .unwrap();
    r.header().unwrap().revision() as u64
}

pub async fn delete_key(c: &mut Client, key: &str) -> u64 {
    let r = c.delete(key, None).await.unwrap();
    r.header().unwrap().revision() as u64
}

/// Waits until List with an unset version succeeds (the cache is ready).
pub async fn wait_ready(client: &mut WatchProxyClient<Channel>, resource: &str) {
    for _ in 0..100 {
        let req = pb::ListRequest {
            resource: resource.into(),
            limit: 1,
            ..Default::default()
        };
        if client.list(req).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{resource} did not become ready");
}

pub fn watch_req(resource: &str, rv: &str) -> pb::WatchRequest {
    pb::WatchRequest {
        resource: resource.into(),
        resource_version: rv.into(),
        ..Default::default()
    }
}

/// (type, namespace/name, resource version) of an event.
pub fn summary(e: &WatchEvent) -> (pb::EventType, String, u64) {
    let o = e.object.clone().unwrap_or_default();
    (
        pb::EventType::try_from(e.r#type).unwrap(),
        format!("{}/{}", o.namespace, o.name),
        o.resource_version.parse().unwrap_or(0),
    )
}

/// The next message, failing the test if none comes within 10 s.
pub async fn next_event(
    stream: &mut tonic::Streaming<WatchEvent>,
) -> Result<Option<WatchEvent>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no watch event within 10 s")
}

/// Reads `n` events that are not bookmarks.
pub async fn take_events(stream: &mut tonic::Streaming<WatchEvent>, n: usize) -> Vec<WatchEvent> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = next_event(stream)
            .await
            .unwrap()
            .expect("stream ended early");
        if e.r#type != pb::EventType::Bookmark as i32 {
            out.push(e);
        }
    }
    out
}

/// The resource versions of the next `n` events that are not bookmarks.
pub async fn take_versions(stream: &mut tonic::Streaming<WatchEvent>, n: usize) -> Vec<u64> {
    take_events(stream, n)
        .await
        .iter()
        .map(|e| summary(e).2)
        .collect()
}

/// A fresh etcd and a watchproxy in front of it whose `pods` cache is ready.
pub async fn start_ready() -> (Etcd, Proxy, WatchProxyClient<Channel>) {
    let etcd = Etcd::start().await;
    let (proxy, client) = proxy_ready(&etcd).await;
    (etcd, proxy, client)
}

/// A watchproxy in front of `etcd` whose `pods` cache is ready.
pub async fn proxy_ready(etcd: &Etcd) -> (Proxy, WatchProxyClient<Channel>) {
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    (proxy, client)
}

/// The resource version of a List of `resource` with version `rv`.
pub async fn list_version(client: &mut WatchProxyClient<Channel>, resource: &str, rv: &str) -> u64 {
    let req = pb::ListRequest {
        resource: resource.into(),
        resource_version: rv.into(),
        ..Default::default()
    };
    client
        .list(req)
        .await
        .unwrap()
        .into_inner()
        .resource_version
        .parse()
        .unwrap()
}

/// The version a status tells the client to resume from.
pub fn resume_version(status: &tonic::Status) -> u64 {
    let v = status
        .metadata()
        .get("watchproxy-resume-resource-version")
        .expect("a resume version");
    v.to_str().unwrap().parse().unwrap()
}

/// Reads a watch until it ends with an error, returning the error and the
/// versions of the events before it.
pub async fn until_error(stream: &mut tonic::Streaming<WatchEvent>) -> (tonic::Status, Vec<u64>) {
    let mut seen = Vec::new();
    loop {
        match next_event(stream).await {
            Ok(Some(e)) => seen.push(summary(&e).2),
            Ok(None) => panic!("the watch ended with OK, not an error"),
            Err(status) => return (status, seen),
        }
    }
}

/// Opens a watch that must be accepted.
pub async fn open_watch(
    client: &mut WatchProxyClient<Channel>,
    req: pb::WatchRequest,
) -> tonic::Streaming<WatchEvent> {
    client
        .watch(req)
        .await
        .expect("the watch is accepted")
        .into_inner()
}

/// The items of a consistent List of a whole resource.
pub async fn list_items(client: &mut WatchProxyClient<Channel>, resource: &str) -> Vec<pb::Object> {
    let req = pb::ListRequest {
        resource: resource.into(),
        ..Default::default()
    };
    client
        .list(req)
        .await
        .expect("the list succeeds")
        .into_inner()
        .items
}

/// How long a fault campaign's checker writes in each case: 5 s in the
/// test command, or `CAMPAIGN_SECONDS` for the long soak
/// (`CAMPAIGN_SECONDS=60 cargo test --release --test faults guarantees::
/// -- --nocapture`; `--test etcd_api campaign::` for etcd's API).
pub fn campaign_writes() -> Duration {
    let seconds = std::env::var("CAMPAIGN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    Duration::from_secs(seconds)
}

/// Waits up to 10 s for `done`; fails the test naming `what` otherwise.
pub async fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 10 s");
}

/// A CA made for a test.
pub fn test_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// The `tls` section of a watchproxy serving `localhost` with a
/// certificate from `server_ca` and verifying client certificates against
/// `client_ca` (PEM): the files written to `dir`, the client CA as
/// `client_ca_file` (a test may write it again).
#[allow(dead_code)]
pub fn mutual_tls(
    dir: &std::path::Path,
    server_ca: &CertifiedIssuer<'static, KeyPair>,
    client_ca: &str,
    client_ca_file: &str,
) -> String {
    let (cert, key) = test_leaf(server_ca, "watchproxy", &["localhost"], false);
    format!(
        "tls: {{cert_file: {}, key_file: {}, client_ca_file: {}}}\n",
        write(dir, "tls.crt", &cert).display(),
        write(dir, "tls.key", &key).display(),
        write(dir, client_ca_file, client_ca).display(),
    )
}

/// A certificate and its key, in PEM, issued by `ca`: subject CN `cn`,
/// organization `tenant-a`, for `names`; long expired if `expired`.
pub fn test_leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    names: &[&str],
    expired: bool,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "tenant-a");
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A client certificate from `ca` for user `cn`, valid until `not_after`
/// (whole seconds since the epoch).
pub fn leaf_until(
    ca: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    not_after: u64,
) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(not_after);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// etcd's pods labelled app=web: key → mod revision, as an informer with
/// the selector `app=web` must end up holding.
pub async fn web_pods(c: &mut Client) -> std::collections::BTreeMap<String, String> {
    pods_by(c, true, |kv| kv.mod_revision().to_string()).await
}

/// etcd's pods labelled app=web: key → value. A resync's events carry
/// the version the lost history starts from, not each object's, so a
/// copy made through one is compared by value.
pub async fn web_pod_values(c: &mut Client) -> std::collections::BTreeMap<String, String> {
    pods_by(c, true, value_of).await
}

/// etcd's pods: key → value.
pub async fn pod_values(c: &mut Client) -> std::collections::BTreeMap<String, String> {
    pods_by(c, false, value_of).await
}

fn value_of(kv: &etcd_client::KeyValue) -> String {
    String::from_utf8_lossy(kv.value()).into_owned()
}

/// etcd's pods (only those labelled app=web with `web`), by key.
async fn pods_by(
    c: &mut Client,
    web: bool,
    f: impl Fn(&etcd_client::KeyValue) -> String,
) -> std::collections::BTreeMap<String, String> {
    let all = c
        .get(
            "/registry/pods/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    all.kvs()
        .iter()
        .filter(|kv| !web || String::from_utf8_lossy(kv.value()).contains(r#""app":"web""#))
        .map(|kv| (kv.key_str().unwrap().to_owned(), f(kv)))
        .collect()
}

/// `OutOfRange` as the protocol (and grpcio) spells it: `OUT_OF_RANGE`.
pub fn code_name(code: tonic::Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}
