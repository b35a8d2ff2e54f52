//! The watchproxy command: `serve`, the client commands `get`, `list` and
//! `watch` (shaped like kubectl's), `kubeconfig` and `demo-load`.

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use watchproxy::config::{Config, ConfigSource, Overrides, ServePath};
use watchproxy::{run, telemetry, Listeners};

#[derive(Parser)]
#[command(
    version,
    about = "A watch cache in front of etcd, serving List and Watch over gRPC",
    after_help = cli::EXIT_CODES
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
    /// Print one object, or the objects a selection matches.
    #[command(after_help = cli::EXIT_CODES)]
    Get(cli::Get),
    /// Print the objects a selection matches.
    #[command(after_help = cli::EXIT_CODES)]
    List(cli::List),
    /// Print the current objects a selection matches, then their changes.
    #[command(after_help = cli::EXIT_CODES)]
    Watch(cli::Watch),
    /// Write Kubernetes-shaped demo pods into etcd.
    DemoLoad(cli::demo::DemoLoad),
    /// Print a kubeconfig that points kubectl and Kubernetes' client
    /// libraries at the Kubernetes API (`kubernetes_api`).
    Kubeconfig(cli::kubeconfig::Kubeconfig),
}

fn main() -> ExitCode {
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
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(e) => return cli::Failure::Setup(e.into()).report(),
    };
    match runtime.block_on(run_command(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn run_command(command: Command) -> Result<(), cli::Failure> {
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
            let config = source.load().map_err(anyhow::Error::from)?;
            Ok(serve(config).await?)
        }
        Command::Get(args) => cli::get(args).await,
        Command::List(args) => cli::list(args).await,
        Command::Watch(args) => cli::watch(args).await,
        Command::DemoLoad(args) => Ok(cli::demo::demo_load(args).await?),
        Command::Kubeconfig(args) => Ok(cli::kubeconfig::kubeconfig(args)?),
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
    let kubernetes = match config.kubernetes_api.enabled {
        true => bind(config.kubernetes_api.listen).await?,
        false => None,
    };
    let listeners = Listeners {
        grpc,
        metrics,
        health,
        kubernetes,
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
