//! What the modules of this binary share: a proxy with etcd's API on
//! either serve path, a history of every kind of write, and reading a
//! watch stream.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, WatchResponse, WatchStream};
use watchproxy::config::{Config, ServePath};
use watchproxy::etcdpb::etcdserverpb::{WatchCreateRequest, WatchRequest};

pub const PATHS: [ServePath; 2] = [ServePath::Fast, ServePath::Tonic];

pub fn config(etcd_url: &str, path: ServePath) -> Config {
    let yaml =
        pods_yaml(etcd_url, 256).replace("resources:", "etcd_api: {enabled: true}\nresources:");
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config
}

pub async fn proxy(etcd_url: &str, path: ServePath) -> (Proxy, Client) {
    etcd_api_proxy(config(etcd_url, path)).await
}

/// Writes of every kind etcd records: creations, a transaction of two
/// keys, an update, a key with a lease, a deletion, and keys of other
/// resources and of none. Returns etcd's revision after them.
pub async fn write_history(c: &mut Client) -> i64 {
    put_pod(c, "ns-1", "web-1", &[("app", "web")], "node-1").await;
    put_pod(c, "ns-1", "web-2", &[("app", "web")], "node-2").await;
    put_pod(c, "ns-2", "db-1", &[("app", "db")], "node-1").await;
    let txn = Txn::new()
        .when([Compare::version(
            "/registry/pods/ns-2/db-2",
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                "/registry/pods/ns-2/db-2",
                pod_json("db-2", "ns-2", &[], "node-2"),
                None,
            ),
            TxnOp::put(
                "/registry/pods/ns-1/web-1",
                pod_json("web-1", "ns-1", &[("v", "2")], "node-1"),
                None,
            ),
        ]);
    c.txn(txn).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    let leased = pod_json("leased", "ns-3", &[], "node-3");
    let options = etcd_client::PutOptions::new().with_lease(lease);
    c.put("/registry/pods/ns-3/leased", leased, Some(options))
        .await
        .unwrap();
    put_pod(c, "ns-1", "web-2", &[("app", "web"), ("v", "3")], "node-2").await;
    delete_key(c, "/registry/pods/ns-2/db-1").await;
    c.put("/registry/minions/node-1", "{}", None).await.unwrap();
    c.put("/registry/configmaps/ns-1/cm", "{}", None)
        .await
        .unwrap();
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

/// The next response of `stream` within 10 s.
pub async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a response within 10 s")
        .unwrap()
        .expect("the stream is open")
}

pub fn create(key: &str, end: &str) -> WatchRequest {
    use watchproxy::etcdpb::etcdserverpb::watch_request::RequestUnion;
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
            ..Default::default()
        })),
    }
}
