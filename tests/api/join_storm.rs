//! Watches that start together share one initial state: it is made and
//! encoded once for every joiner with the same selector and projection,
//! each joiner receives exactly what a watch of its own would (and the
//! changes since, from the window, when it joins a state a little older
//! than the cache), and with sharing switched off every watch makes its
//! own.

use std::collections::BTreeMap;

use crate::common::*;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use watchproxy::config::Config;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{EventType, WatchEvent, WatchRequest};

const PODS: usize = 1000;

/// A proxy on `etcd`, sharing initial states or not.
async fn proxy(etcd: &Etcd, share: bool) -> (Proxy, WatchProxyClient<Channel>) {
    let mut config = Config::from_yaml(&pods_yaml(&etcd.client_url, 256)).unwrap();
    config.watch.share_initial_state = share;
    let proxy = Proxy::start_config(config).await;
    let mut client = small_windows(&proxy).await;
    wait_ready(&mut client, "pods").await;
    (proxy, client)
}

/// A client with small flow-control windows, so a state it does not read
/// yet stays in flight.
async fn small_windows(proxy: &Proxy) -> WatchProxyClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .initial_stream_window_size(Some(8 << 10))
        .initial_connection_window_size(Some(16 << 20))
        .connect()
        .await
        .unwrap();
    WatchProxyClient::new(channel)
}

fn joining(rv: &str) -> WatchRequest {
    WatchRequest {
        field_selector: "spec.nodeName!=node-0".into(),
        fields: vec!["metadata".into(), "spec.nodeName".into()],
        send_initial_events: true,
        ..watch_req("pods", rv)
    }
}

/// Writes `count` pods over three namespaces and four nodes.
async fn put_pods(ec: &mut etcd_client::Client, count: usize, labels: &[(&str, &str)]) {
    for i in 0..count {
        let (ns, name, node) = (
            format!("ns-{}", i % 3),
            format!("pod-{i}"),
            format!("node-{}", i % 4),
        );
        put_pod(ec, &ns, &name, labels, &node).await;
    }
}

