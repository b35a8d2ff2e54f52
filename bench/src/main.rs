//! Load generator: the same watch load against watchproxy, etcd's own gRPC
//! proxy and etcd directly, measured side by side in one run.
//!
//! For each target it starts a fresh etcd on loopback (and the proxy or
//! watchproxy in front of it: [`fronts`]), preloads Kubernetes-shaped
//! objects, opens the watchers over a number of connections
//! ([`watchers`]), writes at a steady rate with a send timestamp in every
//! value ([`load`]), and reports deliveries, latency, missed events, server
//! CPU and memory ([`report`]). In `node` mode watcher i wants only objects
//! on node i mod M: watchproxy filters for it, etcd and grpc-proxy clients
//! receive everything and filter themselves. The `floor` target is the
//! least any proxy can do for the same load (see [`floor`]).

mod args;
mod floor;
mod fronts;
mod kubernetes;
mod load;
mod report;
mod watchers;

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use etcd_client::Client;
use watchproxy_testkit::{Etcd, EtcdOptions, ProcFigures as Figures, Spawned};

use args::{Args, Mode, Target};
use fronts::RunTls;
use report::{median, row, Report};

pub const PREFIX: &str = "/bench/pods";

/// One target measured: its etcd and front started, the objects written,
/// the watchers opened, the steady writes, the drain, the figures.
async fn run_target(args: &Args, target: Target) -> anyhow::Result<Report> {
    if target == Target::WatchproxyTlsNodes && args.mode != Mode::Node {
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
    let etcd = Etcd::start_with(EtcdOptions::for_load(args.etcd_bin.clone())).await?;
    let etcd_figures = Figures(etcd.pid().context("etcd is running")?);
    let mut ec = Client::connect([&etcd.client_url], None).await?;
    let start_rev = load::seed(&mut ec, args).await?;
    let (fronts, endpoints) = fronts::start(args, target, &etcd, start_rev, tls.as_ref()).await?;
    let watchers =
        watchers::open(args, target, &fronts, &endpoints, tls.as_ref(), start_rev).await?;

    let front_figures: Vec<Figures> = fronts.iter().map(Spawned::figures).collect();
    let cpu = |p: &[Figures]| p.iter().map(|f| f.cpu_seconds()).sum::<f64>();
    let etcd_watches = etcd.metric("etcd_debugging_mvcc_watcher_total");
    let (etcd_cpu0, front_cpu0) = (etcd_figures.cpu_seconds(), cpu(&front_figures));
    let loadgen_cpu0 = Figures::own().cpu_seconds();
    let lockstep = args.lockstep.then(|| load::Lockstep {
        useful: &watchers.useful,
        callgrind: args
            .callgrind_after
            .and_then(|_| front_figures.first().map(|f| f.0)),
    });
    let written = load::write(&mut ec, args, lockstep).await?;
    let (total, write_seconds) = (written.total, written.seconds);
    let want_total: u64 = (0..args.watchers).map(|w| written.expected(args, w)).sum();

    // Let deliveries under way arrive (all of them, or until the drain
    // bound), then stop the watchers.
    let drain_until = Instant::now() + Duration::from_secs(args.drain);
    while watchers.useful.load(Ordering::Relaxed) < want_total && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (etcd_cpu, front_cpu) = (
        etcd_figures.cpu_seconds() - etcd_cpu0,
        cpu(&front_figures) - front_cpu0,
    );
    let loadgen_cpu = Figures::own().cpu_seconds() - loadgen_cpu0;
    let front_rss_end_mib = front_figures.iter().map(|f| f.rss_mib()).sum();
    let (mut all, ended) = watchers.finish().await;
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

#[cfg(test)]
mod tests {
    use crate::args::Layout;
    use crate::report::{median, Report};
    use crate::watchers::connection_of;
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
