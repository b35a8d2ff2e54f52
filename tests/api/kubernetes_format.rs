//! `format: kubernetes`: pods written the way the apiserver stores them
//! (protobuf in the storage envelope, encoded here with the same types)
//! are listed, filtered by `spec.nodeName` and watched, their values sent
//! as stored; a custom resource stored as JSON is served beside them; a
//! value encrypted at rest is counted as such, not as corruption; the
//! demo loads protobuf pods.

use std::process::Command;

use crate::common::*;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use tonic::Code;
use watchproxy::config::Config;
use watchproxy::object::storage_encoding;
use watchproxy::pb::{self, EventType, ListRequest};

const CONFIG: &str = r#"
etcd:
  endpoints: ["ETCD"]
resources:
  - name: pods
    prefix: /registry/pods
    format: kubernetes
    selectable_fields: [spec.nodeName, status.phase]
    indexed_fields: [spec.nodeName]
"#;

fn pod(ns: &str, name: &str, node: &str) -> Vec<u8> {
    let pod = core::Pod {
        metadata: Some(ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{name}")),
            labels: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            node_name: Some(node.into()),
            containers: vec![core::Container {
                name: Some("web".into()),
                image: Some("registry.example/web:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(core::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    };
    storage_encoding("v1", "Pod", &pod)
}

/// The pod a value holds, read as a Kubernetes client reads it.
fn read_pod(value: &[u8]) -> core::Pod {
    let envelope = value.strip_prefix(b"k8s\0").expect("the storage envelope");
    let unknown = Unknown::decode(envelope).unwrap();
    assert_eq!(unknown.type_meta.unwrap().kind.as_deref(), Some("Pod"));
    core::Pod::decode(unknown.raw.unwrap().as_slice()).unwrap()
}

fn on_node(node: &str) -> ListRequest {
    ListRequest {
        resource: "pods".into(),
        field_selector: format!("spec.nodeName={node}"),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_pods_are_listed_filtered_and_watched() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        let node = format!("node-{}", i % 2);
        let name = format!("web-{i}");
        ec.put(
            format!("/registry/pods/ns/{name}"),
            pod("ns", &name, &node),
            None,
        )
        .await
        .unwrap();
    }
    let cr = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","labels":{"app":"web"}},"spec":{"nodeName":"node-0"}}"#;
    ec.put("/registry/pods/ns/widget", &cr[..], None)
        .await
        .unwrap();
    ec.put(
        "/registry/pods/ns/sealed",
        &b"k8s:enc:aescbc:v1:key1:\x00\x9csealed"[..],
        None,
    )
    .await
    .unwrap();
    let config = Config::from_yaml(&CONFIG.replace("ETCD", &etcd.client_url)).unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let page = client.list(on_node("node-1")).await.unwrap().into_inner();
    let names: Vec<String> = page.items.iter().map(|o| o.name.clone()).collect();
    assert_eq!(names, ["web-1", "web-3", "web-5", "web-7", "web-9"]);
    for o in &page.items {
        let pod = read_pod(&o.value);
        assert_eq!(pod.metadata.unwrap().name.as_deref(), Some(o.name.as_str()));
        assert_eq!(o.labels.get("app").map(String::as_str), Some("web"));
    }
    let node0 = client.list(on_node("node-0")).await.unwrap().into_inner();
    assert_eq!(node0.items.len(), 6, "five pods and the custom resource");
    assert_eq!(
        proxy.metric("watchproxy_encrypted_values_total", r#"resource="pods""#),
        1.0
    );
    assert_eq!(
        proxy.metric("watchproxy_undecodable_values_total", r#"resource="pods""#),
        0.0
    );

    // A watch of node-1: a pod scheduled there, one moved away.
    let mut watch = open_watch(
        &mut client,
        pb::WatchRequest {
            field_selector: "spec.nodeName=node-1".into(),
            ..watch_req("pods", &page.resource_version)
        },
    )
    .await;
    ec.put(
        "/registry/pods/ns/web-10",
        pod("ns", "web-10", "node-1"),
        None,
    )
    .await
    .unwrap();
    ec.put(
        "/registry/pods/ns/web-3",
        pod("ns", "web-3", "node-0"),
        None,
    )
    .await
    .unwrap();
    let events = take_events(&mut watch, 2).await;
    let seen: Vec<_> = events
        .iter()
        .map(|e| (summary(e).0, summary(e).1))
        .collect();
    assert_eq!(
        seen,
        [
            (EventType::Added, "ns/web-10".to_string()),
            (EventType::Deleted, "ns/web-3".to_string()),
        ]
    );
    let added = read_pod(&events[0].object.as_ref().unwrap().value);
    assert_eq!(added.spec.unwrap().node_name.as_deref(), Some("node-1"));

    // Projections cut JSON; these values are not.
    let projected = client
        .list(ListRequest {
            metadata_only: true,
            ..on_node("node-1")
        })
        .await
        .unwrap_err();
    assert_eq!(projected.code(), Code::InvalidArgument, "{projected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_loads_pods_as_the_apiserver_stores_them() {
    let etcd = Etcd::start().await;
    let bin = env!("CARGO_BIN_EXE_watchproxy");
    let status = Command::new(bin)
        .args(["demo-load", "--etcd-endpoints", &etcd.client_url])
        .args(["--count", "20", "--nodes", "4", "--format", "kubernetes"])
        .status()
        .unwrap();
    assert!(status.success());
    let config = Config::from_yaml(&CONFIG.replace("ETCD", &etcd.client_url)).unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let items = client
        .list(on_node("node-2"))
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items.len(), 5);
    for o in items {
        let pod = read_pod(&o.value);
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("node-2"));
        assert!(o.labels.contains_key("app"));
    }
}

/// The Rust client's watcher decodes the stored protobuf into `k8s-pb`'s
/// types once per object; a watch event carries the new state decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_decodes_protobuf_pods_into_k8s_pb_types() {
    use tokio_stream::StreamExt;
    use watchproxy_client::watcher::{watcher, Config as WatcherConfig, Event};
    use watchproxy_client::{Client, Protobuf};

    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for (name, node) in [("web-0", "node-0"), ("web-1", "node-1")] {
        let key = format!("/registry/pods/ns/{name}");
        ec.put(key, pod("ns", name, node), None).await.unwrap();
    }
    let config = Config::from_yaml(&CONFIG.replace("ETCD", &etcd.client_url)).unwrap();
    let proxy = Proxy::start_config(config).await;
    let client = Client::builder(format!("http://{}", proxy.addr))
        .connect_lazy()
        .unwrap();
    let on_node_1 = WatcherConfig::new("pods").field_selector("spec.nodeName=node-1");
    let stream = watcher::<Protobuf<core::Pod>>(client, on_node_1);
    tokio::pin!(stream);
    let mut next = async || {
        loop {
            let item = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next());
            match item.await.expect("an event").expect("the stream goes on") {
                Ok(Event::Bookmark { .. } | Event::Init) => continue,
                // The cache is not ready yet: retried.
                Err(e) if e.code() == tonic::Code::Unavailable => continue,
                other => return other.unwrap(),
            }
        }
    };
    let Event::InitApply(listed) = next().await else {
        panic!("the list's pod")
    };
    assert_eq!(listed.meta.name, "web-1");
    let node = |pod: &core::Pod| pod.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(node(&listed).as_deref(), Some("node-1"));
    assert!(matches!(next().await, Event::InitDone { .. }));
    let moved = ec
        .put(
            "/registry/pods/ns/web-0",
            pod("ns", "web-0", "node-1"),
            None,
        )
        .await
        .unwrap();
    let Event::Apply(scheduled) = next().await else {
        panic!("the pod scheduled on node-1")
    };
    assert_eq!(scheduled.meta.name, "web-0");
    let version = moved.header().unwrap().revision().to_string();
    assert_eq!(scheduled.meta.resource_version, version);
    assert_eq!(node(&scheduled).as_deref(), Some("node-1"));
    assert_eq!(
        scheduled.metadata.as_ref().unwrap().uid.as_deref(),
        Some("uid-web-0")
    );
}

/// `k8s-openapi`'s types read the JSON values of a `format: kubernetes`
/// resource (built-in types where the apiserver stores JSON, custom
/// resources); a protobuf value is left out with an error that says how to
/// read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_openapi_types_read_the_json_values_and_name_the_protobuf_ones() {
    use k8s_openapi::api::core::v1::Pod as OpenApiPod;
    use tokio_stream::StreamExt;
    use watchproxy_client::watcher::{watcher, Config as WatcherConfig, Event};
    use watchproxy_client::{Client, Typed};

    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let json = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-json","namespace":"ns","uid":"uid-json","labels":{"app":"web"}},"spec":{"nodeName":"node-1","containers":[{"name":"web","image":"registry.example/web:1"}]},"status":{"phase":"Running"}}"#;
    ec.put("/registry/pods/ns/web-json", json, None)
        .await
        .unwrap();
    let protobuf = pod("ns", "web-pb", "node-1");
    ec.put("/registry/pods/ns/web-pb", protobuf, None)
        .await
        .unwrap();
    let config = Config::from_yaml(&CONFIG.replace("ETCD", &etcd.client_url)).unwrap();
    let proxy = Proxy::start_config(config).await;
    let client = Client::builder(format!("http://{}", proxy.addr))
        .connect_lazy()
        .unwrap();
    let stream = watcher::<Typed<OpenApiPod>>(client, WatcherConfig::new("pods"));
    tokio::pin!(stream);
    let (mut read, mut refused) = (Vec::new(), Vec::new());
    loop {
        let item = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next());
        match item.await.expect("an event").expect("the stream goes on") {
            Ok(Event::InitApply(pod)) => read.push(pod),
            Ok(Event::InitDone { .. }) => break,
            Ok(_) => {}
            Err(e) if e.is_undecodable() => refused.push(e),
            // The cache is not ready yet: retried.
            Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e}"),
        }
    }
    let [pod] = &read[..] else { panic!("{read:?}") };
    assert_eq!(pod.meta.name, "web-json");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-1"));
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.example/web:1")
    );
    let [refusal] = &refused[..] else {
        panic!("{refused:?}")
    };
    let message = refusal.message();
    assert!(message.contains("/registry/pods/ns/web-pb"), "{message}");
    assert!(message.contains("Protobuf<T>"), "{message}");
}
