//! A join storm: many watches start at once with `send_initial_events` on
//! a resource of Kubernetes-shaped demo pods (a rollout, a replica
//! restart). For watchproxy with its initial states shared and with them
//! switched off, round by round: the time until every joiner has its whole
//! initial state, watchproxy's CPU per initial event, and its peak memory.
//!
//! The joiners read only each message's type and end marker, so the
//! client side, which shares the cores, costs as little as it can.
//!
//! `cargo run --release -p watchproxy-bench --bin join-storm -- --joiners 1000 --pods 10000`

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use watchproxy::pb::WatchRequest;
use watchproxy_testkit::{
    free_port, http_get, metric_value, Etcd, EtcdOptions, ProcFigures, Spawned,
};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    #[arg(long, default_value_t = 1000)]
    joiners: usize,
    /// Connections the joiners are spread over.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Joiners ask for `metadata_only`.
    #[arg(long)]
    metadata_only: bool,
    /// Joiners ask for `batch_initial_events`.
    #[arg(long)]
    batch: bool,
    /// The joiners accept this compression (zstd or gzip); a third
    /// variant then runs on tonic's path, which compresses per stream.
    #[arg(long)]
    compression: Option<String>,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    /// Defaults to the `watchproxy` binary next to this one.
    #[arg(long)]
    watchproxy_bin: Option<PathBuf>,
}

/// What the joiners read of each message.
#[derive(Clone, PartialEq, prost::Message)]
struct Head {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(bool, tag = "3")]
    initial_events_end: bool,
    /// A batch's objects, their fields skipped.
    #[prost(message, repeated, tag = "5")]
    objects: Vec<Skipped>,
}

/// A message whose fields are all skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct Skipped {}

/// One way of serving the storm.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Shared,
    Unshared,
    /// Shared, on tonic's path: compressed per stream.
    Tonic,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Shared => "on",
            Variant::Unshared => "off",
            Variant::Tonic => "on, tonic",
        }
    }
}

struct Storm {
    seconds: f64,
    raw: f64,
    compressed: f64,
    cpu: f64,
    initial_events: u64,
    rss_before: f64,
    peak: f64,
    made: f64,
    shared: f64,
}

/// Reads one joiner's initial state; how many events it held.
async fn join(
    channel: Channel,
    (metadata_only, batch): (bool, bool),
    accept: Option<CompressionEncoding>,
) -> anyhow::Result<u64> {
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Some(encoding) = accept {
        grpc = grpc.accept_compressed(encoding);
    }
    grpc.ready().await?;
    let request = WatchRequest {
        resource: "pods".into(),
        send_initial_events: true,
        metadata_only,
        batch_initial_events: batch,
        ..Default::default()
    };
    let codec = tonic_prost::ProstCodec::<WatchRequest, Head>::default();
    let path = http::uri::PathAndQuery::from_static("/watchproxy.v1.WatchProxy/Watch");
    let mut stream = grpc
        .server_streaming(tonic::Request::new(request), path, codec)
        .await?
        .into_inner();
    let mut events = 0;
    while let Some(head) = stream.message().await? {
        if head.initial_events_end {
            return Ok(events);
        }
        events += head.objects.len().max(1) as u64;
    }
    bail!("the watch ended before its initial events did")
}

