//! Load generator: the same watch load against watchproxy, etcd's own gRPC
//! proxy and etcd directly, measured side by side in one run.
//!
//! For each target it starts a fresh etcd on loopback (and the proxy or
//! watchproxy in front of it), preloads Kubernetes-shaped objects, opens the
//! watchers over a number of connections, writes at a steady rate with a
//! send timestamp in every value, and reports deliveries, latency, missed
//! events, server CPU and memory. In `node` mode watcher i wants only
//! objects on node i mod M: watchproxy filters for it, etcd and grpc-proxy
//! clients receive everything and filter themselves. The `floor` target is
//! the least any proxy can do for the same load (see [`floor`]).

mod floor;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use etcd_client::{Client, WatchOptions};
use tonic::transport::Channel;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{EventType, HashRange, ShardSelector, WatchRequest};
use watchproxy_testkit::{free_port, Etcd, EtcdOptions, ProcFigures as Figures, Spawned};

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Target {
    Watchproxy,
    /// watchproxy serving every call on tonic's server
    /// (`--serve-path tonic`): the plain path its own HTTP/2 path is
    /// measured against.
    WatchproxyTonic,
    /// Another watchproxy build (`--baseline-bin`), e.g. an earlier commit.
    WatchproxyBaseline,
    /// watchproxy serving mutual TLS, with certificates made for the run.
    WatchproxyTls,
    /// Node mode over (server) TLS, each watcher calling as the user of its node (a
    /// bearer token) and asking for every pod: an authorization rule
    /// (`spec.nodeName={user}`) gives it its node's.
    WatchproxyTlsNodes,
    /// A core watchproxy in front of etcd and `--edges` watchproxies taking
    /// the resource from it (`upstream:`); the connections are spread over
    /// the edges, and the front's figures are all of them together.
    WatchproxyTiers,
    /// `--edges` watchproxies each in front of etcd, the connections spread
    /// over them: the replicas that tiers are measured against.
    WatchproxyReplicas,
    /// watchproxy serving etcd's own API (`etcd_api.enabled`), its
    /// watchers etcd clients as against etcd and grpc-proxy.
    WatchproxyEtcd,
    GrpcProxy,
    Etcd,
    /// One etcd watch and a plain write of each value to each connection
    /// that wants it: the CPU any proxy spends on this load, at least.
    Floor,
}

impl Target {
    fn is_watchproxy(self) -> bool {
        matches!(
            self,
            Target::Watchproxy
                | Target::WatchproxyTonic
                | Target::WatchproxyBaseline
                | Target::WatchproxyTls
                | Target::WatchproxyTlsNodes
                | Target::WatchproxyTiers
                | Target::WatchproxyReplicas
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// Every watcher wants every event.
    All,
    /// Watcher i wants the objects on node i mod --nodes.
    Node,
}

/// How the watchers of one node are spread over the connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Layout {
    /// On different connections, as separate clients on one node would
    /// be: a filtered event is a write to each of them.
    Spread,
    /// Watcher i on connection i mod --connections: when the connections
    /// divide the nodes, all the watchers of a node share one connection,
    /// as watches multiplexed by one client per node would, and a filtered
    /// event is one write.
    Shared,
}

#[derive(Parser, Debug)]
#[command(
    about = "Watch load against watchproxy, etcd grpc-proxy, etcd and the least any proxy spends (floor), side by side"
)]
struct Args {
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Approximate size of each object's value.
    #[arg(long, default_value_t = 1024)]
    object_bytes: usize,
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// gRPC connections the watchers are spread over (see --layout).
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Writes per second.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 20)]
    duration: u64,
    #[arg(long, value_enum, default_value = "all")]
    mode: Mode,
    /// Nodes the objects are spread over (object i is on node i mod
    /// --nodes). By default one per watcher, so every write is wanted by
    /// one watcher: as many useful deliveries as writes, however many
    /// watchers there are.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    nodes: Option<u64>,
    #[arg(long, value_enum, default_value = "spread")]
    layout: Layout,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "watchproxy,grpc-proxy,etcd,floor"
    )]
    targets: Vec<Target>,
    /// Seconds to wait after the writer stops for deliveries still under way.
    #[arg(long, default_value_t = 10)]
    drain: u64,
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    /// Defaults to the `watchproxy` binary next to this one.
    #[arg(long)]
    watchproxy_bin: Option<PathBuf>,
    /// The watchproxy of the `watchproxy-baseline` target.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runs every target this many times, round by round, so that a shared
    /// machine's drift reaches all of them alike, and prints each figure's
    /// median over the rounds (missed events and memory: the worst round;
    /// watches ended early: those of every round).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Extra watchers, on a connection of their own, that want every event
    /// and never read: the others' latency shows whether they cost anyone.
    /// The floor has no flow control and runs without them.
    #[arg(long, default_value_t = 0)]
    stalled: usize,
    /// Projections the watchproxy watchers ask for, `;`-separated, each a
    /// `,`-separated list of dotted paths (`-` for the whole value):
    /// watcher i takes the (i mod n)th. E.g. `metadata` or
    /// `metadata;metadata.annotations,spec.nodeName,status.phase;-`.
    #[arg(long)]
    projections: Option<String>,
    /// watchproxy targets in all mode only: the hash space of
    /// `metadata.name` cut into this many equal shards, watcher i asking
    /// for shard i mod n (so with as many shards as watchers, each event
    /// is wanted by one).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    shards: Option<u64>,
    /// Edges of the watchproxy-tiers target, replicas of the
    /// watchproxy-replicas one.
    #[arg(long, default_value_t = 3)]
    edges: usize,

    /// Serve as the floor target on this address (the run starts it).
    #[arg(long, hide = true)]
    floor_listen: Option<std::net::SocketAddr>,
    #[arg(long, hide = true, default_value = "")]
    floor_etcd: String,
    #[arg(long, hide = true, default_value_t = 0)]
    floor_start: i64,
}

