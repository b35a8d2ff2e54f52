//! The watch guarantees under faults: watchproxy-check's informers follow
//! watchproxy while it writes, a fault strikes in the middle of the writes
//! and ends with them, and every stream is then proven against etcd's own
//! history (order, no gap, nothing twice, nothing not asked for, bookmarks,
//! initial state, resyncs, final state), with the time every informer took
//! to catch up after the fault.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use watchproxy::config::Config;
use watchproxy_check::writer::Writes;
use watchproxy_check::{Check, Options, Report};
use watchproxy_testkit::{free_port, EtcdCluster};

const WATCHERS: usize = 12;

fn options(etcd: &Etcd, watchproxy: String, seed: u64) -> Options {
    replicas(etcd, vec![watchproxy], seed)
}

fn replicas(etcd: &Etcd, watchproxy: Vec<String>, seed: u64) -> Options {
    options_on(etcd.client_url.clone(), watchproxy, seed)
}

/// The campaign's check on etcd `members` (separated by commas).
fn options_on(members: String, watchproxy: Vec<String>, seed: u64) -> Options {
    Options {
        etcd: members,
        watchproxy,
        resource: "pods".into(),
        prefix: "/registry/pods".into(),
        watchers: WATCHERS,
        rate: 40,
        duration: campaign_writes(),
        settle: Duration::from_secs(20),
        seed,
        misbehave: false,
        identities: Vec::new(),
        writes: Writes::Mixed,
        readers: 0,
        api: Default::default(),
    }
}

