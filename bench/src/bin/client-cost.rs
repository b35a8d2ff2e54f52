//! What watchproxy's client informers cost their users: the Rust
//! informer's CPU per event while etcd takes a steady write rate, and the
//! Python informer's time to catch up with a list of every object (its
//! first, and the one after its version expired).
//!
//! `cargo run --release -p watchproxy-bench --bin client-cost`
//!
//! The writer and this program share the machine with the informer, etcd
//! and watchproxy; each one's CPU is reported.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tokio_stream::StreamExt;
use watchproxy_client::pb::{ListRequest, WatchRequest};
use watchproxy_client::{Client, Event, Informer};
use watchproxy_testkit::{free_port, Etcd, ProcFigures, Spawned};

const PREFIX: &str = "/registry/pods";

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Writes per second while the Rust informer is measured.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Defaults to the `watchproxy` binary next to this one.
    #[arg(long)]
    watchproxy_bin: Option<PathBuf>,
    /// Skip the Python informer.
    #[arg(long)]
    no_python: bool,
    /// Runs as the measured Rust informer against this endpoint.
    #[arg(long, hide = true)]
    informer: Option<String>,
    /// With --informer: a bare watch that only counts its events instead,
    /// the floor an informer adds its store, index and events to.
    #[arg(long, hide = true)]
    bare: bool,
}

fn pod(i: usize, generation: usize) -> String {
    let pad = "x".repeat(700);
    format!(
        r#"{{"kind":"Pod","metadata":{{"name":"pod-{i}","namespace":"ns-{}","labels":{{"app":"web","gen":"{generation}"}}}},"spec":{{"nodeName":"node-{}"}},"status":{{"phase":"Running"}},"pad":"{pad}"}}"#,
        i % 10,
        i % 100
    )
}

fn key(i: usize) -> String {
    format!("{PREFIX}/ns-{}/pod-{i}", i % 10)
}

async fn write(
    etcd: &mut etcd_client::Client,
    from: usize,
    n: usize,
    generation: usize,
) -> anyhow::Result<()> {
    let mut pending = tokio::task::JoinSet::new();
    for i in from..from + n {
        let mut c = etcd.clone();
        pending.spawn(async move { c.put(key(i), pod(i, generation), None).await });
        if pending.len() >= 32 {
            pending.join_next().await.unwrap()??;
        }
    }
    while let Some(done) = pending.join_next().await {
        done??;
    }
    Ok(())
}

/// The measured informer: prints its CPU when synced, and again, with the
/// changes it took, when its stdin closes.
async fn informer(endpoint: String, bare: bool) -> anyhow::Result<()> {
    let client = Client::builder(endpoint).connect().await?;
    if bare {
        return bare_watch(client).await;
    }
    let mut informer = Informer::new(client, "pods").index("node", |pod| {
        pod.field("spec.nodeName").into_iter().collect()
    });
    let mut events = informer.events(4096);
    let running = informer.start();
    running.wait_until_synced().await?;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), events.next()).await {}
    let changes = events.map(|e| !matches!(e, Event::Relisted { .. }));
    count_until_stdin_closes(changes, running.store().len(), || {
        format!("{:?}", running.stats())
    })
    .await?;
    running.stop().await?;
    Ok(())
}

/// The floor: one watch from the current version, its events counted.
async fn bare_watch(client: Client) -> anyhow::Result<()> {
    let list = client
        .list(ListRequest {
            resource: "pods".into(),
            limit: 1,
            ..Default::default()
        })
        .await?;
    let watch = client
        .watch(WatchRequest {
            resource: "pods".into(),
            resource_version: list.resource_version,
            ..Default::default()
        })
        .await?;
    let changes = watch.map_while(|e| e.ok()).map(|_| true);
    count_until_stdin_closes(changes, 0, || "bare watch".into()).await
}

/// Prints the CPU used so far, then counts the `true`s of `changes` until
/// stdin closes, and prints the CPU used since with the count.
async fn count_until_stdin_closes(
    mut changes: impl tokio_stream::Stream<Item = bool> + Unpin,
    objects: usize,
    stats: impl Fn() -> String,
) -> anyhow::Result<()> {
    let me = ProcFigures::own();
    let synced_cpu = me.cpu_seconds();
    println!(
        "{}",
        serde_json::json!({"synced_cpu": synced_cpu, "objects": objects})
    );
    let (done_tx, mut done) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_line(&mut String::new());
        let _ = done_tx.send(());
    });
    let mut counted = 0u64;
    loop {
        tokio::select! {
            _ = &mut done => break,
            change = changes.next() => match change {
                Some(true) => counted += 1,
                Some(false) => {}
                None => break,
            },
        }
    }
    let cpu = me.cpu_seconds() - synced_cpu;
    println!(
        "{}",
        serde_json::json!({"cpu": cpu, "changes": counted, "stats": stats()})
    );
    Ok(())
}

