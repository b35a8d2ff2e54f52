//! What a run measures: the targets, the watch load and its layout.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    Watchproxy,
    /// watchproxy serving every call on tonic's server
    /// (`--serve-path tonic`): the plain path its own HTTP/2 path is
    /// measured against.
    WatchproxyTonic,
    /// watchproxy's own HTTP/2 path with every change queued for its
    /// watch and the watch polled for it (`watch.direct_delivery: false`):
    /// the plain path direct delivery is measured against.
    WatchproxyQueued,
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
    /// The `--baseline-bin` build serving etcd's API: rounds alternate it
    /// with `watchproxy-etcd`.
    WatchproxyEtcdBaseline,
    /// watchproxy serving Kubernetes' API (`kubernetes_api.enabled`), its
    /// watchers JSON watches over HTTP/2, as informers watch an apiserver.
    WatchproxyKubernetes,
    GrpcProxy,
    Etcd,
    /// One etcd watch and a plain write of each value to each connection
    /// that wants it: the CPU any proxy spends on this load, at least.
    Floor,
}

impl Target {
    pub fn is_watchproxy(self) -> bool {
        matches!(
            self,
            Target::Watchproxy
                | Target::WatchproxyTonic
                | Target::WatchproxyQueued
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
pub enum Mode {
    /// Every watcher wants every event.
    All,
    /// Watcher i wants the objects on node i mod --nodes.
    Node,
}

/// How the watchers of one node are spread over the connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
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
pub struct Args {
    #[arg(long, default_value_t = 2000)]
    pub objects: usize,
    /// Approximate size of each object's value.
    #[arg(long, default_value_t = 1024)]
    pub object_bytes: usize,
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// gRPC connections the watchers are spread over (see --layout).
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Writes per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    #[arg(long, value_enum, default_value = "all")]
    pub mode: Mode,
    /// Nodes the objects are spread over (object i is on node i mod
    /// --nodes). By default one per watcher, so every write is wanted by
    /// one watcher: as many useful deliveries as writes, however many
    /// watchers there are.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: Option<u64>,
    #[arg(long, value_enum, default_value = "spread")]
    pub layout: Layout,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "watchproxy,grpc-proxy,etcd,floor"
    )]
    pub targets: Vec<Target>,
    /// Seconds to wait after the writer stops for deliveries still under way.
    #[arg(long, default_value_t = 10)]
    pub drain: u64,
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// Defaults to the `watchproxy` binary next to this one.
    #[arg(long)]
    pub watchproxy_bin: Option<PathBuf>,
    /// The watchproxy of the `watchproxy-baseline` target.
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Runs every target this many times, round by round, so that a shared
    /// machine's drift reaches all of them alike, and prints each figure's
    /// median over the rounds (missed events and memory: the worst round;
    /// watches ended early: those of every round).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Extra watchers, on a connection of their own, that want every event
    /// and never read: the others' latency shows whether they cost anyone.
    /// The floor has no flow control and runs without them.
    #[arg(long, default_value_t = 0)]
    pub stalled: usize,
    /// Projections the watchproxy watchers ask for, `;`-separated, each a
    /// `,`-separated list of dotted paths (`-` for the whole value):
    /// watcher i takes the (i mod n)th. E.g. `metadata` or
    /// `metadata;metadata.annotations,spec.nodeName,status.phase;-`.
    #[arg(long)]
    pub projections: Option<String>,
    /// watchproxy targets in all mode only: the hash space of
    /// `metadata.name` cut into this many equal shards, watcher i asking
    /// for shard i mod n (so with as many shards as watchers, each event
    /// is wanted by one).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub shards: Option<u64>,
    /// The HTTP/2 window (stream and connection) the watchers' connections
    /// start with, as Go's gRPC clients start with 65535 and keep near it
    /// on loopback. Set, the etcd targets' watchers are raw etcd Watch
    /// streams on tonic channels with this window (the `etcd-client`
    /// crate cannot set it), each still its own stream with one watch;
    /// unset, tonic's and etcd-client's defaults.
    #[arg(long)]
    pub client_window: Option<u32>,
    /// Each write waits until every delivery it asks for has arrived
    /// (`--rate` is then a ceiling), so that what a pass of the front
    /// carries does not depend on the machine's speed: for counting
    /// instructions (`--callgrind-after`).
    #[arg(long)]
    pub lockstep: bool,
    /// The front runs under callgrind started with `--instr-atstart=no`:
    /// counting starts after this many writes (buffers grown, caches
    /// warm) and ends, with a dump, once the last write's deliveries
    /// arrived; the deliveries counted are printed.
    #[arg(long, requires = "lockstep")]
    pub callgrind_after: Option<u64>,
    /// Edges of the watchproxy-tiers target, replicas of the
    /// watchproxy-replicas one.
    #[arg(long, default_value_t = 3)]
    pub edges: usize,

    /// Serve as the floor target on this address (the run starts it).
    #[arg(long, hide = true)]
    pub floor_listen: Option<std::net::SocketAddr>,
    #[arg(long, hide = true, default_value = "")]
    pub floor_etcd: String,
    #[arg(long, hide = true, default_value_t = 0)]
    pub floor_start: i64,
}

impl Args {
    pub fn nodes(&self) -> usize {
        self.nodes.map_or(self.watchers, |n| n as usize).max(1)
    }
}
