//! The watchers: spread over connections to the front (or to etcd), each
//! counting what it receives, what it wanted of it, and how late.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use etcd_client::{Client, WatchOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{EventType, HashRange, ShardSelector, WatchRequest};
use watchproxy_testkit::Spawned;

use crate::args::{Args, Layout, Mode, Target};
use crate::fronts::{fronts_cpu, RunTls};
use crate::load::{now_nanos, parse};
use crate::{floor, kubernetes, PREFIX};

/// Opens a watch, trying again while watchproxy's cache is not ready
/// (UNAVAILABLE at once, as any client gets it).
pub async fn watch_when_ready(
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
pub fn connection_of(i: usize, nodes: usize, connections: usize, layout: Layout) -> usize {
    match layout {
        Layout::Spread => (i + i / nodes.max(1)) % connections,
        Layout::Shared => i % connections,
    }
}

/// Shard `k` of `n` equal ones of the hash space.
pub fn shard_range(k: u64, n: u64) -> HashRange {
    let start = |k: u64| ((u128::from(k) << 64) / u128::from(n)) as u64;
    HashRange {
        start: start(k),
        end: if k + 1 == n { 0 } else { start(k + 1) },
    }
}

/// The paths watcher `i` keeps, from `--projections`.
pub fn projection_of(projections: Option<&str>, i: usize) -> Vec<String> {
    let Some(all) = projections else {
        return Vec::new();
    };
    let choices: Vec<&str> = all.split(';').collect();
    match choices[i % choices.len()] {
        "-" | "" => Vec::new(),
        paths => paths.split(',').map(String::from).collect(),
    }
}

/// What one watcher saw.
#[derive(Default)]
pub struct Seen {
    pub received: u64,
    /// Bytes of the watch events received (watchproxy targets).
    pub bytes: u64,
    pub useful: u64,
    /// The watch ended with this error before the run stopped it.
    pub ended: Option<String>,
    /// Latencies of useful events, in microseconds.
    pub latencies: Vec<u32>,
}

impl Seen {
    /// Counts a delivery; true if the watcher wanted it.
    pub fn record(&mut self, value: &[u8], wanted_node: Option<&[u8]>) -> bool {
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

/// The open watchers of a run.
pub struct Watchers {
    /// Useful deliveries so far, over all watchers.
    pub useful: Arc<AtomicU64>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<anyhow::Result<Seen>>>,
    /// Watches held unread until the end.
    held: Vec<Box<dyn std::any::Any + Send>>,
}

/// Opens `args.watchers` watchers (and the stalled ones) against
/// `endpoints`, from `start_rev`; returns once every one is open.
pub async fn open(
    args: &Args,
    target: Target,
    fronts: &[Spawned],
    endpoints: &[String],
    tls: Option<&RunTls>,
    start_rev: i64,
) -> anyhow::Result<Watchers> {
    let identities = target == Target::WatchproxyTlsNodes;
    let nodes = args.nodes();
    let endpoint = endpoints[0].clone();
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
        let cpu = fronts_cpu(fronts);
        let started = Instant::now();
        let mut connecting = tokio::task::JoinSet::new();
        for c in 0..args.connections.max(1) {
            let mut channel = Channel::from_shared(endpoints[c % endpoints.len()].clone())?
                .initial_stream_window_size(args.client_window)
                .initial_connection_window_size(args.client_window);
            if let Some(tls) = tls {
                channel = channel.tls_config(tls.client())?;
            }
            connecting.spawn(async move { channel.connect().await });
        }
        while let Some(connected) = connecting.join_next().await {
            wp_channels.push(connected??);
        }
        let front_cpu = Some((fronts_cpu(fronts), cpu));
        eprintln!(
            "{target:?}: {} connections at once in {:.2} s, the front's CPU {:.2} s",
            wp_channels.len(),
            started.elapsed().as_secs_f64(),
            front_cpu.map_or(0.0, |(after, before)| after - before)
        );
    }
    let mut raw_channels = Vec::new();
    let mut kubernetes_connections = Vec::new();
    for _ in 0..args.connections.max(1) {
        match (target, args.client_window) {
            (t, _) if t.is_watchproxy() => {}
            (Target::Floor, _) => {}
            (Target::WatchproxyKubernetes, window) => kubernetes_connections
                .push(kubernetes::connect(&endpoint, window.unwrap_or(1 << 20)).await?),
            (_, Some(window)) => raw_channels.push(
                Channel::from_shared(endpoint.clone())?
                    .initial_stream_window_size(window)
                    .initial_connection_window_size(window)
                    .connect()
                    .await?,
            ),
            (_, None) => etcd_clients.push(Client::connect([&endpoint], None).await?),
        }
    }
    // Held unread until the end.
    let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    if args.stalled > 0 && target == Target::WatchproxyKubernetes {
        bail!("--stalled watchers are etcd's or watchproxy.v1's: not with watchproxy-kubernetes");
    }
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
                    held.push(Box::new(
                        watch_when_ready(&mut client, tonic::Request::new(req)).await?,
                    ));
                }
            }
            _ => {
                let mut client = Client::connect([&endpoint], None).await?;
                for _ in 0..args.stalled {
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(start_rev + 1);
                    held.push(Box::new(
                        client.watch(format!("{PREFIX}/"), Some(options)).await?,
                    ));
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
            tasks.push(tokio::spawn(follow_floor(
                endpoint, wants, stop, opened, counted,
            )));
        }
    }
    for i in (0..args.watchers).filter(|_| target != Target::Floor) {
        let node = format!("node-{}", i % nodes);
        let wanted = (args.mode == Mode::Node).then(|| node.clone().into_bytes());
        let (stop, opened, counted) = (stop.clone(), opened.clone(), useful.clone());
        match target {
            t if t.is_watchproxy() => {
                let client = WatchProxyClient::new(
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
                tasks.push(tokio::spawn(follow_watchproxy(
                    client, req, stop, opened, counted,
                )));
            }
            Target::WatchproxyKubernetes => {
                let c = connection_of(i, nodes, kubernetes_connections.len(), args.layout);
                let path =
                    kubernetes::watch_path(start_rev, wanted.is_some().then_some(node.as_str()));
                tasks.push(tokio::spawn(kubernetes::follow(
                    kubernetes_connections[c].clone(),
                    endpoint.clone(),
                    path,
                    stop,
                    opened,
                    counted,
                )));
            }
            _ if !raw_channels.is_empty() => {
                let c = connection_of(i, nodes, raw_channels.len(), args.layout);
                let channel = raw_channels[c].clone();
                tasks.push(tokio::spawn(follow_etcd_raw(
                    channel, start_rev, wanted, stop, opened, counted,
                )));
            }
            _ => {
                let client =
                    etcd_clients[connection_of(i, nodes, etcd_clients.len(), args.layout)].clone();
                tasks.push(tokio::spawn(follow_etcd(
                    client, start_rev, wanted, stop, opened, counted,
                )));
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
    Ok(Watchers {
        useful,
        stop,
        tasks,
        held,
    })
}

/// A floor connection's watchers: what they receive until `stop`.
async fn follow_floor(
    endpoint: String,
    wants: Vec<u32>,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
    counted: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
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
}

/// A watchproxy watch: what it receives until `stop`.
async fn follow_watchproxy(
    mut client: WatchProxyClient<Channel>,
    req: tonic::Request<WatchRequest>,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
    counted: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
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
}

/// An etcd watch of the whole prefix, counting what `wanted` (a node, in
/// node mode) asked for, until `stop`.
async fn follow_etcd(
    mut client: Client,
    start_rev: i64,
    wanted: Option<Vec<u8>>,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
    counted: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
    let mut seen = Seen::default();
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start_rev + 1);
    let mut stream = client.watch(format!("{PREFIX}/"), Some(options)).await?;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            m = stream.message() => match m? {
                Some(r) if r.canceled() => {
                    seen.ended = Some(format!("canceled: {}", r.cancel_reason()));
                    break;
                }
                // Open once its watch is: the stream's headers come first.
                Some(r) if r.created() => {
                    opened.fetch_add(1, Ordering::Relaxed);
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
}

/// [`follow_etcd`] as an etcd Watch stream of its own on `channel`, made
/// with tonic alone: one creation, then the request side left open, as
/// etcd's clients leave it.
async fn follow_etcd_raw(
    channel: Channel,
    start_rev: i64,
    wanted: Option<Vec<u8>>,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
    counted: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
    use tokio_stream::StreamExt;
    use watchproxy::etcdpb::etcdserverpb::{
        watch_request::RequestUnion, WatchCreateRequest, WatchRequest, WatchResponse,
    };
    let mut seen = Seen::default();
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: format!("{PREFIX}/").into_bytes().into(),
            range_end: format!("{PREFIX}0").into_bytes().into(),
            start_revision: start_rev + 1,
            ..Default::default()
        })),
    };
    let requests = tokio_stream::iter([create]).chain(tokio_stream::pending());
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
    let codec = tonic_prost::ProstCodec::<WatchRequest, WatchResponse>::default();
    let response = grpc.streaming(tonic::Request::new(requests), path, codec);
    let mut stream = response.await?.into_inner();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            m = stream.message() => match m? {
                Some(r) if r.canceled => {
                    seen.ended = Some(format!("canceled: {}", r.cancel_reason));
                    break;
                }
                Some(r) if r.created => {
                    opened.fetch_add(1, Ordering::Relaxed);
                }
                Some(r) => {
                    for kv in r.events.iter().filter_map(|e| e.kv.as_ref()) {
                        if seen.record(&kv.value, wanted.as_deref()) {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                None => break,
            },
        }
    }
    anyhow::Ok(seen)
}

impl Watchers {
    /// Stops the watchers: what they saw together, and why those that
    /// ended early ended.
    pub async fn finish(self) -> (Seen, BTreeMap<String, u64>) {
        self.stop.cancel();
        drop(self.held);
        let mut ended = BTreeMap::new();
        let mut all = Seen::default();
        for t in self.tasks {
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
        (all, ended)
    }
}
