//! The Rust client's kube-runtime shape against a real etcd: a
//! `watcher` of `k8s-openapi` pods kept in a store by `reflector` goes
//! through the clients' scenario (not ready at start, writes, a restart, a
//! restart after a compaction) with each failure handed out before its
//! retry, resuming without a list and listing again only when its version
//! is gone; an object that is not a pod is left out and the stream goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use watchproxy::config::Config as ProxyConfig;
use watchproxy_client::watcher::{self, Config, Event};
use watchproxy_client::{reflector, Client, Reason, Store, Typed};

/// What the stream handed out, in order: "init", "done", "apply",
/// "delete", "bookmark", or the failure's reason ("undecodable" for an
/// object that is not a pod).
type Seen = mpsc::UnboundedReceiver<String>;

fn follow(addr: std::net::SocketAddr) -> (Store<Typed<Pod>>, Seen, tokio::task::JoinHandle<()>) {
    let client = Client::builder(format!("http://{addr}"))
        .connect_lazy()
        .unwrap();
    let config = Config::new("pods")
        .label_selector("app=web")
        .backoff(Duration::from_millis(50), Duration::from_secs(1));
    let (store, writer) = reflector::store::<Typed<Pod>>();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let stream = reflector(writer, watcher::watcher(client, config));
        tokio::pin!(stream);
        while let Some(item) = stream.next().await {
            let seen = match item {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(_)) => continue,
                Ok(Event::InitDone { .. }) => "done".into(),
                Ok(Event::Apply(_)) => "apply".into(),
                Ok(Event::Delete(_)) => "delete".into(),
                Ok(Event::Bookmark { .. }) => continue,
                Err(e) if e.is_undecodable() => "undecodable".into(),
                Err(e) => e.reason().map(Reason::to_string).unwrap_or_default(),
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (store, rx, task)
}

/// Waits for `want` among what the stream hands out; what came before it.
async fn wait_for(seen: &mut Seen, want: &str) -> Vec<String> {
    let mut before = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(20), seen.recv()).await;
        let got = next
            .unwrap_or_else(|_| panic!("no {want} after {before:?}"))
            .expect("the stream goes on");
        if got == want {
            return before;
        }
        before.push(got);
    }
}

/// The store's pods: key → (version, node), read through the typed pod.
fn typed_copy(store: &Store<Typed<Pod>>) -> BTreeMap<String, (String, String)> {
    (store.state().iter())
        .map(|pod| {
            let spec = pod.spec.as_ref().expect("a pod's spec");
            let node = spec.node_name.clone().unwrap_or_default();
            (
                pod.meta.key.clone(),
                (pod.meta.resource_version.clone(), node),
            )
        })
        .collect()
}

/// etcd's web pods, as `typed_copy` reads them.
async fn etcd_copy(ec: &mut etcd_client::Client) -> BTreeMap<String, (String, String)> {
    let versions = web_pods(ec).await;
    let values = web_pod_values(ec).await;
    (versions.into_iter())
        .map(|(key, version)| {
            let value: serde_json::Value = serde_json::from_str(&values[&key]).unwrap();
            let node = value["spec"]["nodeName"].as_str().unwrap_or_default();
            (key, (version, node.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_reflector_resumes_across_restarts_and_lists_again_only_when_too_old() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..6 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", app)], "node-1").await;
    }
    // watchproxy starts cut off from etcd: the first List is refused as
    // not ready, handed out, and retried.
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let config = ProxyConfig::from_yaml(&pods_yaml(&forwarder.url, 64)).unwrap();
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = first.local_addr().unwrap();
    let mut proxy = Proxy::start_on(config.clone(), first).await;
    let (store, mut seen, task) = follow(addr);
    wait_for(&mut seen, "NOT_READY").await;
    assert!(!store.is_ready());
    forwarder.restore();
    tokio::time::timeout(Duration::from_secs(20), store.wait_until_ready())
        .await
        .expect("ready")
        .unwrap();
    assert_eq!(typed_copy(&store), etcd_copy(&mut ec).await);
    wait_for(&mut seen, "done").await;

    // Writes, one of them a value that is not a pod: left out, and the
    // stream goes on past it.
    put_pod(&mut ec, "ns", "p0", &[("app", "web")], "node-2").await;
    let bad = r#"{"metadata":{"name":"bad","namespace":"ns","labels":{"app":"web"}},"spec":"not a pod spec"}"#;
    ec.put("/registry/pods/ns/bad", bad, None).await.unwrap();
    put_pod(&mut ec, "ns", "p10", &[("app", "web")], "node-3").await;
    delete_key(&mut ec, "/registry/pods/ns/p2").await;
    delete_key(&mut ec, "/registry/pods/ns/bad").await;
    let before = wait_for(&mut seen, "delete").await;
    assert_eq!(before, ["apply", "undecodable", "apply"]);
    // Its deletion carries its last state, not a pod either.
    wait_for(&mut seen, "undecodable").await;
    assert_eq!(typed_copy(&store), etcd_copy(&mut ec).await);

    // A restart: the watch resumes from its version, no list.
    proxy.stop().await;
    put_pod(&mut ec, "ns", "p12", &[("app", "web")], "node-1").await;
    let mut proxy = Proxy::start_on(config.clone(), listener_at(addr).await).await;
    let before = wait_for(&mut seen, "apply").await;
    assert!(before.contains(&"SHUTTING_DOWN".to_string()), "{before:?}");
    assert!(!before.contains(&"init".to_string()), "resumed: {before:?}");
    assert_eq!(typed_copy(&store), etcd_copy(&mut ec).await);

    // A restart after etcd compacted past its version: too old, so it
    // lists again, and the store takes the difference.
    proxy.stop().await;
    delete_key(&mut ec, "/registry/pods/ns/p4").await;
    let now = put_pod(&mut ec, "ns", "p14", &[("app", "web")], "node-2").await;
    ec.compact(now as i64, None).await.unwrap();
    let _proxy = Proxy::start_on(config, listener_at(addr).await).await;
    let before = wait_for(&mut seen, "done").await;
    assert!(
        before.contains(&"TOO_OLD_RESOURCE_VERSION".to_string()),
        "{before:?}"
    );
    assert_eq!(
        before.last().map(String::as_str),
        Some("init"),
        "{before:?}"
    );
    assert_eq!(typed_copy(&store), etcd_copy(&mut ec).await);
    assert_eq!(store.resource_version(), now.to_string());
    task.abort();
}
