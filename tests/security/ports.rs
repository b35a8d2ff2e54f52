//! What a client can make the routes beside the API hold before it is
//! identified: the health-only listener, health and reflection on the main
//! port, and etcd's Authenticate. Each hostile client leaves many requests
//! unfinished, each declaring far more than such a request needs; the
//! service (in this test's process) is measured by its own memory gauge,
//! and a well-behaved caller is served afterwards.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::SendStream;

use crate::common::*;
use crate::preauth::{call, config, each_path, framed, h2_client, head};
use watchproxy::config::ServePath;

const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const REFLECTION: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";

/// What unfinished requests may make the service hold, at most, in MiB.
const HELD_MIB: f64 = 40.0;

fn resident_mib(proxy: &Proxy) -> f64 {
    let text = http_get(&proxy.metrics_addr.to_string(), "/metrics");
    metric_value(&text, "process_resident_memory_bytes", "") / (1 << 20) as f64
}

/// A connection to `addr` with `streams` requests to `route`, none
/// finished: each declares a message of `declared` bytes and sends `sent`
/// bytes of it. Kept open while what it returns lives.
struct Unfinished {
    _send: SendRequest<Bytes>,
    _streams: Vec<(ResponseFuture, SendStream<Bytes>)>,
}

async fn unfinished(
    addr: SocketAddr,
    route: &str,
    streams: usize,
    declared: u32,
    sent: usize,
) -> Unfinished {
    let send = h2_client(addr).await;
    let mut body = vec![0u8];
    body.extend_from_slice(&declared.to_be_bytes());
    body.resize(sent, 0);
    let body = Bytes::from(body);
    let mut open = Vec::new();
    for _ in 0..streams {
        // A refused stream or a closed connection is the service bounding
        // this client: what it kept is measured all the same.
        let Ok(mut ready) = send.clone().ready().await else {
            break;
        };
        let Ok((response, mut stream)) = ready.send_request(head(route, false, false), false)
        else {
            break;
        };
        let _ = stream.send_data(body.clone(), false);
        open.push((response, stream));
    }
    Unfinished {
        _send: send,
        _streams: open,
    }
}

/// How much more memory the service holds, in MiB, while `hostile`'s
/// requests are unfinished (given time for their bytes to arrive).
async fn held_while(proxy: &Proxy, hostile: impl Future<Output = Unfinished>) -> f64 {
    let before = resident_mib(proxy);
    let kept = hostile.await;
    let mut most = 0.0f64;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        most = most.max(resident_mib(proxy) - before);
    }
    drop(kept);
    most
}

/// A health check as a probe makes it.
async fn serving(addr: SocketAddr) -> Result<tonic::Code, String> {
    let mut send = h2_client(addr).await;
    call(
        &mut send,
        head(HEALTH_CHECK, false, false),
        framed(&[], false),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_only_port_holds_what_a_health_check_needs() {
    each_path("max_concurrent_unary: 4096", async |path, proxy| {
        // 200 checks declaring 4 MiB, 1 MiB of each sent.
        let hostile = unfinished(proxy.health_addr, HEALTH_CHECK, 200, 4 << 20, 1 << 20);
        let held = held_while(proxy, hostile).await;
        assert!(held < HELD_MIB, "{path:?}: {held:.0} MiB held");
        assert_eq!(
            serving(proxy.health_addr).await,
            Ok(tonic::Code::Ok),
            "{path:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_on_the_main_port_hold_what_they_need() {
    each_path("max_concurrent_unary: 4096", async |path, proxy| {
        for route in [HEALTH_CHECK, REFLECTION] {
            let hostile = unfinished(proxy.addr, route, 200, 4 << 20, 1 << 20);
            let held = held_while(proxy, hostile).await;
            assert!(held < HELD_MIB, "{path:?} {route}: {held:.0} MiB held");
        }
        assert_eq!(serving(proxy.addr).await, Ok(tonic::Code::Ok), "{path:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_authenticate_holds_what_a_login_needs() {
    for path in [ServePath::Fast, ServePath::Tonic] {
        let etcd = Etcd::start().await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(&etcd, dir.path(), path, "max_concurrent_unary: 4096");
        config.etcd_api.enabled = true;
        let proxy = Proxy::start_config(config).await;
        // 2,000 logins declaring 64 KiB, all but a little of each sent.
        let hostile = unfinished(proxy.addr, AUTHENTICATE, 2000, 64 << 10, 60_000);
        let held = held_while(&proxy, hostile).await;
        assert!(held < HELD_MIB, "{path:?}: {held:.0} MiB held");
        assert_eq!(serving(proxy.addr).await, Ok(tonic::Code::Ok), "{path:?}");
    }
}
