//! Tiers: an edge watchproxy whose resources come from a core watchproxy
//! (`upstream:`) instead of etcd. etcd sees the core's watches only; the
//! edge lists and watches what etcd holds, at etcd's revisions, so a
//! client can resume on either tier with the versions the other gave; an
//! edge follows its core through a restart of the core.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use watchproxy::config::Config;
use watchproxy::pb::{self, EventType};

fn edge_config(etcd_url: &str, core: std::net::SocketAddr) -> Config {
    let yaml = format!("upstream: http://{core}\n{}", pods_yaml(etcd_url, 64));
    Config::from_yaml(&yaml).unwrap()
}

async fn listed(
    client: &mut pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
) -> BTreeMap<String, String> {
    list_items(client, "pods")
        .await
        .into_iter()
        .map(|o| (o.key, String::from_utf8_lossy(&o.value).into_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_serves_what_etcd_holds_through_its_core() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..20 {
        put_pod(
            &mut ec,
            "ns",
            &format!("p-{i}"),
            &[("app", "web")],
            "node-1",
        )
        .await;
    }
    let watches_before = etcd.metric("etcd_debugging_mvcc_watcher_total");
    let (core, mut core_client) = proxy_ready(&etcd).await;
    let edge = Proxy::start_config(edge_config(&etcd.client_url, core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    wait_ready(&mut client, "nodes").await;
    wait_ready(&mut client, "blobs").await;
    // One watch per resource, the core's; the edge holds none.
    let watches = etcd.metric("etcd_debugging_mvcc_watcher_total") - watches_before;
    assert_eq!(watches, 3.0, "the core's three resources");
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);

    // A watch on the edge gets exactly the later writes, at etcd's
    // revisions; the same version resumes on the core.
    let rv = list_version(&mut client, "pods", "").await;
    let mut on_edge = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;
    let mut on_core = open_watch(&mut core_client, watch_req("pods", &rv.to_string())).await;
    let mut written = Vec::new();
    for i in 0..10 {
        let r = put_pod(&mut ec, "ns", &format!("p-{i}"), &[("app", "db")], "node-2").await;
        written.push((EventType::Modified, format!("ns/p-{i}"), r));
    }
    written.push((
        EventType::Deleted,
        "ns/p-19".into(),
        delete_key(&mut ec, "/registry/pods/ns/p-19").await,
    ));
    let r = put_pod(&mut ec, "ns", "new", &[], "node-1").await;
    written.push((EventType::Added, "ns/new".into(), r));
    let edge_saw: Vec<_> = take_events(&mut on_edge, 12)
        .await
        .iter()
        .map(summary)
        .collect();
    let core_saw: Vec<_> = take_events(&mut on_core, 12)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(edge_saw, written);
    assert_eq!(core_saw, written);
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);

    // The field index and selectors work on the edge as on the core.
    let on_node = pb::ListRequest {
        resource: "pods".into(),
        field_selector: "spec.nodeName=node-2".into(),
        ..Default::default()
    };
    let items = client.list(on_node).await.unwrap().into_inner().items;
    assert_eq!(items.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_follows_its_core_through_a_restart() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "before", &[], "node-1").await;
    let (mut core, _) = proxy_ready(&etcd).await;
    let core_addr = core.addr;
    let edge = Proxy::start_config(edge_config(&etcd.client_url, core_addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    let rv = list_version(&mut client, "pods", "").await;
    let mut watch = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;

    core.stop().await;
    let during = put_pod(&mut ec, "ns", "during", &[], "node-1").await;
    let config = Config::from_yaml(&pods_yaml(&etcd.client_url, 64)).unwrap();
    let _core = Proxy::start_on(config, listener_at(core_addr).await).await;
    let after = put_pod(&mut ec, "ns", "after", &[], "node-1").await;

    // The edge's own watchers see every change once, in order, whether
    // the edge resumed its core or listed it again.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(30), watch.message())
            .await
            .expect("an event within 30 s")
            .expect("the watch goes on")
            .expect("not ended");
        if e.r#type != EventType::Bookmark as i32 {
            seen.push(summary(&e));
        }
    }
    assert_eq!(
        seen,
        [
            (EventType::Added, "ns/during".to_string(), during),
            (EventType::Added, "ns/after".to_string(), after),
        ]
    );
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);
}
