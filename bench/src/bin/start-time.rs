//! How long watchproxy takes to become ready on a large resource, against
//! reading the same prefix from etcd in pages as a client would (etcd's
//! paged range, the least a cache that lists must wait for), round by
//! round; with watchproxy's CPU and memory at ready against the raw bytes
//! of the keys and values it holds.
//!
//! `cargo run --release -p watchproxy-bench --bin start-time -- --objects 100000`

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use etcd_client::{GetOptions, TxnOp};
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::ListRequest;
use watchproxy_testkit::{free_port, http_get, metric_value, Etcd, EtcdOptions, Spawned};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    objects: usize,
    /// Approximate size of each pod's JSON.
    #[arg(long, default_value_t = 1024)]
    object_bytes: usize,
    /// `json`, or `kubernetes`: the pods stored as the apiserver stores
    /// them (protobuf in its envelope), served with `format: kubernetes`.
    #[arg(long, default_value = "json")]
    format: String,
    /// Keys per page, for etcd's paged range and watchproxy's list alike.
    #[arg(long, default_value_t = 1000)]
    page_size: usize,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    /// Defaults to the `watchproxy` binary next to this one.
    #[arg(long)]
    watchproxy_bin: Option<PathBuf>,
    /// Another watchproxy build (e.g. an earlier commit) started the same
    /// way, round by round beside the first.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Leaves etcd's history of the load uncompacted, so watchproxy reads
    /// it all back into its event window at start. By default it is
    /// compacted, as the apiserver compacts every five minutes.
    #[arg(long)]
    keep_history: bool,
    /// Lines of `resources[0]` added to the config (YAML, indented by four
    /// spaces), e.g. `max_bytes: 50Mi`.
    #[arg(long)]
    resource_extra: Vec<String>,
}

/// A Kubernetes-shaped pod of about `bytes` bytes, as JSON or as the
/// apiserver stores it.
fn pod(i: usize, bytes: usize, protobuf: bool) -> (String, Vec<u8>) {
    let (ns, name) = (format!("ns-{}", i % 100), format!("pod-{i}"));
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "uid": format!("uid-{i:012}"),
            "labels": {"app": format!("app-{}", i % 50), "tier": "backend"},
            "annotations": {"example.com/pad": ""},
        },
        "spec": {
            "nodeName": format!("node-{}", i % 1000),
            "containers": [{"name": "main", "image": "registry.example/app:1.0", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255)},
    });
    let len = pod.to_string().len();
    pod["metadata"]["annotations"]["example.com/pad"] =
        "x".repeat(bytes.saturating_sub(len)).into();
    let key = format!("/registry/pods/{ns}/{name}");
    if !protobuf {
        return (key, pod.to_string().into_bytes());
    }
    (key, watchproxy::object::pod_as_stored(&pod))
}

/// Writes the pods, several transactions at once; the raw bytes written.
async fn load(etcd: &Etcd, objects: usize, bytes: usize, protobuf: bool) -> anyhow::Result<usize> {
    let client = etcd.client().await;
    let mut writers = tokio::task::JoinSet::new();
    let per = objects.div_ceil(8);
    for w in 0..8 {
        let mut client = client.clone();
        writers.spawn(async move {
            let mut raw = 0;
            let ids: Vec<usize> = (w * per..((w + 1) * per).min(objects)).collect();
            for chunk in ids.chunks(100) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|&i| {
                        let (k, v) = pod(i, bytes, protobuf);
                        raw += k.len() + v.len();
                        TxnOp::put(k, v, None)
                    })
                    .collect();
                client.txn(etcd_client::Txn::new().and_then(ops)).await?;
            }
            anyhow::Ok(raw)
        });
    }
    let mut raw = 0;
    while let Some(w) = writers.join_next().await {
        raw += w??;
    }
    Ok(raw)
}

/// Reads the whole prefix in pages at one revision; the seconds it took
/// and the pairs read.
async fn paged_range(etcd: &Etcd, page_size: usize) -> anyhow::Result<(f64, usize)> {
    let mut client = etcd.client().await;
    let started = Instant::now();
    let (mut from, end) = ("/registry/pods/".to_string(), "/registry/pods0".to_string());
    let mut at = 0;
    let mut read = 0;
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(page_size as i64);
        if at != 0 {
            options = options.with_revision(at);
        }
        let resp = client.get(from.clone(), Some(options)).await?;
        at = resp.header().map_or(0, |h| h.revision());
        read += resp.kvs().len();
        match resp.kvs().last() {
            Some(kv) if resp.more() => {
                from = format!("{}\0", kv.key_str()?);
            }
            _ => return Ok((started.elapsed().as_secs_f64(), read)),
        }
    }
}

struct Start {
    seconds: f64,
    cpu: f64,
    rss: f64,
    /// What the cache counts its objects at (`watchproxy_cache_bytes`).
    counted: f64,
    /// Refused for its `max_bytes` (OVER_BUDGET) rather than ready.
    refused: bool,
}

