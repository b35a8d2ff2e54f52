//! The watch guarantees under faults: watchproxy-check's informers follow
//! watchproxy while it writes, a fault strikes in the middle of the writes
//! and ends with them, and every stream is then proven against etcd's own
//! history (order, no gap, nothing twice, nothing not asked for, bookmarks,
//! initial state, resyncs, final state), with the time every informer took
//! to catch up after the fault.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use watchproxy_check::{Check, Options, Report};
use watchproxy_testkit::free_port;

const WATCHERS: usize = 12;

fn options(etcd: &Etcd, watchproxy: String, seed: u64) -> Options {
    Options {
        etcd: etcd.client_url.clone(),
        watchproxy,
        resource: "pods".into(),
        prefix: "/registry/pods".into(),
        watchers: WATCHERS,
        rate: 40,
        duration: Duration::from_secs(5),
        settle: Duration::from_secs(20),
        seed,
    }
}

/// Starts the check, lets it run, calls `fault` in the middle of the
/// writes and `heal` when they end, then proves the streams.
async fn through<F, H>(name: &str, options: Options, fault: F, heal: H) -> Report
where
    F: std::future::Future<Output = ()>,
    H: std::future::Future<Output = ()>,
{
    let mut check = Check::start(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fault.await;
    check.writes_done().await.unwrap();
    heal.await;
    let report = check.finish().await.unwrap();
    eprintln!(
        "| {name} | {} | {} | {} | {} | {} | {} |",
        report.checked,
        report.lost,
        report.duplicates,
        report.cross,
        report.resyncs,
        report
            .caught_up_in
            .map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    );
    assert!(report.passed(), "{name}:\n{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fault() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let r = through(
        "none",
        options(&etcd, format!("http://{}", proxy.addr), 1),
        async {},
        async {},
    )
    .await;
    assert!(r.checked > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_etcd_reset_and_refused() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let proxy = Proxy::start(&forwarder.url).await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 2);
    through(
        "connections to etcd reset, refused until the writes end",
        options,
        async { forwarder.cut() },
        async { forwarder.restore() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_and_continued() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let pid = etcd.pid().unwrap().to_string();
    let signal = |sig: &'static str| {
        let pid = pid.clone();
        async move {
            let ok = Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill {sig}");
        }
    };
    let options = options(&etcd, format!("http://{}", proxy.addr), 3);
    // Stopped for two of the writes' seconds: the writes wait with it.
    let stop_for_two = async {
        signal("-STOP").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal("-CONT").await;
    };
    through("etcd stopped (SIGSTOP) 2 s", options, stop_for_two, async {
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_and_restarted() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 4);
    let mut check = Check::start(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    etcd.restart().await;
    check.writes_done().await.unwrap();
    let report = check.finish().await.unwrap();
    eprintln!(
        "| etcd killed (kill -9) and restarted | {} | {} | {} | {} | {} | {:?} |",
        report.checked,
        report.lost,
        report.duplicates,
        report.cross,
        report.resyncs,
        report.caught_up_in
    );
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_cut_off_resyncs() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let proxy = Proxy::start(&forwarder.url).await;
    let mut ec = etcd.client().await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 5);
    let heal = async {
        let head = ec
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        ec.compact(head, None).await.unwrap();
        forwarder.restore();
    };
    let report = through(
        "compaction while cut off from etcd",
        options,
        async { forwarder.cut() },
        heal,
    )
    .await;
    assert!(
        report.resyncs > 0,
        "the open watches went through a resync: {report}"
    );
}

/// watchproxy as its own process, killed with SIGKILL and started again on
/// the same port.
struct Process {
    child: Child,
    config: tempfile::NamedTempFile,
}

impl Process {
    fn start(etcd: &Etcd, port: u16) -> Process {
        let config = tempfile::NamedTempFile::new().unwrap();
        let yaml = PODS_CONFIG
            .replace("ETCD", &etcd.client_url)
            .replace("QUEUE", "256")
            + &format!("listen: 127.0.0.1:{port}\n");
        std::fs::write(config.path(), yaml).unwrap();
        Self::spawn(config)
    }

    fn spawn(config: tempfile::NamedTempFile) -> Process {
        let child = Self::spawn_child(config.path());
        Process { child, config }
    }

    fn spawn_child(config: &std::path::Path) -> Child {
        Command::new(env!("CARGO_BIN_EXE_watchproxy"))
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn kill_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn_child(self.config.path());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchproxy_killed_and_restarted_every_client_resumes() {
    let etcd = Etcd::start().await;
    let port = free_port();
    let mut process = Process::start(&etcd, port);
    let url = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..100 {
        if let Ok(mut c) =
            watchproxy::pb::watch_proxy_client::WatchProxyClient::connect(url.clone()).await
        {
            let list = watchproxy::pb::ListRequest {
                resource: "pods".into(),
                ..Default::default()
            };
            if c.list(list).await.is_ok() {
                ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "watchproxy did not start");
    let mut check = Check::start(options(&etcd, url, 6)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    process.kill_and_restart();
    check.writes_done().await.unwrap();
    let report = check.finish().await.unwrap();
    drop(process);
    eprintln!(
        "| watchproxy killed (kill -9) and restarted | {} | {} | {} | {} | {} | {:?} |",
        report.checked,
        report.lost,
        report.duplicates,
        report.cross,
        report.resyncs,
        report.caught_up_in
    );
    assert!(report.passed(), "{report}");
    assert_eq!(
        report.relists, WATCHERS as u64,
        "every client resumed (no OUT_OF_RANGE, no second list): {report}"
    );
    assert!(report.resumes >= WATCHERS, "{report}");
}