/// Reads up to and including the bookmark that ends the initial events.
async fn initial_events(stream: &mut tonic::Streaming<WatchEvent>) -> (Vec<WatchEvent>, u64) {
    let mut events = Vec::new();
    loop {
        let e = next_event(stream)
            .await
            .unwrap()
            .expect("the stream goes on");
        if e.initial_events_end {
            return (events, summary(&e).2);
        }
        assert_ne!(e.r#type, EventType::Bookmark as i32);
        events.push(e);
    }
}

fn metric(proxy: &Proxy, name: &str) -> f64 {
    proxy.metric(name, "resource=\"pods\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_share_one_initial_state_equal_to_their_own() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pods(&mut ec, PODS, &[]).await;
    let (shared, mut client) = proxy(&etcd, true).await;
    let (own, mut own_client) = proxy(&etcd, false).await;

    // Twenty joiners open before any reads: the state is larger than a
    // stream's flow-control window, so all are still reading it.
    let mut first = Vec::new();
    for _ in 0..20 {
        first.push(open_watch(&mut client, joining("")).await);
    }
    let mut alone = open_watch(&mut own_client, joining("")).await;
    // A change, then ten more that accept any version: they join the
    // same state and get the change from the window after it.
    let changed = put_pod(&mut ec, "ns-1", "pod-1", &[("v", "2")], "node-1").await;
    let mut later = Vec::new();
    for _ in 0..10 {
        later.push(open_watch(&mut client, joining("0")).await);
    }

    let (want, at) = initial_events(&mut alone).await;
    assert_eq!(want.len(), PODS * 3 / 4);
    let mut states = BTreeMap::new();
    for stream in first.iter_mut().chain(&mut later) {
        let (got, revision) = initial_events(stream).await;
        states.insert(revision, ());
        // A shared initial state is the one a watch makes alone.
        assert_eq!(got.len(), want.len());
        if let Some(at) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("event {at}: {:?}, alone: {:?}", got[at], want[at]);
        }
        let next = take_events(stream, 1).await;
        assert_eq!(
            summary(&next[0]).2,
            changed,
            "the change after the state follows it"
        );
        assert_eq!(summary(&next[0]).0, EventType::Modified);
    }
    assert!(at < changed);
    assert_eq!(states.len(), 1, "one state for all thirty: {states:?}");
    assert_eq!(metric(&shared, "watchproxy_initial_snapshots_total"), 1.0);
    assert_eq!(
        metric(&shared, "watchproxy_initial_snapshots_shared_total"),
        29.0
    );
    // Its bytes were encoded once, not thirty times.
    let bytes: usize = want.iter().map(prost::Message::encoded_len).sum();
    let encoded = metric(&shared, "watchproxy_initial_snapshot_bytes_total");
    assert!(
        encoded >= bytes as f64 && encoded < 2.0 * bytes as f64,
        "{encoded} bytes encoded for {bytes} bytes of state"
    );

    // A consistent joiner after the change needs a newer state than the
    // one being read: a second one is made.
    let mut newer = open_watch(&mut client, joining("")).await;
    let (got, revision) = initial_events(&mut newer).await;
    assert!(revision >= changed);
    assert_eq!(got.len(), want.len());
    assert_eq!(metric(&shared, "watchproxy_initial_snapshots_total"), 2.0);

    // Without sharing, every watch makes its own.
    let mut more = Vec::new();
    for _ in 0..3 {
        more.push(open_watch(&mut own_client, joining("")).await);
    }
    for stream in &mut more {
        initial_events(stream).await;
    }
    assert_eq!(metric(&own, "watchproxy_initial_snapshots_total"), 4.0);
    assert_eq!(
        metric(&own, "watchproxy_initial_snapshots_shared_total"),
        0.0
    );
    drop((shared, own));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_watches_carry_the_same_events_compressed_once_for_all() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pods(&mut ec, 300, &[("app", "web"), ("tier", "frontend")]).await;
    let (fast, mut plain_client) = proxy(&etcd, true).await;
    let mut config = Config::from_yaml(&pods_yaml(&etcd.client_url, 256)).unwrap();
    config.watch.serve_path = watchproxy::config::ServePath::Tonic;
    let tonic_path = Proxy::start_config(config).await;
    let request = || WatchRequest {
        send_initial_events: true,
        ..watch_req("pods", "")
    };
    let mut plain = open_watch(&mut plain_client, request()).await;
    let (want, _) = initial_events(&mut plain).await;
    let raw = metric(&fast, "watchproxy_initial_snapshot_bytes_total");

    // Three joiners per codec on each path, all open before any reads.
    let mut streams = Vec::new();
    for server in [&fast, &tonic_path] {
        let mut client = small_windows(server).await;
        wait_ready(&mut client, "pods").await;
        for codec in [CompressionEncoding::Zstd, CompressionEncoding::Gzip] {
            let mut client = client.clone().accept_compressed(codec);
            for _ in 0..3 {
                streams.push(open_watch(&mut client, request()).await);
            }
        }
    }
    for stream in &mut streams {
        let (got, _) = initial_events(stream).await;
        assert_eq!(got.len(), want.len());
        if let Some(at) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("event {at}: {:?}, uncompressed: {:?}", got[at], want[at]);
        }
    }
    // The six joiners on the fast path shared one state (the plain
    // joiner's was read whole and gone before they came), compressed once
    // per codec: as many bytes as one joiner per codec compresses.
    assert_eq!(metric(&fast, "watchproxy_initial_snapshots_total"), 2.0);
    assert_eq!(
        metric(&fast, "watchproxy_initial_snapshots_shared_total"),
        5.0
    );
    let compressed = metric(&fast, "watchproxy_initial_snapshot_compressed_bytes_total");
    let (single, client) = proxy(&etcd, true).await;
    for codec in [CompressionEncoding::Zstd, CompressionEncoding::Gzip] {
        let mut client = client.clone().accept_compressed(codec);
        initial_events(&mut open_watch(&mut client, request()).await).await;
    }
    let once = metric(
        &single,
        "watchproxy_initial_snapshot_compressed_bytes_total",
    );
    assert_eq!(
        metric(&single, "watchproxy_initial_snapshot_bytes_total"),
        2.0 * raw
    );
    assert!(once > 0.0);
    assert_eq!(compressed, once, "a state of {raw} bytes");
    // Live changes arrive compressed too, the same on every stream.
    let changed = put_pod(&mut ec, "ns-1", "pod-1", &[("app", "db")], "node-1").await;
    for stream in streams.iter_mut().chain([&mut plain]) {
        let next = take_events(stream, 1).await;
        assert_eq!(summary(&next[0]).2, changed);
        assert_eq!(next[0].object.as_ref().unwrap().labels["app"], "db");
    }
    drop((fast, tonic_path, single));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_initial_states_carry_the_same_objects_and_compress_better() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pods(&mut ec, 600, &[("app", "web"), ("tier", "frontend")]).await;
    let (one_by_one, client) = proxy(&etcd, true).await;
    let (batched, batched_client) = proxy(&etcd, true).await;
    let request = |batch: bool| WatchRequest {
        send_initial_events: true,
        batch_initial_events: batch,
        ..watch_req("pods", "")
    };
    let mut plain = client.clone().accept_compressed(CompressionEncoding::Zstd);
    let (want, at) = initial_events(&mut open_watch(&mut plain, request(false)).await).await;
    let mut zstd = batched_client.accept_compressed(CompressionEncoding::Zstd);
    let mut stream = open_watch(&mut zstd, request(true)).await;
    let (batches, batch_at) = initial_events(&mut stream).await;
    assert_eq!(batch_at, at);
    assert!(
        batches.len() < want.len() / 100,
        "{} messages",
        batches.len()
    );
    let objects: Vec<_> = batches.iter().flat_map(|e| e.objects.clone()).collect();
    let singles: Vec<_> = want.iter().map(|e| e.object.clone().unwrap()).collect();
    assert_eq!(objects.len(), singles.len());
    assert!(objects == singles, "the same objects in the same order");
    assert!(batches
        .iter()
        .all(|e| e.object.is_none() && e.r#type == EventType::Added as i32));
    // Changes after the state still come one per message.
    let changed = put_pod(&mut ec, "ns-1", "pod-1", &[("app", "db")], "node-1").await;
    let next = take_events(&mut stream, 1).await;
    assert_eq!(summary(&next[0]).2, changed);
    // The same bytes compress several times better in batches.
    let ratio = |p: &Proxy| {
        metric(p, "watchproxy_initial_snapshot_bytes_total")
            / metric(p, "watchproxy_initial_snapshot_compressed_bytes_total")
    };
    let (single_ratio, batch_ratio) = (ratio(&one_by_one), ratio(&batched));
    assert!(
        batch_ratio > 3.0 * single_ratio,
        "batched {batch_ratio:.2}:1, one by one {single_ratio:.2}:1"
    );
    drop((one_by_one, batched));
}