async fn start(args: &Args, etcd: &Etcd, bin: &PathBuf, tag: &str) -> anyhow::Result<Start> {
    let (port, metrics_port) = (free_port(), free_port());
    let config = etcd.dir().join(format!("watchproxy-{tag}.yaml"));
    let extra: String = (args.resource_extra.iter())
        .map(|l| format!("    {l}\n"))
        .collect();
    std::fs::write(
        &config,
        format!(
            "etcd: {{endpoints: [\"{}\"], list_page_size: {}}}\nlisten: 127.0.0.1:{port}\nmetrics_listen: 127.0.0.1:{metrics_port}\nresources:\n  - name: pods\n    prefix: /registry/pods\n    format: {}\n    selectable_fields: [spec.nodeName, status.phase]\n    indexed_fields: [spec.nodeName]\n{extra}",
            etcd.client_url, args.page_size, args.format,
        ),
    )?;
    let log = etcd.dir().join(format!("watchproxy-{tag}.log"));
    let started = Instant::now();
    let mut command = Command::new(bin);
    command.args(["serve", "--config"]).arg(&config);
    let proc = Spawned::logged(&mut command, "START_TIME_LOG", &log)?;
    let figures = proc.figures();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = started + Duration::from_secs(300);
    let mut client = loop {
        match WatchProxyClient::connect(url.clone()).await {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => return Err(e).context("connecting to watchproxy"),
        }
    };
    let ready = ListRequest {
        resource: "pods".into(),
        limit: 1,
        // Any version: served by the cache once it is ready, refused before.
        resource_version: "0".into(),
        ..Default::default()
    };
    let mut refused = false;
    loop {
        match client.list(ready.clone()).await {
            Ok(_) => break,
            // A budget below what the objects need: refused, as it must be.
            Err(e) if e.message().contains("max_bytes") => {
                refused = true;
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("watchproxy did not get ready: {e}\n{text}")
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = figures.cpu_seconds();
    if std::env::var_os("START_TIME_LOG").is_some() {
        std::fs::copy(
            &log,
            std::env::temp_dir().join(format!("start-time-{tag}.log")),
        )?;
    }
    // Memory once what the start left behind is freed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = http_get(&format!("127.0.0.1:{metrics_port}"), "/metrics");
    Ok(Start {
        seconds,
        cpu,
        rss: figures.rss_mib(),
        counted: metric_value(&text, "watchproxy_cache_bytes", "resource=\"pods\"")
            / f64::from(1 << 20),
        refused,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let etcd = Etcd::start_with(EtcdOptions::for_load(args.etcd_bin.clone())).await?;
    let loading = Instant::now();
    let protobuf = match args.format.as_str() {
        "json" => false,
        "kubernetes" => true,
        other => bail!("--format {other}: json or kubernetes"),
    };
    let raw = load(&etcd, args.objects, args.object_bytes, protobuf).await?;
    if !args.keep_history {
        let mut client = etcd.client().await;
        let revision = client
            .get("/", None)
            .await?
            .header()
            .map_or(0, |h| h.revision());
        client.compact(revision, None).await?;
    }
    let raw_mib = raw as f64 / f64::from(1 << 20);
    println!(
        "{} {} pods of ~{} B ({raw_mib:.1} MiB of keys and values) loaded in {:.1} s, history {}; pages of {}",
        args.objects,
        args.format,
        args.object_bytes,
        loading.elapsed().as_secs_f64(),
        if args.keep_history { "kept" } else { "compacted" },
        args.page_size
    );
    let own = match &args.watchproxy_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("watchproxy"),
    };
    let mut targets = vec![("watchproxy", own)];
    if let Some(b) = &args.baseline_bin {
        targets.push(("baseline", b.clone()));
    }
    println!(
        "{:<12} {:>6} {:>9} {:>12} {:>9} {:>9} {:>11} {:>12}",
        "target",
        "round",
        "ready s",
        "÷ etcd range",
        "CPU s",
        "RSS MiB",
        "counted MiB",
        "RSS ÷ raw"
    );
    for round in 1..=args.rounds {
        let (range, read) = paged_range(&etcd, args.page_size).await?;
        if read != args.objects {
            bail!("etcd's range read {read} pairs, not {}", args.objects);
        }
        println!(
            "{:<12} {round:>6} {range:>9.2} {:>12} {:>9} {:>9} {:>11} {:>12}",
            "etcd range", "1.00", "—", "—", "—", "—"
        );
        for (tag, bin) in &targets {
            let s = start(&args, &etcd, bin, tag).await?;
            if s.refused {
                println!(
                    "{tag:<12} {round:>6} refused (OVER_BUDGET) after {:.2} s; CPU {:.2} s, RSS {:.1} MiB, alive",
                    s.seconds, s.cpu, s.rss
                );
                continue;
            }
            println!(
                "{tag:<12} {round:>6} {:>9.2} {:>12.2} {:>9.2} {:>9.1} {:>11.1} {:>12.2}",
                s.seconds,
                s.seconds / range,
                s.cpu,
                s.rss,
                s.counted,
                s.rss / raw_mib,
            );
        }
    }
    Ok(())
}
