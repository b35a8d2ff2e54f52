//! The watchproxy command: `serve`, plus `demo-load`, `list` and `watch` to
//! try it by hand.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use watchproxy::config::{Config, ConfigSource, Overrides, ServePath};
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, ListRequest, WatchRequest};
use watchproxy::{run, telemetry, Listeners};

#[derive(Parser)]
#[command(
    version,
    about = "A watch cache in front of etcd, serving List and Watch over gRPC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service.
    Serve {
        /// The YAML configuration file.
        #[arg(long, env = "WATCHPROXY_CONFIG")]
        config: PathBuf,
        /// Overrides `listen`.
        #[arg(long, env = "WATCHPROXY_LISTEN")]
        listen: Option<SocketAddr>,
        /// Overrides `metrics_listen`.
        #[arg(long, env = "WATCHPROXY_METRICS_LISTEN")]
        metrics_listen: Option<SocketAddr>,
        /// Overrides `etcd.endpoints` (comma-separated).
        #[arg(long, env = "WATCHPROXY_ETCD_ENDPOINTS", value_delimiter = ',')]
        etcd_endpoints: Option<Vec<String>>,
        #[arg(
            long,
            env = "WATCHPROXY_LOG_FORMAT",
            value_enum,
            default_value = "text"
        )]
        log_format: LogFormat,
        /// Threads serving calls; by default, one per CPU the process may
        /// use (its cgroup's CPU limit included). Where it shares a few
        /// cores with etcd and its clients, one thread spends less per
        /// delivery than several, which hand each event between cores.
        #[arg(long, env = "WATCHPROXY_WORKER_THREADS")]
        worker_threads: Option<std::num::NonZeroUsize>,
        /// Overrides `watch.serve_path`: `fast` (the service's own HTTP/2
        /// path) or `tonic` (tonic's server for every call).
        #[arg(long, env = "WATCHPROXY_SERVE_PATH", value_enum)]
        serve_path: Option<ServePath>,
    },
    /// Write Kubernetes-shaped demo pods into etcd.
    DemoLoad {
        #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
        etcd_endpoints: Vec<String>,
        #[arg(long, default_value = "/registry/pods")]
        prefix: String,
        #[arg(long, default_value_t = 3000)]
        count: usize,
        #[arg(long, default_value_t = 50)]
        nodes: usize,
        #[arg(long, default_value_t = 10)]
        namespaces: usize,
        /// How the pods are stored: `json`, or `kubernetes` (protobuf in
        /// the storage envelope, as the apiserver stores them; serve them
        /// with `format: kubernetes`).
        #[arg(long, value_enum, default_value = "json")]
        format: DemoFormat,
    },
    /// List objects from a running watchproxy.
    List {
        #[command(flatten)]
        query: Query,
        #[arg(long, default_value_t = 0)]
        limit: i64,
    },
    /// Watch objects from a running watchproxy, one event per line.
    Watch {
        #[command(flatten)]
        query: Query,
        /// Where to start ("" = now with the current state, "N" = after N).
        #[arg(long, default_value = "")]
        resource_version: String,
    },
}

#[derive(clap::Args)]
struct Query {
    /// The resource, e.g. pods.
    resource: String,
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    #[arg(short, long, default_value = "")]
    namespace: String,
    #[arg(short = 'l', long, default_value = "")]
    selector: String,
    #[arg(long, default_value = "")]
    field_selector: String,
}

fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Command::Serve {
        worker_threads: Some(n),
        ..
    } = &command
    {
        runtime.worker_threads(n.get());
    }
    runtime.build()?.block_on(run_command(command))
}

async fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            config,
            listen,
            metrics_listen,
            etcd_endpoints,
            log_format,
            worker_threads: _,
            serve_path,
        } => {
            let _traces = telemetry::init(matches!(log_format, LogFormat::Json))?;
            let source = ConfigSource {
                path: config,
                overrides: Overrides {
                    listen,
                    metrics_listen,
                    etcd_endpoints,
                    serve_path,
                },
            };
            serve(source.load()?).await
        }
        Command::DemoLoad {
            etcd_endpoints,
            prefix,
            count,
            nodes,
            namespaces,
            format,
        } => {
            demo_load(
                &etcd_endpoints,
                &prefix,
                count,
                (nodes.max(1), namespaces.max(1)),
                format,
            )
            .await
        }
        Command::List { query, limit } => list(query, limit).await,
        Command::Watch {
            query,
            resource_version,
        } => watch(query, resource_version).await,
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let grpc = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let metrics = bind(config.metrics_listen).await?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        signal.cancel();
    });
    let health = bind(config.health_listen).await?;
    let listeners = Listeners {
        grpc,
        metrics,
        health,
    };
    run(config, listeners, shutdown).await
}

/// A listener on `addr`, when one is configured.
async fn bind(addr: Option<SocketAddr>) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match addr {
        Some(a) => Ok(Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("binding {a}"))?,
        )),
        None => Ok(None),
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DemoFormat {
    Json,
    Kubernetes,
}