impl Args {
    fn nodes(&self) -> usize {
        self.nodes.map_or(self.watchers, |n| n as usize).max(1)
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Report {
    target: String,
    writes: u64,
    write_seconds: f64,
    /// The write rate reached (an overloaded etcd slows the writer down).
    writes_per_s: f64,
    deliveries_per_s: f64,
    useful_per_s: f64,
    /// Bytes of a watch event, on average (watchproxy targets).
    bytes_per_delivery: f64,
    latency_ms_p50: f64,
    latency_ms_p99: f64,
    latency_ms_max: f64,
    missed: u64,
    /// Watches that ended before the run stopped them, by why.
    ended_early: std::collections::BTreeMap<String, u64>,
    server_cpu_s: f64,
    etcd_cpu_s: f64,
    front_cpu_s: f64,
    /// This process's own CPU over the writes: the clients' share of the
    /// cores the targets run on.
    loadgen_cpu_s: f64,
    etcd_peak_rss_mib: f64,
    front_peak_rss_mib: f64,
    /// With every watcher still open, after the drain: what the watchers
    /// hold, without the peak of opening them all at once.
    front_rss_end_mib: f64,
    /// The watches etcd held (`etcd_debugging_mvcc_watcher_total`), once
    /// every watcher was open.
    etcd_watches: f64,
}

const PREFIX: &str = "/bench/pods";

/// The config of the watchproxy targets: one resource of pods, indexed
/// by node, and room for every watcher.
fn watchproxy_yaml(etcd_url: &str, port: u16) -> String {
    format!(
        "etcd: {{endpoints: [\"{etcd_url}\"]}}\nlisten: 127.0.0.1:{port}\nwatch: {{watcher_queue: 1024}}\nlimits: {{max_watchers: 1000000, max_watchers_per_resource: 1000000}}\nresources:\n  - name: pods\n    prefix: {PREFIX}\n    selectable_fields: [spec.nodeName]\n    indexed_fields: [spec.nodeName]\n"
    )
}

/// Starts `bin` serving `config` (with `args`), once it listens on `port`.
async fn start_watchproxy(
    bin: &std::path::Path,
    config: &std::path::Path,
    args: &[&str],
    port: u16,
) -> anyhow::Result<Spawned> {
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut p = Spawned(child);
    wait_port(&mut p, "watchproxy", port).await?;
    Ok(p)
}

/// The CPU seconds of the processes in front so far, together.
fn fronts_cpu(fronts: &[Spawned]) -> f64 {
    fronts.iter().map(|p| p.figures().cpu_seconds()).sum()
}

/// Waits until `proc` listens on `port`.
async fn wait_port(proc: &mut Spawned, what: &str, port: u16) -> anyhow::Result<()> {
    for _ in 0..200 {
        proc.check_running(what)?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what}: nothing listens on {port}")
}

/// Opens a watch, trying again while watchproxy's cache is not ready
/// (UNAVAILABLE at once, as any client gets it).
async fn watch_when_ready(
    client: &mut WatchProxyClient<Channel>,
    req: tonic::Request<WatchRequest>,
) -> anyhow::Result<tonic::Streaming<watchproxy::pb::WatchEvent>> {
    let (metadata, extensions, message) = req.into_parts();
    for _ in 0..100 {
        let req = tonic::Request::from_parts(metadata.clone(), extensions.clone(), message.clone());
        match client.watch(req).await {
            Ok(stream) => return Ok(stream.into_inner()),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => return Err(s.into()),
        }
    }
    bail!("watchproxy did not become ready in 10 s")
}

/// The connection of watcher `i`, which wants node i mod `nodes`. For
/// [`Layout::Spread`], shifting by `i / nodes` moves the watchers of one
/// node to different connections.
fn connection_of(i: usize, nodes: usize, connections: usize, layout: Layout) -> usize {
    match layout {
        Layout::Spread => (i + i / nodes.max(1)) % connections,
        Layout::Shared => i % connections,
    }
}

fn object(i: usize, nodes: usize, bytes: usize, sent: u128) -> String {
    let pad = "x".repeat(bytes.saturating_sub(260));
    format!(
        r#"{{"kind":"Pod","metadata":{{"name":"pod-{i}","namespace":"bench","labels":{{"app":"bench"}},"annotations":{{"sent":"{sent}"}}}},"spec":{{"nodeName":"node-{}","containers":[{{"name":"c","image":"registry.example/app:1"}}]}},"status":{{"phase":"Running"}},"pad":"{pad}"}}"#,
        i % nodes
    )
}

/// Shard `k` of `n` equal ones of the hash space.
fn shard_range(k: u64, n: u64) -> HashRange {
    let start = |k: u64| ((u128::from(k) << 64) / u128::from(n)) as u64;
    HashRange {
        start: start(k),
        end: if k + 1 == n { 0 } else { start(k + 1) },
    }
}

/// Which of `n` equal shards object `i`'s name falls in.
fn shard_of(i: usize, n: u64) -> u64 {
    let h = watchproxy::object::shard_hash(&format!("pod-{i}"));
    ((u128::from(h) * u128::from(n)) >> 64) as u64
}

/// The paths watcher `i` keeps, from `--projections`.
fn projection_of(projections: Option<&str>, i: usize) -> Vec<String> {
    let Some(all) = projections else {
        return Vec::new();
    };
    let choices: Vec<&str> = all.split(';').collect();
    match choices[i % choices.len()] {
        "-" | "" => Vec::new(),
        paths => paths.split(',').map(String::from).collect(),
    }
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The send timestamp and node of a value written by [`object`].
fn parse(value: &[u8]) -> (u128, &[u8]) {
    let text = value;
    let find = |needle: &[u8]| {
        text.windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + needle.len())
    };
    let sent = find(br#""sent":""#)
        .map(|at| {
            text[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'))
        })
        .unwrap_or(0);
    let node = find(br#""nodeName":""#)
        .map(|at| {
            let end = text[at..].iter().position(|b| *b == b'"').unwrap_or(0);
            &text[at..at + end]
        })
        .unwrap_or(b"");
    (sent, node)
}

/// What one watcher saw.
#[derive(Default)]
struct Seen {
    received: u64,
    /// Bytes of the watch events received (watchproxy targets).
    bytes: u64,
    useful: u64,
    /// The watch ended with this error before the run stopped it.
    ended: Option<String>,
    /// Latencies of useful events, in microseconds.
    latencies: Vec<u32>,
}

impl Seen {
    /// Counts a delivery; true if the watcher wanted it.
    fn record(&mut self, value: &[u8], wanted_node: Option<&[u8]>) -> bool {
        self.received += 1;
        let (sent, node) = parse(value);
        if wanted_node.is_some_and(|w| w != node) || sent == 0 {
            return false;
        }
        self.useful += 1;
        let micros = now_nanos().saturating_sub(sent) / 1000;
        self.latencies.push(micros.min(u32::MAX as u128) as u32);
        true
    }
}

async fn run_target(args: &Args, target: Target) -> anyhow::Result<Report> {
    let identities = target == Target::WatchproxyTlsNodes;
    if identities && args.mode != Mode::Node {
        bail!("watchproxy-tls-nodes needs --mode node");
    }
    if args.shards.is_some() && !(target.is_watchproxy() && args.mode == Mode::All) {
        bail!("--shards is for watchproxy targets in --mode all");
    }
    // The nodes call with tokens: a client certificate would name them
    // instead.
    let tls = matches!(target, Target::WatchproxyTls | Target::WatchproxyTlsNodes)
        .then(|| RunTls::new(target == Target::WatchproxyTls))
        .transpose()?;
    let nodes = args.nodes();
    let etcd = Etcd::start_with(EtcdOptions::for_load(args.etcd_bin.clone())).await?;
    let etcd_url = etcd.client_url.clone();
    let etcd_figures = Figures(etcd.pid().context("etcd is running")?);
    let mut ec = Client::connect([&etcd_url], None).await?;
    for chunk in (0..args.objects).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<_> = chunk
            .iter()
            .map(|&i| {
                etcd_client::TxnOp::put(
                    format!("{PREFIX}/bench/pod-{i}"),
                    object(i, nodes, args.object_bytes, 0),
                    None,
                )
            })
            .collect();
        ec.txn(etcd_client::Txn::new().and_then(ops)).await?;
    }
    let start_rev = ec
        .get(PREFIX, None)
        .await?
        .header()
        .map_or(0, |h| h.revision());

    // The server the watchers talk to.
    let (fronts, endpoints): (Vec<Spawned>, Vec<String>) = match target {
        Target::Etcd => (vec![], vec![etcd_url.clone()]),
        Target::GrpcProxy => {
            let port = free_port();
            let child = Command::new(&args.etcd_bin)
                .args([
                    "grpc-proxy",
                    "start",
                    "--endpoints",
                    etcd_url.trim_start_matches("http://"),
                ])
                .arg(format!("--listen-addr=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting etcd grpc-proxy")?;
            let mut p = Spawned(child);
            wait_port(&mut p, "etcd grpc-proxy", port).await?;
            (vec![p], vec![format!("http://127.0.0.1:{port}")])
        }
        Target::Floor => {
            let port = free_port();
            let child = Command::new(std::env::current_exe()?)
                .arg(format!("--floor-listen=127.0.0.1:{port}"))
                .arg(format!("--floor-etcd={etcd_url}"))
                .arg(format!("--floor-start={}", start_rev + 1))
                .arg(format!("--connections={}", args.connections.max(1)))
                .stdout(Stdio::null())
                .spawn()
                .context("starting the floor")?;
            let mut p = Spawned(child);
            wait_port(&mut p, "floor", port).await?;
            (vec![p], vec![format!("127.0.0.1:{port}")])
        }
        Target::Watchproxy
        | Target::WatchproxyTonic
        | Target::WatchproxyBaseline
        | Target::WatchproxyTls
        | Target::WatchproxyTlsNodes
        | Target::WatchproxyEtcd => {
            let port = free_port();
            let config = etcd.dir().join("watchproxy.yaml");
            let mut yaml = watchproxy_yaml(&etcd_url, port);
            if target == Target::WatchproxyEtcd {
                yaml += "etcd_api: {enabled: true}\n";
            }
            if let Some(tls) = &tls {
                yaml += &tls.config(etcd.dir())?;
            }
            if identities {
                yaml += &node_identities(etcd.dir(), nodes)?;
            }
            std::fs::write(&config, yaml)?;
            let bin = match (target, &args.watchproxy_bin) {
                (Target::WatchproxyBaseline, _) => args
                    .baseline_bin
                    .clone()
                    .context("the watchproxy-baseline target needs --baseline-bin")?,
                (_, Some(b)) => b.clone(),
                (_, None) => std::env::current_exe()?.with_file_name("watchproxy"),
            };
            let path: &[&str] = match target {
                Target::WatchproxyTonic => &["--serve-path", "tonic"],
                _ => &[],
            };
            let p = start_watchproxy(&bin, &config, path, port).await?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            (vec![p], vec![format!("{scheme}://127.0.0.1:{port}")])
        }
        Target::WatchproxyTiers | Target::WatchproxyReplicas => {
            let tiered = target == Target::WatchproxyTiers;
            let bin = match &args.watchproxy_bin {
                Some(b) => b.clone(),
                None => std::env::current_exe()?.with_file_name("watchproxy"),
            };
            let core_port = free_port();
            let mut fronts = Vec::new();
            let mut endpoints = Vec::new();
            // Tier 0 is the core, when there is one.
            for tier in usize::from(!tiered)..=args.edges {
                let port = if tier == 0 { core_port } else { free_port() };
                let upstream = match tier {
                    0 => String::new(),
                    _ if !tiered => String::new(),
                    _ => format!("upstream: http://127.0.0.1:{core_port}\n"),
                };
                let config = etcd.dir().join(format!("watchproxy-tier-{tier}.yaml"));
                std::fs::write(&config, upstream + &watchproxy_yaml(&etcd_url, port))?;
                fronts.push(start_watchproxy(&bin, &config, &[], port).await?);
                if tier > 0 {
                    endpoints.push(format!("http://127.0.0.1:{port}"));
                }
            }
            (fronts, endpoints)
        }
    };
    let endpoint = endpoints[0].clone();

    // Watchers, spread over connections; each reports once it is open.
    let stop = tokio_util::sync::CancellationToken::new();
    let opened = Arc::new(AtomicU64::new(0));
    // Useful deliveries so far, over all watchers.
    let useful = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut wp_channels = Vec::new();
    let mut etcd_clients = Vec::new();
    if target.is_watchproxy() {
        // All at once, as clients reconnecting after a restart would: the
        // time and the front's CPU of their handshakes are reported.
        let cpu = fronts_cpu(&fronts);
        let started = Instant::now();
        let mut connecting = tokio::task::JoinSet::new();
        for c in 0..args.connections.max(1) {
            let mut channel = Channel::from_shared(endpoints[c % endpoints.len()].clone())?;
            if let Some(tls) = &tls {
                channel = channel.tls_config(tls.client())?;
            }
            connecting.spawn(async move { channel.connect().await });
        }
        while let Some(connected) = connecting.join_next().await {
            wp_channels.push(connected??);
        }
        let front_cpu = Some((fronts_cpu(&fronts), cpu));
        eprintln!(
            "{target:?}: {} connections at once in {:.2} s, the front's CPU {:.2} s",
            wp_channels.len(),
            started.elapsed().as_secs_f64(),
            front_cpu.map_or(0.0, |(after, before)| after - before)
        );
    }
    for _ in 0..args.connections.max(1) {
        match target {
            t if t.is_watchproxy() => {}
            Target::Floor => {}
            _ => etcd_clients.push(Client::connect([&endpoint], None).await?),
        }
    }
    // Held unread until the end.
    let mut stalled_wp = Vec::new();
    let mut stalled_etcd = Vec::new();
    if args.stalled > 0 && target != Target::Floor {
        match target {
            t if t.is_watchproxy() => {
                let channel = Channel::from_shared(endpoint.clone())?.connect().await?;
                for _ in 0..args.stalled {
                    let req = WatchRequest {
                        resource: "pods".into(),
                        resource_version: start_rev.to_string(),
                        ..Default::default()
                    };
                    let mut client = WatchProxyClient::new(channel.clone());
                    stalled_wp.push(watch_when_ready(&mut client, tonic::Request::new(req)).await?);
                }
            }
            _ => {
                let mut client = Client::connect([&endpoint], None).await?;
                for _ in 0..args.stalled {
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(start_rev + 1);
                    stalled_etcd.push(client.watch(format!("{PREFIX}/"), Some(options)).await?);
                }
            }
        }
    }
    if target == Target::Floor {
        let connections = args.connections.max(1);
        for c in 0..connections {
            let wants: Vec<u32> = (0..args.watchers)
                .filter(|&i| connection_of(i, nodes, connections, args.layout) == c)
                .map(|i| match args.mode {
                    Mode::All => floor::EVERY,
                    Mode::Node => (i % nodes) as u32,
                })
                .collect();
            let (endpoint, stop, opened, counted) = (
                endpoint.clone(),
                stop.clone(),
                opened.clone(),
                useful.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut seen = Seen::default();
                let tcp = floor::connect(&endpoint, &wants).await?;
                let mut tcp = tokio::io::BufReader::new(tcp);
                opened.fetch_add(wants.len() as u64, Ordering::Relaxed);
                let mut value = Vec::new();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        more = floor::next_value(&mut tcp, &mut value) => {
                            if !more? {
                                seen.ended = Some("end of stream".into());
                                break;
                            }
                            if seen.record(&value, None) {
                                counted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                anyhow::Ok(seen)
            }));
        }
    }
    for i in (0..args.watchers).filter(|_| target != Target::Floor) {
        let node = format!("node-{}", i % nodes);
        let wanted = (args.mode == Mode::Node).then(|| node.clone().into_bytes());
        let (stop, opened, counted) = (stop.clone(), opened.clone(), useful.clone());
        match target {
            t if t.is_watchproxy() => {
                let mut client = WatchProxyClient::new(
                    wp_channels[connection_of(i, nodes, wp_channels.len(), args.layout)].clone(),
                );
                let req = WatchRequest {
                    resource: "pods".into(),
                    field_selector: if wanted.is_some() && !identities {
                        format!("spec.nodeName={node}")
                    } else {
                        String::new()
                    },
                    resource_version: start_rev.to_string(),
                    fields: projection_of(args.projections.as_deref(), i),
                    shard: args.shards.map(|n| ShardSelector {
                        field: "metadata.name".into(),
                        ranges: vec![shard_range(i as u64 % n, n)],
                    }),
                    ..Default::default()
                };
                let mut req = tonic::Request::new(req);
                if identities {
                    let token = format!("Bearer token-{node}").parse()?;
                    req.metadata_mut().insert("authorization", token);
                }
                tasks.push(tokio::spawn(async move {
                    let mut seen = Seen::default();
                    let mut stream = watch_when_ready(&mut client, req).await?;
                    opened.fetch_add(1, Ordering::Relaxed);
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            m = stream.message() => match m.map_err(|s| s.code()) {
                                Err(code) => {
                                    seen.ended = Some(format!("{code:?}"));
                                    break;
                                }
                                Ok(Some(e)) if e.r#type != EventType::Bookmark as i32 => {
                                    seen.bytes += prost::Message::encoded_len(&e) as u64;
                                    let value = e.object.map(|o| o.value).unwrap_or_default();
                                    if seen.record(&value, None) {
                                        counted.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                                Ok(Some(_)) => {}
                                Ok(None) => {
                                    seen.ended = Some("end of stream".into());
                                    break;
                                }
                            },
                        }
                    }
                    anyhow::Ok(seen)
                }));
            }
            _ => {
                let mut client =
                    etcd_clients[connection_of(i, nodes, etcd_clients.len(), args.layout)].clone();
                tasks.push(tokio::spawn(async move {
                    let mut seen = Seen::default();
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(start_rev + 1);
                    let mut stream = client.watch(format!("{PREFIX}/"), Some(options)).await?;
                    opened.fetch_add(1, Ordering::Relaxed);
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            m = stream.message() => match m? {
                                Some(r) if r.canceled() => {
                                    seen.ended = Some(format!("canceled: {}", r.cancel_reason()));
                                    break;
                                }
                                Some(r) => {
                                    for e in r.events() {
                                        if let Some(kv) = e.kv() {
                                            if seen.record(kv.value(), wanted.as_deref()) {
                                                counted.fetch_add(1, Ordering::Relaxed);
                                            }
                                        }
                                    }
                                }
                                None => break,
                            },
                        }
                    }
                    anyhow::Ok(seen)
                }));
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while opened.load(Ordering::Relaxed) < args.watchers as u64 {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} watchers opened",
                opened.load(Ordering::Relaxed),
                args.watchers
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Steady writes, each to a random object, carrying its send time.
    let front_figures: Vec<Figures> = fronts.iter().map(Spawned::figures).collect();
    let cpu = |p: &[Figures]| p.iter().map(|f| f.cpu_seconds()).sum::<f64>();
    let etcd_watches = etcd.metric("etcd_debugging_mvcc_watcher_total");
    let (etcd_cpu0, front_cpu0) = (etcd_figures.cpu_seconds(), cpu(&front_figures));
    let loadgen_cpu0 = Figures::own().cpu_seconds();
    let total = args.rate * args.duration;
    let mut per_node: HashMap<usize, u64> = HashMap::new();
    let mut per_shard: HashMap<u64, u64> = HashMap::new();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / args.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..total {
        tick.tick().await;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % args.objects as u64) as usize;
        *per_node.entry(i % nodes).or_default() += 1;
        if let Some(n) = args.shards {
            *per_shard.entry(shard_of(i, n)).or_default() += 1;
        }
        let key = format!("{PREFIX}/bench/pod-{i}");
        ec.put(key, object(i, nodes, args.object_bytes, now_nanos()), None)
            .await?;
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let expected = |w: usize| match (args.mode, args.shards) {
        (Mode::All, Some(n)) => per_shard.get(&(w as u64 % n)).copied().unwrap_or(0),
        (Mode::All, None) => total,
        (Mode::Node, _) => per_node.get(&(w % nodes)).copied().unwrap_or(0),
    };
    let want_total: u64 = (0..args.watchers).map(expected).sum();

    // Let deliveries under way arrive (all of them, or until the drain
    // bound), then stop the watchers.
    let drain_until = Instant::now() + Duration::from_secs(args.drain);
    while useful.load(Ordering::Relaxed) < want_total && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (etcd_cpu, front_cpu) = (
        etcd_figures.cpu_seconds() - etcd_cpu0,
        cpu(&front_figures) - front_cpu0,
    );
    let loadgen_cpu = Figures::own().cpu_seconds() - loadgen_cpu0;
    let front_rss_end_mib = front_figures.iter().map(|f| f.rss_mib()).sum();
    stop.cancel();
    drop((stalled_wp, stalled_etcd));
    let mut all = Seen::default();
    let mut ended = std::collections::BTreeMap::new();
    for t in tasks {
        let seen = t
            .await
            .map_err(anyhow::Error::from)
            .and_then(|seen| seen)
            .unwrap_or_else(|e| Seen {
                ended: Some(e.to_string()),
                ..Seen::default()
            });
        all.received += seen.received;
        all.bytes += seen.bytes;
        all.useful += seen.useful;
        all.latencies.extend(seen.latencies);
        if let Some(why) = seen.ended {
            *ended.entry(why).or_insert(0) += 1;
        }
    }
    all.latencies.sort_unstable();
    let pct = |q: f64| -> f64 {
        if all.latencies.is_empty() {
            return 0.0;
        }
        let idx = ((all.latencies.len() as f64 - 1.0) * q).round() as usize;
        f64::from(all.latencies[idx]) / 1000.0
    };
    Ok(Report {
        target: format!("{target:?}"),
        writes: total,
        write_seconds,
        writes_per_s: total as f64 / write_seconds,
        deliveries_per_s: all.received as f64 / write_seconds,
        useful_per_s: all.useful as f64 / write_seconds,
        bytes_per_delivery: all.bytes as f64 / all.received.max(1) as f64,
        latency_ms_p50: pct(0.50),
        latency_ms_p99: pct(0.99),
        latency_ms_max: pct(1.0),
        missed: want_total.saturating_sub(all.useful),
        ended_early: ended,
        server_cpu_s: etcd_cpu + front_cpu,
        etcd_cpu_s: etcd_cpu,
        front_cpu_s: front_cpu,
        loadgen_cpu_s: loadgen_cpu,
        etcd_peak_rss_mib: etcd_figures.peak_rss_mib(),
        front_peak_rss_mib: front_figures.iter().map(|f| f.peak_rss_mib()).sum(),
        front_rss_end_mib,
        etcd_watches,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(listen) = args.floor_listen {
        return floor::serve(
            listen,
            &args.floor_etcd,
            PREFIX,
            args.floor_start,
            args.connections,
        )
        .await;
    }
    let mut rounds: Vec<Vec<Report>> = Vec::new();
    for round in 1..=args.rounds {
        let mut reports = Vec::new();
        for &target in &args.targets {
            eprintln!(
                "{target:?}{}: {} watchers over {} connections (+{} stalled), {} writes/s for {} s, mode {:?} ...",
                if args.rounds > 1 { format!(" (round {round} of {})", args.rounds) } else { String::new() },
                args.watchers, args.connections, args.stalled, args.rate, args.duration, args.mode
            );
            let report = run_target(&args, target)
                .await
                .with_context(|| format!("{target:?}"))?;
            if args.rounds > 1 {
                eprintln!("{}", row(&report));
            }
            reports.push(report);
        }
        rounds.push(reports);
    }
    let reports: Vec<Report> = (0..args.targets.len())
        .map(|t| median(&rounds.iter().map(|r| r[t].clone()).collect::<Vec<_>>()))
        .collect();
    let mut out = String::new();
    writeln!(
        out,
        "{} objects of ~{} B, {} watchers over {} connections (+{} stalled, never reading), {} writes/s for {} s, mode {:?}{}{}",
        args.objects,
        args.object_bytes,
        args.watchers,
        args.connections,
        args.stalled,
        args.rate,
        args.duration,
        args.mode,
        match args.mode {
            Mode::Node => format!(" ({} nodes, {:?} layout)", args.nodes(), args.layout),
            Mode::All => match args.shards {
                Some(n) => format!(" ({n} shards of metadata.name)"),
                None => String::new(),
            },
        },
        if args.rounds > 1 {
            format!("; medians of {} rounds", args.rounds)
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "{:<19} {:>8} {:>12} {:>11} {:>8} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10} {:>13}",
        "target",
        "writes/s",
        "deliveries/s",
        "useful/s",
        "B/event",
        "p50 ms",
        "p99 ms",
        "max ms",
        "missed",
        "server cpu",
        "etcd cpu",
        "front cpu",
        "etcd peak MiB",
        "peak MiB",
        "MiB at end"
    )?;
    for r in &reports {
        writeln!(out, "{}", row(r))?;
    }
    for r in reports.iter().filter(|r| !r.ended_early.is_empty()) {
        writeln!(
            out,
            "{}: watches ended early: {:?}",
            r.target, r.ended_early
        )?;
    }
    for r in reports.iter().filter(|r| r.front_cpu_s > 0.0) {
        writeln!(
            out,
            "{}: the process in front used {:.1}% of one core over the writes, {:.2} µs per delivery; etcd held {} watches; the load generator used {:.2} CPU-s",
            r.target,
            100.0 * r.front_cpu_s / r.write_seconds.max(1e-9),
            1e6 * r.front_cpu_s / (r.deliveries_per_s * r.write_seconds).max(1.0),
            r.etcd_watches,
            r.loadgen_cpu_s,
        )?;
    }
    if let Some(wp) = reports.iter().find(|r| r.target == "Watchproxy") {
        for other in reports.iter().filter(|r| r.target != "Watchproxy") {
            let front = if other.front_cpu_s > 0.0 {
                format!(", front CPU {:.2} : 1", wp.front_cpu_s / other.front_cpu_s)
            } else {
                String::new()
            };
            writeln!(
                out,
                "watchproxy : {:<10} server CPU {:.2} : 1{front}, useful deliveries per server CPU-second {:.0} vs {:.0}",
                other.target,
                wp.server_cpu_s / other.server_cpu_s.max(1e-9),
                wp.useful_per_s * wp.write_seconds / wp.server_cpu_s.max(1e-9),
                other.useful_per_s * other.write_seconds / other.server_cpu_s.max(1e-9),
            )?;
        }
    }
    print!("{out}");
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(
                &serde_json::json!({"args": format!("{args:?}"), "results": reports, "rounds": rounds}),
            )?,
        )?;
    }
    Ok(())
}

/// One target's line of the table.
fn row(r: &Report) -> String {
    format!("{:<19} {:>8.0} {:>12.0} {:>11.0} {:>8.0} {:>9.2} {:>9.2} {:>9.1} {:>8} {:>10.2} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>13.0}", r.target, r.writes_per_s, r.deliveries_per_s, r.useful_per_s, r.bytes_per_delivery, r.latency_ms_p50, r.latency_ms_p99, r.latency_ms_max, r.missed, r.server_cpu_s, r.etcd_cpu_s, r.front_cpu_s, r.etcd_peak_rss_mib, r.front_peak_rss_mib, r.front_rss_end_mib)
}

/// One target's rounds as one report: the median of each rate, latency
/// and CPU figure, each taken on its own (so the CPU parts need not add up
/// to the median total); the worst round's missed events and memory; every
/// round's early ends.
fn median(rounds: &[Report]) -> Report {
    let mid = |f: fn(&Report) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let worst = |f: fn(&Report) -> f64| rounds.iter().map(f).fold(0.0, f64::max);
    let mut ended_early = std::collections::BTreeMap::new();
    for r in rounds {
        for (why, n) in &r.ended_early {
            *ended_early.entry(why.clone()).or_insert(0) += n;
        }
    }
    Report {
        target: rounds[0].target.clone(),
        writes: rounds[0].writes,
        write_seconds: mid(|r| r.write_seconds),
        writes_per_s: mid(|r| r.writes_per_s),
        deliveries_per_s: mid(|r| r.deliveries_per_s),
        useful_per_s: mid(|r| r.useful_per_s),
        bytes_per_delivery: mid(|r| r.bytes_per_delivery),
        latency_ms_p50: mid(|r| r.latency_ms_p50),
        latency_ms_p99: mid(|r| r.latency_ms_p99),
        latency_ms_max: mid(|r| r.latency_ms_max),
        missed: rounds.iter().map(|r| r.missed).max().unwrap_or(0),
        ended_early,
        server_cpu_s: mid(|r| r.server_cpu_s),
        etcd_cpu_s: mid(|r| r.etcd_cpu_s),
        front_cpu_s: mid(|r| r.front_cpu_s),
        loadgen_cpu_s: mid(|r| r.loadgen_cpu_s),
        etcd_peak_rss_mib: worst(|r| r.etcd_peak_rss_mib),
        front_peak_rss_mib: worst(|r| r.front_peak_rss_mib),
        front_rss_end_mib: worst(|r| r.front_rss_end_mib),
        etcd_watches: worst(|r| r.etcd_watches),
    }
}

/// A CA, a server certificate and, for mutual TLS, a client certificate
/// made for one run.
struct RunTls {
    mutual: bool,
    ca: String,
    cert: String,
    key: String,
    client_cert: String,
    client_key: String,
}

impl RunTls {
    fn new(mutual: bool) -> anyhow::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
        let client_key = KeyPair::generate()?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "watchproxy-bench");
        let client_cert = client.signed_by(&client_key, &ca)?;
        Ok(Self {
            mutual,
            ca: ca.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        })
    }

    /// The `tls` section of watchproxy's configuration, its files in `dir`.
    fn config(&self, dir: &std::path::Path) -> anyhow::Result<String> {
        let (cert, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        std::fs::write(&cert, &self.cert)?;
        std::fs::write(&key, &self.key)?;
        std::fs::write(&ca, &self.ca)?;
        let client_ca = match self.mutual {
            true => format!(", client_ca_file: {}", ca.display()),
            false => String::new(),
        };
        Ok(format!(
            "tls: {{cert_file: {}, key_file: {}{client_ca}}}\n",
            cert.display(),
            key.display(),
        ))
    }

    fn client(&self) -> tonic::transport::ClientTlsConfig {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .domain_name("localhost");
        match self.mutual {
            true => tls.identity(tonic::transport::Identity::from_pem(
                &self.client_cert,
                &self.client_key,
            )),
            false => tls,
        }
    }
}

/// A token per node (`token-node-K` names user `node-K`), and the rule that
/// lets each node watch its own pods.
fn node_identities(dir: &std::path::Path, nodes: usize) -> anyhow::Result<String> {
    let tokens = dir.join("tokens.yaml");
    let mut text = String::new();
    for k in 0..nodes {
        writeln!(text, "- {{token: token-node-{k}, user: node-{k}}}")?;
    }
    std::fs::write(&tokens, text)?;
    Ok(format!(
        "auth: {{tokens_file: {}, allow_plaintext_tokens: true}}\nauthorization:\n  rules:\n    - {{subjects: [\"*\"], resources: [pods], namespaces: [\"*\"], verbs: [watch], field_selector: \"spec.nodeName={{user}}\"}}\n",
        tokens.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::{connection_of, median, Layout, Report};
    use std::collections::{HashMap, HashSet};

    #[test]
    fn spread_watchers_of_a_node_use_many_connections_evenly_and_shared_ones_one() {
        for (watchers, connections) in [(1000, 50), (5000, 100), (10_000, 100)] {
            let nodes = 100;
            let mut of_node: HashMap<usize, HashSet<usize>> = HashMap::new();
            let mut load = vec![0usize; connections];
            let mut shared: HashMap<usize, HashSet<usize>> = HashMap::new();
            for i in 0..watchers {
                let c = connection_of(i, nodes, connections, Layout::Spread);
                of_node.entry(i % nodes).or_default().insert(c);
                load[c] += 1;
                let c = connection_of(i, nodes, connections, Layout::Shared);
                shared.entry(i % nodes).or_default().insert(c);
            }
            assert!(
                shared.values().all(|c| c.len() == 1),
                "one each when shared"
            );
            let per_node = (watchers / nodes).min(connections);
            for (node, conns) in &of_node {
                assert_eq!(conns.len(), per_node, "node {node} of {watchers}");
            }
            let even = watchers / connections;
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(
                *min + 2 >= even && *max <= even + 2,
                "{min}..{max} around {even}"
            );
        }
    }

    #[test]
    fn rounds_give_each_figure_its_median_and_the_worst_of_what_must_not_happen() {
        let round = |cpu: f64, p99: f64, missed: u64, rss: f64, ended: Option<&str>| Report {
            target: "Watchproxy".into(),
            writes: 4000,
            front_cpu_s: cpu,
            latency_ms_p99: p99,
            missed,
            front_peak_rss_mib: rss,
            ended_early: ended.map(|why| (why.to_string(), 1)).into_iter().collect(),
            ..Report::default()
        };
        let odd = median(&[
            round(1.5, 2.0, 0, 30.0, None),
            round(1.1, 9.0, 3, 28.0, Some("Cancelled")),
            round(1.3, 3.0, 0, 41.0, Some("Cancelled")),
        ]);
        assert_eq!((odd.front_cpu_s, odd.latency_ms_p99), (1.3, 3.0));
        assert_eq!((odd.missed, odd.front_peak_rss_mib), (3, 41.0));
        assert_eq!(odd.ended_early.get("Cancelled"), Some(&2));
        assert_eq!((odd.target.as_str(), odd.writes), ("Watchproxy", 4000));
        let even = median(&[round(1.0, 2.0, 0, 1.0, None), round(2.0, 4.0, 0, 1.0, None)]);
        assert_eq!((even.front_cpu_s, even.latency_ms_p99), (1.5, 3.0));
        let one = median(&[round(1.7, 2.5, 1, 9.0, None)]);
        assert_eq!(
            (one.front_cpu_s, one.missed, one.front_peak_rss_mib),
            (1.7, 1, 9.0)
        );
    }
}
