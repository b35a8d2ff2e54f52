//! Clients in other languages: the informers in examples/python and
//! examples/node list, watch with a selector, resume after watchproxy
//! restarts and list again when their version has expired, each ending
//! with etcd's state.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use etcd_client::GetOptions;
use watchproxy::config::Config;

fn python() -> Command {
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, grpc_status"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "python3 with grpcio, grpcio-tools and grpcio-status is required: run ./scripts/install-deps.sh (pip install grpcio grpcio-tools grpcio-status)");
    let mut c = Command::new("python3");
    c.env(
        "PYTHONPATH",
        concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"),
    )
    .arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python/informer.py"
    ));
    c
}

fn node() -> Command {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/node");
    let ok = Command::new("node")
        .arg("--version")
        .status()
        .is_ok_and(|s| s.success())
        && std::path::Path::new(dir)
            .join("node_modules/@grpc/grpc-js")
            .is_dir();
    assert!(ok, "Node.js with the example's packages is required: run ./scripts/install-deps.sh (npm ci --prefix examples/node)");
    let mut c = Command::new("node");
    c.arg(format!("{dir}/informer.js"));
    c
}

/// Waits for the informer to log `event` for the `nth` time.
fn wait_for_log(lines: &mpsc::Receiver<String>, seen: &mut Vec<String>, event: &str, nth: usize) {
    while seen.iter().filter(|l| l.contains(event)).count() < nth {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                panic!("no {event:?} #{nth} from the informer; it said: {seen:#?}")
            });
        seen.push(line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_informer_resumes_across_restarts_and_relists_when_too_old() {
    informer_follows_etcd(python()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_informer_resumes_across_restarts_and_relists_when_too_old() {
    informer_follows_etcd(node()).await;
}

/// Runs `informer` (its command and script) through a start before the
/// cache is ready, writes, a restart, and a restart after etcd compacted
/// past its version.
async fn informer_follows_etcd(mut informer: Command) {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", app)], "").await;
    }
    // watchproxy starts cut off from etcd, so the informer's first List
    // finds the cache not ready (UNAVAILABLE at once) and retries.
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let yaml = pods_yaml(&forwarder.url, 64);
    let config = Config::from_yaml(&yaml).unwrap();
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = first.local_addr().unwrap();
    let mut proxy = Proxy::start_on(config.clone(), first).await;

    let mut child = informer
        .args([
            &addr.to_string(),
            "pods",
            "--selector",
            "app=web",
            "--until",
            "stop",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    tokio::task::block_in_place(|| wait_for_log(&lines, &mut seen, "list unavailable", 1));
    forwarder.restore();
    tokio::task::block_in_place(|| wait_for_log(&lines, &mut seen, "listed", 1));

    // Changes the informer follows: an update, a new object, a deletion,
    // and an object that starts matching the selector.
    put_pod(&mut ec, "ns", "p0", &[("app", "web"), ("v", "2")], "").await;
    put_pod(&mut ec, "ns", "p10", &[("app", "web")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/p2").await;
    put_pod(&mut ec, "ns", "p1", &[("app", "web")], "").await;
    let sent = |proxy: &Proxy| {
        let m = |name| proxy.metric(name, "resource=\"pods\"");
        m("watchproxy_deliveries_total") + m("watchproxy_replayed_events_total")
    };
    wait_until("the four changes are sent to the informer", || {
        sent(&proxy) >= 4.0
    })
    .await;

    // Restart: the informer resumes from its version on the new instance.
    proxy.stop().await;
    put_pod(&mut ec, "ns", "p12", &[("app", "web")], "").await;
    let mut proxy = Proxy::start_on(config.clone(), listener_at(addr).await).await;
    tokio::task::block_in_place(|| wait_for_log(&lines, &mut seen, "resuming", 1));
    put_pod(&mut ec, "ns", "p14", &[("app", "web")], "").await;
    wait_until("p12 and p14 are sent to the informer", || {
        sent(&proxy) >= 2.0
    })
    .await;

    // Restart after etcd compacted past the informer's version: too old,
    // so it lists again.
    proxy.stop().await;
    delete_key(&mut ec, "/registry/pods/ns/p4").await;
    let now = put_pod(&mut ec, "ns", "p16", &[("app", "web")], "").await;
    ec.compact(now as i64, None).await.unwrap();
    let _proxy = Proxy::start_on(config, listener_at(addr).await).await;
    tokio::task::block_in_place(|| wait_for_log(&lines, &mut seen, "listed", 2));
    put_pod(&mut ec, "ns", "stop", &[("app", "web")], "").await;

    let out = tokio::task::block_in_place(|| child.wait_with_output()).unwrap();
    assert!(out.status.success(), "informer failed: {seen:#?}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: BTreeMap<String, String> = serde_json::from_value(result["objects"].clone()).unwrap();
    let want: BTreeMap<String, String> = ec
        .get("/registry/pods/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .filter(|kv| String::from_utf8_lossy(kv.value()).contains(r#""app":"web""#))
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.mod_revision().to_string(),
            )
        })
        .collect();
    assert_eq!(got, want, "the informer's copy is etcd's state");
    assert!(seen.iter().any(|l| l.contains("too old")), "{seen:#?}");
    assert!(result["resumes"].as_u64().unwrap() >= 2, "{result}");
    assert_eq!(result["lists"], 2, "{result}");
    // Each client decodes the reasons from the statuses' details
    // (grpcio-status; protobufjs on grpc-js' raw trailer).
    for (event, reason) in [
        ("list unavailable", "NOT_READY"),
        ("resuming", "SHUTTING_DOWN"),
        ("too old", "TOO_OLD_RESOURCE_VERSION"),
    ] {
        assert!(
            seen.iter().any(|l| l.contains(event) && l.contains(reason)),
            "{event} with {reason}: {seen:#?}"
        );
    }
}
