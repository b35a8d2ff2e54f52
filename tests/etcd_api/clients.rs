//! etcd's own clients (`etcdctl`, Python's aetcd) read and watch through
//! watchproxy as from etcd.

use std::time::Duration;

use crate::common::*;
use watchproxy::config::ServePath;

use super::shared::*;

/// `etcdctl` (etcd's own command line client) against `endpoint`, its
/// JSON output of `args`.
fn etcdctl(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let etcdctl = watchproxy_testkit::require(
        "etcdctl",
        "install it with `sudo apt-get install -y etcd-client` (Debian/Ubuntu), or run ./scripts/test.sh, which installs it",
    );
    let out = std::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "-w", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The responses `etcdctl watch args` prints until it has shown `events`
/// events, without their headers (watchproxy names no cluster or member).
async fn etcdctl_watch(endpoint: &str, args: &[&str], events: usize) -> Vec<serde_json::Value> {
    use tokio::io::AsyncBufReadExt;
    let etcdctl = watchproxy_testkit::require(
        "etcdctl",
        "install it with `sudo apt-get install -y etcd-client`",
    );
    let mut child = tokio::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "-w", "json", "watch"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut out, mut seen) = (Vec::new(), 0);
    while seen < events {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("etcdctl prints within 10 s")
            .unwrap()
            .expect("etcdctl still runs");
        let Ok(mut response) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        response.as_object_mut().unwrap().remove("Header");
        seen += response["Events"].as_array().map_or(0, Vec::len);
        out.push(response);
    }
    child.kill().await.unwrap();
    out
}

/// `etcdctl get` and `etcdctl watch` print the same through watchproxy as
/// from etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_reads_and_watches_through_watchproxy_as_from_etcd() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    let head = write_history(&mut e).await;
    let (proxy, _w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let (direct, through) = (
        etcd.client_url.trim_start_matches("http://").to_owned(),
        proxy.addr.to_string(),
    );
    let past = (before + 2).to_string();
    for args in [
        &["get", "--prefix", "/registry/pods/"][..],
        &["get", "--prefix", "/registry/pods/ns-1/", "--limit", "1"],
        &["get", "--prefix", "/registry/pods/", "--rev", &past],
        &[
            "get",
            "--prefix",
            "/registry/pods/",
            "--keys-only",
            "--sort-by",
            "MODIFY",
            "--order",
            "DESCEND",
        ],
        &["get", "--prefix", "/registry/minions/"],
        &["get", "/registry/pods/ns-3/leased", "--consistency", "s"],
    ] {
        let (mut want, mut got) = (etcdctl(&direct, args), etcdctl(&through, args));
        assert_eq!(got["header"]["revision"], head, "{args:?}");
        for v in [&mut want, &mut got] {
            v.as_object_mut().unwrap().remove("header");
        }
        assert_eq!(got, want, "{args:?}");
    }
    let rev = (before + 1).to_string();
    let args = ["--prefix", "/registry/pods/", "--rev", &rev, "--prev-kv"];
    let want = etcdctl_watch(&direct, &args, 8).await;
    let got = etcdctl_watch(&through, &args, 8).await;
    let events = |responses: &[serde_json::Value]| -> Vec<serde_json::Value> {
        responses
            .iter()
            .flat_map(|r| r["Events"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert_eq!(events(&got), events(&want));
    assert_eq!(events(&got).len(), 8);
}

/// Python's aetcd (etcd's asyncio client) reads and watches through
/// watchproxy as from etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pythons_aetcd_reads_and_watches_through_watchproxy_as_from_etcd() {
    let etcd = Etcd::start().await;
    let mut e = etcd.client().await;
    let before = put_pod(&mut e, "ns-0", "first", &[], "node-0").await as i64;
    write_history(&mut e).await;
    let (proxy, _w) = proxy(&etcd.client_url, ServePath::Fast).await;
    let run = |host: String, port: String| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/etcd_client.py");
        let start = (before + 1).to_string();
        let mut python = python3();
        let ok = python3()
            .args(["-c", "import aetcd"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 with aetcd is required: run ./scripts/install-deps.sh, which installs it into the project's .venv");
        let out = python
            .args([script, &host, &port, "/registry/pods/", &start, "8"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = etcd
        .client_url
        .trim_start_matches("http://")
        .rsplit_once(':')
        .unwrap();
    let want = run(direct.0.to_owned(), direct.1.to_owned());
    let got = run("127.0.0.1".into(), proxy.addr.port().to_string());
    assert_eq!(got.lines().count(), 10, "{got}");
    for (got, want) in got.lines().zip(want.lines()) {
        assert_eq!(got, want);
    }
}
