//! Mirrors the pods of one node, as a kubelet-like agent would, printing
//! each change and, on Ctrl-C, what it holds.
//!
//!     cargo run -p watchproxy-client --example node_pods -- http://127.0.0.1:50051 node-7

use clap::Parser;
use tokio_stream::StreamExt;
use watchproxy_client::{Certificate, Client, ClientTlsConfig, Event, Informer};

#[derive(Parser)]
struct Args {
    /// `http://host:port`, or `https://host:port` with --ca.
    endpoint: String,
    node: String,
    /// The CA that signed the server's certificate (PEM).
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// A file holding a bearer token; read again when it changes.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Print only the summary at the end, not each change.
    #[arg(long)]
    quiet: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut builder = Client::builder(args.endpoint);
    if let Some(ca) = &args.ca {
        let pem = std::fs::read(ca)?;
        builder = builder.tls(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)));
    }
    if let Some(file) = &args.token_file {
        builder = builder.token_file(file);
    }
    let mut informer = Informer::new(builder.connect_lazy()?, "pods")
        .field_selector(format!("spec.nodeName={}", args.node))
        .index("phase", |pod| {
            pod.field("status.phase").into_iter().collect()
        });
    let mut events = informer.events(1024);
    let running = informer.start();
    running.wait_until_synced().await?;
    eprintln!("synced: {} pods on {}", running.store().len(), args.node);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            event = events.next() => match event {
                None => break,
                Some(_) if args.quiet => {}
                Some(Event::Added(p)) => println!("ADDED    {}/{} @{}", p.namespace, p.name, p.resource_version),
                Some(Event::Modified { new, .. }) => println!("MODIFIED {}/{} @{}", new.namespace, new.name, new.resource_version),
                Some(Event::Deleted(p)) => println!("DELETED  {}/{} @{}", p.namespace, p.name, p.resource_version),
                Some(Event::Relisted { resource_version, resync }) => println!("RELISTED @{resource_version} resync={resync}"),
            }
        }
    }
    let store = running.store();
    let running_pods = store.by_index("phase", "Running").len();
    eprintln!(
        "{} pods ({running_pods} running) at {}; {:?}",
        store.len(),
        running.resource_version(),
        running.stats()
    );
    running.stop().await?;
    Ok(())
}
