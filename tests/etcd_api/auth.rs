//! The rules hold for etcd's API as for `watchproxy.v1`: each caller sees
//! only what its rules allow, and nothing outside them is sent.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, GetOptions, WatchOptions};
use watchproxy::config::Config;

use super::shared::*;

/// A call of etcd's API as `token`'s caller, with a client that sends the
/// bearer token watchproxy reads.
mod as_caller {
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

/// Keys of a Range's pairs.
fn keys_of(r: &watchproxy::etcdpb::etcdserverpb::RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_hold_for_etcds_api_and_nothing_outside_them_is_sent() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    put_pod(&mut e, "tenant-a", "a1", &[], "node-1").await;
    put_pod(&mut e, "tenant-b", "b1", &[], "node-7").await;
    put_pod(&mut e, "tenant-b", "b2", &[], "node-2").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        + &tenant_auth(dir.path());
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let addr = proxy.addr;
    let mut ready = false;
    for _ in 0..100 {
        if as_caller::range(
            addr,
            Some("alice-token"),
            "/registry/pods/tenant-a/",
            "/registry/pods/tenant-a0",
        )
        .await
        .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "alice reads her namespace");

    // Ranges: a namespace's, or what a forced selector leaves.
    let alice = as_caller::range(
        addr,
        Some("alice-token"),
        "/registry/pods/tenant-a/",
        "/registry/pods/tenant-a0",
    )
    .await
    .unwrap();
    assert_eq!(keys_of(&alice), ["/registry/pods/tenant-a/a1"]);
    for (key, end) in [
        ("/registry/pods/", "/registry/pods0"),
        ("/registry/pods/tenant-b/", "/registry/pods/tenant-b0"),
    ] {
        let denied = as_caller::range(addr, Some("alice-token"), key, end)
            .await
            .unwrap_err();
        assert_eq!(
            denied.code(),
            tonic::Code::PermissionDenied,
            "{key}: {denied:?}"
        );
    }
    let node = as_caller::range(
        addr,
        Some("node-token"),
        "/registry/pods/",
        "/registry/pods0",
    )
    .await
    .unwrap();
    assert_eq!(
        (keys_of(&node), node.count),
        (vec!["/registry/pods/tenant-b/b1".to_owned()], 1)
    );
    let nobody = as_caller::range(addr, None, "/registry/pods/", "/registry/pods0")
        .await
        .unwrap_err();
    assert_eq!(nobody.code(), tonic::Code::Unauthenticated);
    let nobody = as_caller::watch(addr, None).await.map(|_| ()).unwrap_err();
    assert_eq!(nobody.code(), tonic::Code::Unauthenticated);

    // Watches: one outside the rules is created and canceled with the
    // reason, as etcd refuses one; the node's sees only its pods, and a
    // pod moved away from it as a deletion.
    let (tx, mut alice) = as_caller::watch(addr, Some("alice-token")).await.unwrap();
    tx.send(create("/registry/pods/", "/registry/pods0"))
        .await
        .unwrap();
    let refused = alice.message().await.unwrap().unwrap();
    assert!(
        refused.created && refused.canceled && refused.cancel_reason.contains("may not"),
        "{refused:?}"
    );
    let (tx, mut node) = as_caller::watch(addr, Some("node-token")).await.unwrap();
    tx.send(create("/registry/pods/", "/registry/pods0"))
        .await
        .unwrap();
    let created = node.message().await.unwrap().unwrap();
    assert!(created.created && !created.canceled, "{created:?}");
    put_pod(&mut e, "tenant-a", "a2", &[], "node-2").await;
    let onto = put_pod(&mut e, "tenant-a", "a3", &[], "node-7").await as i64;
    let away = put_pod(&mut e, "tenant-b", "b1", &[], "node-2").await as i64;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let r = tokio::time::timeout(Duration::from_secs(10), node.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for ev in r.events {
            let kv = ev.kv.unwrap();
            seen.push((
                ev.r#type,
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.mod_revision,
            ));
        }
    }
    assert_eq!(
        seen,
        [
            (0, "/registry/pods/tenant-a/a3".to_owned(), onto),
            (1, "/registry/pods/tenant-b/b1".to_owned(), away)
        ]
    );
    drop(tx);
    // etcd's own login, as clients configured with a user and password
    // make it: the password is a token watchproxy accepts for that user.
    let url = format!("http://{addr}");
    let login = |user: &str, password: &str| {
        Some(etcd_client::ConnectOptions::new().with_user(user, password))
    };
    let mut alice = Client::connect([&url], login("alice", "alice-token"))
        .await
        .unwrap();
    let mine = alice
        .get(
            "/registry/pods/tenant-a/",
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = mine.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "/registry/pods/tenant-a/a1",
            "/registry/pods/tenant-a/a2",
            "/registry/pods/tenant-a/a3"
        ]
    );
    let others = alice
        .get(
            "/registry/pods/tenant-b/",
            Some(GetOptions::new().with_prefix()),
        )
        .await;
    assert!(
        matches!(others, Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::PermissionDenied)
    );
    let mut watch = alice
        .watch(
            "/registry/pods/tenant-a/",
            Some(WatchOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(!self::created(&mut watch).await.canceled());
    for (user, password) in [
        ("alice", "node-token"),
        ("alice", "wrong"),
        ("bob", "alice-token"),
    ] {
        let refused = Client::connect([&url], login(user, password))
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(
            refused.to_string().contains("authentication failed"),
            "{user}/{password}: {refused}"
        );
    }
}