async fn storm(
    args: &Args,
    etcd: &Etcd,
    variant: Variant,
    accept: Option<CompressionEncoding>,
) -> anyhow::Result<Storm> {
    let share = variant != Variant::Unshared;
    let (port, metrics_port) = (free_port(), free_port());
    let config = etcd.dir().join(format!("watchproxy-{share}.yaml"));
    std::fs::write(
        &config,
        format!(
            "etcd: {{endpoints: [\"{}\"]}}\nlisten: 127.0.0.1:{port}\nmetrics_listen: 127.0.0.1:{metrics_port}\nwatch: {{share_initial_state: {share}}}\nlimits: {{max_watchers: 1000000, max_watchers_per_resource: 1000000, max_concurrent_streams: 100000, keepalive_timeout: 120s}}\nresources:\n  - name: pods\n    prefix: /registry/pods\n    selectable_fields: [spec.nodeName]\n    indexed_fields: [spec.nodeName]\n",
            etcd.client_url
        ),
    )?;
    let bin = match &args.watchproxy_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("watchproxy"),
    };
    let mut command = Command::new(&bin);
    command.args(["serve", "--config"]).arg(&config);
    if variant == Variant::Tonic {
        command.args(["--serve-path", "tonic"]);
    }
    let log = etcd
        .dir()
        .join(format!("watchproxy-{}.log", variant.name()));
    let proc = Spawned::logged(&mut command, "JOIN_STORM_LOG", &log)?;
    let pid = proc.0.id();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut channels = Vec::new();
    while channels.len() < args.connections.max(1) {
        match tonic::transport::Endpoint::from_shared(url.clone())?
            .connect()
            .await
        {
            Ok(c) => channels.push(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(e).context("connecting to watchproxy"),
        }
    }
    // Ready: a joiner gets the whole state.
    loop {
        match join(channels[0].clone(), (args.metadata_only, args.batch), None).await {
            Ok(n) if n as usize >= args.pods => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            other => bail!("watchproxy did not get ready: {other:?}"),
        }
    }
    let metric = |name: &str| {
        let text = http_get(&format!("127.0.0.1:{metrics_port}"), "/metrics");
        metric_value(&text, name, "resource=\"pods\"")
    };
    let (made0, shared0) = (
        metric("watchproxy_initial_snapshots_total"),
        metric("watchproxy_initial_snapshots_shared_total"),
    );
    let (raw0, compressed0) = (
        metric("watchproxy_initial_snapshot_bytes_total"),
        metric("watchproxy_initial_snapshot_compressed_bytes_total"),
    );
    let figures = ProcFigures(pid);
    let (cpu0, rss_before) = (figures.cpu_seconds(), figures.rss_mib());
    let started = Instant::now();
    let joiners: Vec<_> = (0..args.joiners)
        .map(|i| {
            let channel = channels[i % channels.len()].clone();
            tokio::spawn(join(channel, (args.metadata_only, args.batch), accept))
        })
        .collect();
    let mut initial_events = 0;
    for j in joiners {
        initial_events += j.await?.with_context(|| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = (text.lines().rev())
                .filter(|l| !l.contains("DEBUG") || l.contains("rror"))
                .take(20)
                .collect();
            format!(
                "a joiner failed; watchproxy's log ends:\n{}",
                tail.join("\n")
            )
        })?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Storm {
        seconds,
        cpu: figures.cpu_seconds() - cpu0,
        initial_events,
        rss_before,
        peak: figures.peak_rss_mib(),
        raw: metric("watchproxy_initial_snapshot_bytes_total") - raw0,
        compressed: metric("watchproxy_initial_snapshot_compressed_bytes_total") - compressed0,
        made: metric("watchproxy_initial_snapshots_total") - made0,
        shared: metric("watchproxy_initial_snapshots_shared_total") - shared0,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let etcd = Etcd::start_with(EtcdOptions::for_load(args.etcd_bin.clone())).await?;
    let bin = match &args.watchproxy_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("watchproxy"),
    };
    let loaded = Command::new(&bin)
        .args(["demo-load", "--etcd-endpoints", &etcd.client_url])
        .args(["--count", &args.pods.to_string()])
        .stdout(Stdio::null())
        .status()?;
    if !loaded.success() {
        bail!("demo-load failed: {loaded}");
    }
    let accept = match args.compression.as_deref() {
        None => None,
        Some("zstd") => Some(CompressionEncoding::Zstd),
        Some("gzip") => Some(CompressionEncoding::Gzip),
        Some(other) => bail!("--compression {other}: zstd or gzip"),
    };
    let mut variants = vec![Variant::Shared, Variant::Unshared];
    if accept.is_some() {
        variants.push(Variant::Tonic);
    }
    println!(
        "{} joiners over {} connections, send_initial_events on {} demo pods{}{}{}; watchproxy's CPU and memory",
        args.joiners,
        args.connections,
        args.pods,
        if args.metadata_only { ", metadata_only" } else { "" },
        if args.batch { ", batched" } else { "" },
        (args.compression.as_deref())
            .map(|c| format!(", accepting {c}"))
            .unwrap_or_default(),
    );
    println!(
        "{:<10} {:>6} {:>9} {:>9} {:>12} {:>11} {:>10} {:>8} {:>8} {:>9} {:>11}",
        "sharing",
        "round",
        "wall s",
        "CPU s",
        "µs/initial",
        "MiB before",
        "peak MiB",
        "made",
        "shared",
        "raw MiB",
        "compr. MiB"
    );
    for round in 1..=args.rounds {
        for &variant in &variants {
            let s = storm(&args, &etcd, variant, accept).await?;
            println!(
                "{:<10} {:>6} {:>9.2} {:>9.2} {:>12.3} {:>11.1} {:>10.1} {:>8} {:>8} {:>9.2} {:>11.2}",
                variant.name(),
                round,
                s.seconds,
                s.cpu,
                s.cpu * 1e6 / s.initial_events.max(1) as f64,
                s.rss_before,
                s.peak,
                s.made,
                s.shared,
                s.raw / f64::from(1 << 20),
                s.compressed / f64::from(1 << 20),
            );
        }
    }
    Ok(())
}
