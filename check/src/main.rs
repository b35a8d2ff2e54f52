//! `watchproxy-check`: the checker against a running deployment.

use std::time::Duration;

use clap::Parser;

/// Proves watchproxy's watch streams against etcd's own history.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// etcd's client URLs, separated by commas: a watch of the checker's
    /// own records the truth.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// watchproxy's URL; given more than once (replicas), each informer
    /// moves to the next one whenever its stream ends.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    watchproxy: Vec<String>,
    /// The resource as watchproxy names it.
    #[arg(long, default_value = "pods")]
    resource: String,
    /// Its etcd prefix. The checker writes under it (keys
    /// `<prefix>/ns-N/obj-M`) unless `--rate 0`.
    #[arg(long, default_value = "/registry/pods")]
    prefix: String,
    #[arg(long, default_value_t = 50)]
    watchers: usize,
    /// Writes per second; 0 only watches writes made by others.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Seconds of writing (or of watching, with `--rate 0`).
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// Seconds every informer may take to catch up once writes end.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A quarter of the informers read slowly, a quarter stall for 3 s
    /// now and then, a quarter drop their streams and resume.
    #[arg(long)]
    misbehave: bool,
    /// `TOKEN=NODE`: informers call with these bearer tokens, round robin,
    /// each expected to see only the pods of NODE (an authorization rule
    /// `spec.nodeName={user}`). Repeatable.
    #[arg(long = "identity", value_parser = identity)]
    identities: Vec<(String, String)>,
    /// Write only keys created and at once deleted again (what etcd's
    /// freshness proof cannot see), instead of changing objects.
    #[arg(long)]
    transients: bool,
    /// Tasks making consistent Lists of the whole resource without pause,
    /// each proven equal to etcd's state at its version.
    #[arg(long, default_value_t = 0)]
    readers: usize,
    /// The informers speak etcd's own API (KV.Range and Watch) to
    /// watchproxy's `etcd_api`, as programs written against etcd do; their
    /// selections are key ranges (everything, a namespace, one object).
    #[arg(long)]
    etcd_api: bool,
}

fn identity(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(t, n)| (t.to_owned(), n.to_owned()))
        .ok_or_else(|| "expected TOKEN=NODE".into())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let report = watchproxy_check::run(watchproxy_check::Options {
        etcd: a.etcd,
        watchproxy: a.watchproxy,
        resource: a.resource,
        prefix: a.prefix.trim_end_matches('/').to_owned(),
        watchers: a.watchers,
        rate: a.rate,
        duration: Duration::from_secs(a.duration),
        settle: Duration::from_secs(a.settle),
        seed: a.seed,
        misbehave: a.misbehave,
        identities: a.identities,
        writes: match a.transients {
            true => watchproxy_check::writer::Writes::Transients,
            false => watchproxy_check::writer::Writes::Mixed,
        },
        readers: a.readers,
        api: match a.etcd_api {
            true => watchproxy_check::Api::Etcd,
            false => watchproxy_check::Api::WatchProxy,
        },
    })
    .await?;
    println!("{report}");
    if !report.passed() {
        std::process::exit(1);
    }
    Ok(())
}