async fn demo_load(
    endpoints: &[String],
    prefix: &str,
    count: usize,
    (nodes, namespaces): (usize, usize),
    format: DemoFormat,
) -> anyhow::Result<()> {
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .context("connecting to etcd")?;
    let apps = ["web", "api", "worker", "cache", "batch"];
    let prefix = prefix.trim_end_matches('/');
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|&i| {
                let (ns, app, node) = (format!("ns-{}", i % namespaces), apps[i % apps.len()], format!("node-{}", i % nodes));
                let name = format!("{app}-{i}");
                let pod = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "labels": {"app": app, "tier": if i % 3 == 0 { "frontend" } else { "backend" }}},
                    "spec": {"nodeName": node, "containers": [{"name": app, "image": format!("registry.example/{app}:1.{}", i % 7)}]},
                    "status": {"phase": if i % 10 == 0 { "Pending" } else { "Running" }},
                });
                let value = match format {
                    DemoFormat::Json => pod.to_string().into_bytes(),
                    DemoFormat::Kubernetes => watchproxy::object::pod_as_stored(&pod),
                };
                etcd_client::TxnOp::put(format!("{prefix}/{ns}/{name}"), value, None)
            })
            .collect();
        client
            .txn(etcd_client::Txn::new().and_then(ops))
            .await
            .context("writing demo pods")?;
    }
    say(format_args!(
        "wrote {count} pods under {prefix}/ over {nodes} nodes and {namespaces} namespaces"
    ));
    Ok(())
}

async fn connect(server: &str) -> anyhow::Result<WatchProxyClient<tonic::transport::Channel>> {
    WatchProxyClient::connect(server.to_owned())
        .await
        .with_context(|| format!("connecting to {server}"))
}

fn describe(o: &pb::Object) -> String {
    let labels: Vec<String> = o.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "{}/{} rv={} labels={}",
        o.namespace,
        o.name,
        o.resource_version,
        labels.join(",")
    )
}

async fn list(q: Query, limit: i64) -> anyhow::Result<()> {
    let mut client = connect(&q.server).await?;
    let mut continue_token = String::new();
    let mut total = 0;
    loop {
        let resp = client
            .list(ListRequest {
                resource: q.resource.clone(),
                namespace: q.namespace.clone(),
                label_selector: q.selector.clone(),
                field_selector: q.field_selector.clone(),
                limit,
                continue_token,
                ..Default::default()
            })
            .await?
            .into_inner();
        for o in &resp.items {
            say(format_args!("{}", describe(o)));
        }
        total += resp.items.len();
        if resp.continue_token.is_empty() {
            say(format_args!(
                "# {total} objects at resource version {}",
                resp.resource_version
            ));
            return Ok(());
        }
        continue_token = resp.continue_token;
    }
}

/// Prints the watch's events; after a status that says where to resume
/// (a replica going away, a connection's age), watches again from there.
async fn watch(q: Query, mut resource_version: String) -> anyhow::Result<()> {
    let mut client = connect(&q.server).await?;
    loop {
        let request = WatchRequest {
            resource: q.resource.clone(),
            namespace: q.namespace.clone(),
            label_selector: q.selector.clone(),
            field_selector: q.field_selector.clone(),
            resource_version: resource_version.clone(),
            allow_bookmarks: true,
            ..Default::default()
        };
        let ended = match client.watch(request).await {
            Ok(stream) => follow(stream.into_inner(), &mut resource_version).await,
            Err(status) => status,
        };
        let named = ended
            .metadata()
            .get("watchproxy-resume-resource-version")
            .and_then(|v| v.to_str().ok());
        match (ended.code(), named) {
            (tonic::Code::Ok, _) => return Ok(()),
            (tonic::Code::Unavailable, Some(named)) => resource_version = named.to_owned(),
            (tonic::Code::Unavailable, None) if !resource_version.is_empty() => {}
            _ => return Err(ended.into()),
        }
        eprintln!("# {}; resuming from {resource_version}", ended.message());
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Prints a watch stream's events, keeping in `resume` the version to
/// resume from after the last one; the status it ended with.
async fn follow(
    mut stream: tonic::Streaming<pb::WatchEvent>,
    resume: &mut String,
) -> tonic::Status {
    loop {
        let event = match stream.message().await {
            Ok(Some(event)) => event,
            Ok(None) => return tonic::Status::ok("the watch ended"),
            Err(status) => return status,
        };
        let kind = pb::EventType::try_from(event.r#type).map_or("UNKNOWN", |t| t.as_str_name());
        let object = event.object.unwrap_or_default();
        let mark = if event.resync { " resync" } else { "" };
        say(format_args!("{kind} {}{mark}", describe(&object)));
        if !event.resume_resource_version.is_empty() {
            *resume = event.resume_resource_version;
        }
    }
}

/// Writes a line of output. A reader that went away (`watch | head`) ends
/// the program quietly, with success: it took what it wanted.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("watchproxy: cannot write the output: {e}");
        std::process::exit(74);
    }
}
