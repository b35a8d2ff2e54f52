//! What the modules of this binary share: a proxy with etcd's API on
//! either serve path, a history of every kind of write, and reading a
//! watch stream.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, WatchResponse, WatchStream};
use watchproxy::config::{Config, ServePath};
use watchproxy::etcdpb::etcdserverpb::{WatchCreateRequest, WatchRequest};

pub const PATHS: [ServePath; 2] = [ServePath::Fast, ServePath::Tonic];

/// Forwarding needs rules that say who may read keys of no resource:
/// here, every caller.
pub const EVERYONE_READS_ALL: &str = r#"
authorization:
  rules:
    - {subjects: ["*"], resources: ["*"], namespaces: ["*"], verbs: [list, get, watch]}
"#;

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

/// A call of etcd's API as `token`'s caller, with a client that sends the
/// bearer token watchproxy reads.
pub mod as_caller {
    use http::uri::PathAndQuery;
    use tonic::metadata::MetadataValue;
    use tonic::transport::Channel;
    use tonic::{Request, Status, Streaming};
    use tonic_prost::ProstCodec;
    use watchproxy::etcdpb::etcdserverpb::{
        RangeRequest, RangeResponse, WatchRequest, WatchResponse,
    };

    async fn grpc(addr: std::net::SocketAddr) -> tonic::client::Grpc<Channel> {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        grpc
    }

    fn with_token<T>(token: Option<&str>, message: T) -> Request<T> {
        let mut req = Request::new(message);
        if let Some(token) = token {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
            req.metadata_mut().insert("authorization", value);
        }
        req
    }

    pub async fn range(
        addr: std::net::SocketAddr,
        token: Option<&str>,
        key: &str,
        end: &str,
    ) -> Result<RangeResponse, Status> {
        let req = RangeRequest {
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
            ..Default::default()
        };
        let path = PathAndQuery::from_static("/etcdserverpb.KV/Range");
        let mut grpc = grpc(addr).await;
        let answer = grpc
            .unary(with_token(token, req), path, ProstCodec::default())
            .await;
        answer.map(|r| r.into_inner())
    }

    /// A Watch stream: its requests' sender and its responses.
    pub async fn watch(
        addr: std::net::SocketAddr,
        token: Option<&str>,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<WatchRequest>,
            Streaming<WatchResponse>,
        ),
        Status,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let path = PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        let mut grpc = grpc(addr).await;
        let answer = grpc
            .streaming(with_token(token, requests), path, ProstCodec::default())
            .await?;
        Ok((tx, answer.into_inner()))
    }
}

/// Waits up to 10 s until `token`'s caller can read `key`..`end` (the
/// cache is ready); what the last try answered otherwise.
pub async fn until_readable(addr: std::net::SocketAddr, token: &str, key: &str, end: &str) {
    let mut last = None;
    for _ in 0..100 {
        match as_caller::range(addr, Some(token), key, end).await {
            Ok(_) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{token} cannot read {key}: {last:?}");
}

/// watchproxy with etcd's API and the tenant fixture's tokens and rules,
/// and the directory that holds its token file; returned once alice reads
/// her namespace through it.
pub async fn tenant_proxy(etcd: &Etcd) -> (tempfile::TempDir, Proxy) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        + &tenant_auth(dir.path());
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    until_readable(
        proxy.addr,
        "alice-token",
        "/registry/pods/tenant-a/",
        "/registry/pods/tenant-a0",
    )
    .await;
    (dir, proxy)
}