fn read_json(lines: &mut impl BufRead) -> anyhow::Result<serde_json::Value> {
    let mut line = String::new();
    lines.read_line(&mut line)?;
    serde_json::from_str(&line).with_context(|| format!("reading {line:?}"))
}

fn start_watchproxy(bin: &PathBuf, config: &PathBuf, port: u16) -> anyhow::Result<Spawned> {
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "watchproxy did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Spawned(child))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(endpoint) = args.informer {
        return informer(endpoint, args.bare).await;
    }
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    write(&mut ec, 0, args.objects, 0).await?;
    let port = free_port();
    let config = etcd.dir().join("watchproxy.yaml");
    std::fs::write(
        &config,
        format!(
            "etcd: {{endpoints: [\"{}\"]}}\nlisten: 127.0.0.1:{port}\nmetrics_listen: 127.0.0.1:{}\nresources:\n  - name: pods\n    prefix: {PREFIX}\n    selectable_fields: [spec.nodeName]\n",
            etcd.client_url,
            free_port()
        ),
    )?;
    let bin = match &args.watchproxy_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("watchproxy"),
    };
    let mut proxy = start_watchproxy(&bin, &config, port)?;
    let endpoint = format!("http://127.0.0.1:{port}");
    let me = ProcFigures::own();
    let etcd_figures = ProcFigures(etcd.pid().context("etcd is running")?);

    let mut per_event = [Vec::new(), Vec::new()];
    let runs = (0..args.rounds).flat_map(|r| [(r, false), (r, true)]);
    for (run, (round, bare)) in runs.enumerate() {
        let kind = if bare { "bare watch" } else { "rust informer" };
        let mut child = Spawned(
            Command::new(std::env::current_exe()?)
                .args(["--informer", &endpoint])
                .args(bare.then_some("--bare"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?,
        );
        let mut out = BufReader::new(child.0.stdout.take().unwrap());
        let synced = read_json(&mut out)?;
        let processes = [me, ProcFigures(proxy.0.id()), etcd_figures];
        let before = processes.map(ProcFigures::cpu_seconds);
        let writes = (args.rate * args.seconds) as usize;
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate));
        for w in 0..writes {
            tick.tick().await;
            let i = w * 7919 % args.objects;
            ec.put(key(i), pod(i, run * writes + w + 1), None).await?;
        }
        let rate = writes as f64 / started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = processes.map(ProcFigures::cpu_seconds);
        drop(child.0.stdin.take());
        let result = read_json(&mut out)?;
        let (cpu, changes) = (
            result["cpu"].as_f64().unwrap(),
            result["changes"].as_f64().unwrap(),
        );
        let us = cpu / changes * 1e6;
        per_event[bare as usize].push(us);
        println!(
            "{kind} round {}: {} objects synced; {changes} changes at {rate:.0} writes/s: informer {cpu:.2} CPU-s = {us:.1} µs per event; writer {:.2}, watchproxy {:.2}, etcd {:.2} CPU-s; {}",
            round + 1,
            synced["objects"],
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2],
            result["stats"].as_str().unwrap_or("")
        );
        anyhow::ensure!(
            changes as usize == writes,
            "the informer took {changes} of {writes} writes"
        );
    }
    let [informer, bare] = per_event.map(median);
    println!(
        "median CPU per event over {} rounds: rust informer {informer:.1} µs, bare watch {bare:.1} µs",
        args.rounds
    );

    if args.no_python {
        return Ok(());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut python = Spawned(
        Command::new("python3")
            .env("PYTHONPATH", root.join("clients/python"))
            .arg(root.join("bench/python/relist_time.py"))
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "python3 with the watchproxy package's requirements (./scripts/install-deps.sh)",
            )?,
    );
    let mut out = BufReader::new(python.0.stdout.take().unwrap());
    let synced = read_json(&mut out)?;
    println!(
        "python informer: first list of {} objects in {:.2} s ({} handler calls)",
        synced["objects"], synced["seconds"], synced["handled"]
    );
    // Its version expires: watchproxy stops, a tenth of the objects change,
    // etcd compacts, and watchproxy starts again.
    drop(proxy);
    let changed = args.objects / 10;
    write(&mut ec, 0, changed, 1_000_000).await?;
    let now = ec
        .put(key(args.objects), pod(args.objects, 0), None)
        .await?;
    ec.compact(now.header().unwrap().revision(), None).await?;
    let started = Instant::now();
    proxy = start_watchproxy(&bin, &config, port)?;
    let relisted = read_json(&mut out)?;
    println!(
        "python informer: list after its version expired: {} objects in {:.2} s, {} handler calls for the {} changes; {:.2} s from watchproxy's start",
        relisted["objects"],
        relisted["seconds"],
        relisted["handled"],
        changed + 1,
        started.elapsed().as_secs_f64()
    );
    drop(proxy);
    Ok(())
}
