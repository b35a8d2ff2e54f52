//! The command line as a user pipes it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_reader_goes_away_ends_quietly() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    for i in 0..3 {
        put_pod(&mut c, "ns", &format!("p{i}"), &[], "n").await;
    }
    let proxy = Proxy::start(&etcd.client_url).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    // `watchproxy watch pods | head -1`
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(["watch", "pods", "--server"])
        .arg(format!("http://{}", proxy.addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("EVENT_TYPE_ADDED "), "{first}");
    // The reader is gone; the next event has nowhere to go.
    put_pod(&mut c, "ns", "later", &[], "n").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the watch went on without a reader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