/// A row of the campaign's table.
fn show(name: &str, r: &Report) {
    let recovery = r
        .caught_up_in
        .map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64()));
    eprintln!(
        "| {name} | {} | {} | {} | {} | {} | {recovery} |",
        r.checked, r.lost, r.duplicates, r.cross, r.resyncs
    );
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
    show(name, &report);
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
    through(
        "etcd killed (kill -9) and restarted",
        options,
        etcd.restart(),
        async {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_cut_off_resyncs() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let proxy = Proxy::start(&forwarder.url).await;
    let mut ec = etcd.client().await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 5);
    let heal = async {
        compact_all(&mut ec).await;
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
        let yaml = pods_yaml(&etcd.client_url, 256) + &format!("listen: 127.0.0.1:{port}\n");
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
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect_lazy();
    wait_ready(
        &mut watchproxy::pb::watch_proxy_client::WatchProxyClient::new(channel),
        "pods",
    )
    .await;
    let report = through(
        "watchproxy killed (kill -9) and restarted",
        options(&etcd, url, 6),
        async { process.kill_and_restart() },
        async {},
    )
    .await;
    drop(process);
    assert_eq!(
        report.relists, WATCHERS as u64,
        "every client resumed (no OUT_OF_RANGE, no second list): {report}"
    );
    assert!(report.resumes >= WATCHERS, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_move_between_two_replicas_mid_stream() {
    let etcd = Etcd::start().await;
    let config = || Config::from_yaml(&pods_yaml(&etcd.client_url, 256)).unwrap();
    let mut a = Proxy::start(&etcd.client_url).await;
    let mut b = Proxy::start(&etcd.client_url).await;
    let (a_addr, b_addr) = (a.addr, b.addr);
    let urls = vec![format!("http://{a_addr}"), format!("http://{b_addr}")];
    // A rolling restart under the writes: each replica's clients move to
    // the other one with the versions they had.
    let rolling = async {
        a.stop().await;
        a = Proxy::start_on(config(), listener_at(a_addr).await).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.stop().await;
        b = Proxy::start_on(config(), listener_at(b_addr).await).await;
    };
    let report = through(
        "two replicas, each restarted under the writes",
        replicas(&etcd, urls, 7),
        rolling,
        async {},
    )
    .await;
    drop((a, b));
    assert!(report.resumes >= WATCHERS, "the clients moved: {report}");
    assert_eq!(
        report.relists, WATCHERS as u64,
        "none listed again: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_to_etcd_longer_than_keepalive() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let proxy = Proxy::start(&forwarder.url).await;
    let options = Options {
        // Past keepalive's 10 s interval and 5 s timeout.
        duration: campaign_writes().max(Duration::from_secs(20)),
        settle: Duration::from_secs(30),
        ..options(&etcd, format!("http://{}", proxy.addr), 8)
    };
    through(
        "blackhole to etcd (bytes held, nothing closed) until the writes end, past keepalive",
        options,
        async { forwarder.blackhole() },
        async { forwarder.restore() },
    )
    .await;
}

/// The check on a 3-member etcd cluster: watchproxy and the checker know
/// every member.
async fn on_cluster<F>(name: &str, seed: u64, fault: F)
where
    F: AsyncFnOnce(&mut EtcdCluster),
{
    let mut cluster = EtcdCluster::start(3).await;
    let urls = cluster.client_urls();
    let yaml = pods_yaml(&urls.join("\", \""), 256);
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let options = options_on(urls.join(","), vec![format!("http://{}", proxy.addr)], seed);
    through(name, options, fault(&mut cluster), async {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_in_a_three_member_cluster() {
    on_cluster("3-member etcd: leader moved", 9, async |cluster| {
        cluster.move_leader().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loss_of_the_leader_of_a_three_member_cluster() {
    on_cluster(
        "3-member etcd: leader killed (kill -9), restarted 2 s later",
        10,
        async |cluster| {
            let leader = cluster.leader().await.expect("a leader");
            cluster.kill(leader);
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.restart(leader).await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_stalling_and_vanishing_clients_under_a_compaction_storm() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start_with(&etcd.client_url, 64).await;
    let mut ec = etcd.client().await;
    let options = Options {
        watchers: 24,
        rate: 80,
        settle: Duration::from_secs(60),
        misbehave: true,
        ..options(&etcd, format!("http://{}", proxy.addr), 11)
    };
    // etcd compacts to its head every 300 ms while the clients lag: they
    // catch up from watchproxy's window, never from etcd.
    let storm = async {
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            compact_all(&mut ec).await;
        }
    };
    let report = through(
        "slow, stalling and vanishing clients, etcd compacting every 300 ms",
        options,
        storm,
        async {},
    )
    .await;
    assert!(
        report.resumes > 0,
        "the vanishing clients resumed: {report}"
    );
}

/// 10,000 watches, each on its own node's pods, resume after watchproxy
/// restarts, each after a random delay of up to 2 s (jitter, as informers
/// back off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_reconnect_after_a_restart() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use watchproxy::pb;

    const CLIENTS: usize = 10_000;
    const CONNECTIONS: usize = 100;
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..200 {
        put_pod(
            &mut ec,
            "ns",
            &format!("p{i}"),
            &[],
            &format!("node-{}", i % 100),
        )
        .await;
    }
    let config = || Config::from_yaml(&pods_yaml(&etcd.client_url, 64)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut proxy = Proxy::start_on(config(), listener).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let version = list_version(&mut client, "pods", "").await;

    let channels: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy()
        })
        .collect();
    let (opened, resumed, too_old) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let mut c = watchproxy::pb::watch_proxy_client::WatchProxyClient::new(
            channels[i % CONNECTIONS].clone(),
        );
        let (opened, resumed, too_old, stop) = (
            opened.clone(),
            resumed.clone(),
            too_old.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut last = version;
            let mut restarts = 0;
            while !stop.is_cancelled() {
                let req = pb::WatchRequest {
                    resource: "pods".into(),
                    field_selector: format!("spec.nodeName=node-{}", i % 100),
                    resource_version: last.to_string(),
                    allow_bookmarks: true,
                    ..Default::default()
                };
                let mut stream = match c.watch(req).await {
                    Ok(s) => {
                        match restarts {
                            0 => opened.fetch_add(1, Ordering::Relaxed),
                            _ => resumed.fetch_add(1, Ordering::Relaxed),
                        };
                        s.into_inner()
                    }
                    Err(s) if s.code() == tonic::Code::OutOfRange => {
                        too_old.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                loop {
                    let m = tokio::select! {
                        _ = stop.cancelled() => return,
                        m = stream.message() => m,
                    };
                    match m {
                        Ok(Some(e)) => {
                            if let Some(o) = e.object {
                                last = o.resource_version.parse().unwrap_or(last);
                            }
                        }
                        Ok(None) => break,
                        Err(s) if s.code() == tonic::Code::OutOfRange => {
                            too_old.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        Err(_) => break,
                    }
                }
                restarts += 1;
                // Jitter: reconnects spread over 2 s.
                let delay = rand_delay(i);
                tokio::time::sleep(delay).await;
            }
        }));
    }
    within(60, "every watch is open", || {
        opened.load(Ordering::Relaxed) == CLIENTS as u64
    })
    .await;

    proxy.stop().await;
    let started = std::time::Instant::now();
    let proxy = Proxy::start_on(config(), listener_at(addr).await).await;
    let mut ec2 = etcd.client().await;
    put_pod(&mut ec2, "ns", "after", &[], "node-1").await;
    within(60, "every watch resumed", || {
        resumed.load(Ordering::Relaxed) == CLIENTS as u64 || too_old.load(Ordering::Relaxed) > 0
    })
    .await;
    let took = started.elapsed();
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let requests = etcd_requests(&proxy);
    let watches = etcd.metric("etcd_debugging_mvcc_watcher_total");
    eprintln!(
        "| watchproxy restarted under {CLIENTS} watches: all resumed in {:.2} s, 0 OUT_OF_RANGE, {requests} etcd requests, {watches} etcd watchers |",
        took.as_secs_f64()
    );
    assert_eq!(
        too_old.load(Ordering::Relaxed),
        0,
        "no watch got OUT_OF_RANGE"
    );
    assert!(requests < 100.0, "etcd requests bounded: {requests}");
    assert_eq!(
        watches, 3.0,
        "one etcd watch per resource (pods, nodes, blobs)"
    );
}

/// Waits until `done`, failing after `seconds`.
async fn within(seconds: u64, what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {seconds} s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A delay of up to 2 s, spread over the clients.
fn rand_delay(i: usize) -> Duration {
    Duration::from_millis((i as u64 * 7919) % 2000)
}

/// Every etcd request the instance made since it started.
fn etcd_requests(proxy: &Proxy) -> f64 {
    let text = http_get(&proxy.metrics_addr.to_string(), "/metrics");
    text.lines()
        .filter(|l| l.starts_with("watchproxy_etcd_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_identities_see_only_their_own_pods() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    let identities: Vec<(String, String)> = (0..4)
        .map(|n| (format!("token-{n}"), format!("node-{n}")))
        .collect();
    let entries: String = identities
        .iter()
        .map(|(token, node)| format!("- {{token: {token}, user: {node}}}\n"))
        .collect();
    std::fs::write(&tokens, entries).unwrap();
    let yaml = pods_yaml(&etcd.client_url, 64)
        + &format!(
            r#"
auth:
  tokens_file: {}
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["user:node-0", "user:node-1", "user:node-2", "user:node-3"]
      resources: ["pods"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
      field_selector: "spec.nodeName={{user}}"
"#,
            tokens.display()
        );
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let options = Options {
        identities,
        ..options(&etcd, format!("http://{}", proxy.addr), 12)
    };
    through(
        "4 node identities, a rule narrowing each to its node's pods",
        options,
        async {},
        async {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_on_the_watch_stream_only() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    // Reads go to etcd straight, the watches through the forwarder.
    let proxy = Proxy::start_config(watches_through(&etcd, &forwarder)).await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 13);
    through(
        "300 ms of latency on the watch stream only (reads straight to etcd)",
        options,
        async { forwarder.delay(Duration::from_millis(300)) },
        async { forwarder.restore() },
    )
    .await;
}

/// The pods configuration with its watches through `forwarder`, its
/// reads straight to `etcd`.
fn watches_through(etcd: &Etcd, forwarder: &Forwarder) -> Config {
    let yaml = pods_yaml(&etcd.client_url, 256).replace(
        "  request_timeout: 2s",
        &format!(
            "  request_timeout: 2s\n  watch_endpoints: [\"{}\"]",
            forwarder.url
        ),
    );
    Config::from_yaml(&yaml).unwrap()
}

/// The freshness race end to end: keys created and deleted at once while
/// the watch stream lags 300 ms behind the reads, and readers making
/// consistent Lists without pause. A List must never show such a key at a
/// version where etcd no longer has it, and no bookmark may run ahead of
/// its two events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_come_and_go_while_the_watch_lags_behind_the_reads() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.delay(Duration::from_millis(300));
    let proxy = Proxy::start_config(watches_through(&etcd, &forwarder)).await;
    let options = Options {
        rate: 5,
        writes: Writes::Transients,
        readers: 4,
        ..options(&etcd, format!("http://{}", proxy.addr), 14)
    };
    let report = through(
        "keys created and deleted at once, the watch 300 ms behind the reads, 4 readers listing",
        options,
        async {},
        async {},
    )
    .await;
    assert!(report.lists > 20, "the readers listed: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_move_between_replicas_as_their_connections_age() {
    let etcd = Etcd::start().await;
    let config = || {
        Config::from_yaml(
            &pods_yaml(&etcd.client_url, 256)
                .replace("limits:\n", "limits:\n  max_connection_age: 2s\n"),
        )
        .unwrap()
    };
    let a = Proxy::start_config(config()).await;
    let b = Proxy::start_config(config()).await;
    let urls = vec![format!("http://{}", a.addr), format!("http://{}", b.addr)];
    let report = through(
        "two replicas, connections ending at 2 s of age",
        replicas(&etcd, urls, 15),
        async {},
        async {},
    )
    .await;
    drop((a, b));
    assert!(report.resumes >= WATCHERS, "the clients moved: {report}");
    assert_eq!(
        report.relists, WATCHERS as u64,
        "none listed again: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_tiers_with_a_core_and_an_edge_restarted() {
    let etcd = Etcd::start().await;
    let mut core = Proxy::start(&etcd.client_url).await;
    let core_addr = core.addr;
    let edge_config = || {
        let yaml = format!(
            "upstream: http://{core_addr}\n{}",
            pods_yaml(&etcd.client_url, 256)
        );
        Config::from_yaml(&yaml).unwrap()
    };
    let mut a = Proxy::start_config(edge_config()).await;
    let b = Proxy::start_config(edge_config()).await;
    let a_addr = a.addr;
    for edge in [&a, &b] {
        wait_ready(&mut edge.client().await, "pods").await;
    }
    let urls = vec![format!("http://{a_addr}"), format!("http://{}", b.addr)];
    // The core goes and comes back under the writes, then an edge does:
    // the edges follow the core, and the restarted edge's clients move to
    // the other one.
    let faults = async {
        core.stop().await;
        let config = Config::from_yaml(&pods_yaml(&etcd.client_url, 256)).unwrap();
        core = Proxy::start_on(config, listener_at(core_addr).await).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        a.stop().await;
        a = Proxy::start_on(edge_config(), listener_at(a_addr).await).await;
    };
    let report = through(
        "etcd <- core <- 2 edges, the core then an edge restarted",
        replicas(&etcd, urls, 17),
        faults,
        async {},
    )
    .await;
    drop((a, b, core));
    assert!(report.checked > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_cut_off_after_a_restart_through_tiers() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let core_config = || Config::from_yaml(&pods_yaml(&forwarder.url, 256)).unwrap();
    let mut core = Proxy::start_config(core_config()).await;
    let core_addr = core.addr;
    let edge_yaml = format!(
        "upstream: http://{core_addr}\n{}",
        pods_yaml(&etcd.client_url, 256)
    );
    let edge = Proxy::start_config(Config::from_yaml(&edge_yaml).unwrap()).await;
    wait_ready(&mut edge.client().await, "pods").await;
    let urls = vec![
        format!("http://{core_addr}"),
        format!("http://{}", edge.addr),
    ];
    // The core restarts under the writes (its window refilled from etcd's
    // history), then loses etcd while etcd compacts: the core's clients and
    // the edge's go through a resync, each object at its own version.
    let fault = async {
        core.stop().await;
        core = Proxy::start_on(core_config(), listener_at(core_addr).await).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        forwarder.cut();
    };
    let mut ec = etcd.client().await;
    let heal = async {
        compact_all(&mut ec).await;
        forwarder.restore();
    };
    let report = through(
        "a restart, then compaction while cut off, through a core and an edge",
        replicas(&etcd, urls, 18),
        fault,
        heal,
    )
    .await;
    drop((edge, core));
    assert!(
        report.resyncs > 0,
        "the open watches went through a resync: {report}"
    );
}
