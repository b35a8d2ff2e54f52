//! Consistency without etcd load: consistent reads from the cache, pages
//! cut from one revision, and resuming across a restart of watchproxy.

use std::time::Duration;

use crate::common::*;
use tonic::Code;
use watchproxy::config::Config;
use watchproxy::pb::{EventType, ListRequest};

fn list(resource: &str) -> ListRequest {
    ListRequest {
        resource: resource.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_read_of_an_idle_resource_is_served_from_the_cache_at_once() {
    // etcd's default: no progress notification for ten minutes, so only
    // watchproxy's own proof that nothing changed can make the cache fresh.
    let etcd = Etcd::start_with_default_progress().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "").await;
    let (proxy, mut client) = proxy_ready(&etcd).await;
    for i in 0..5 {
        let elsewhere = ec.put(format!("/elsewhere/{i}"), "x", None).await.unwrap();
        let elsewhere = elsewhere.header().unwrap().revision() as u64;
        let resp = client.list(list("pods")).await.unwrap().into_inner();
        assert!(resp.resource_version.parse::<u64>().unwrap() >= elsewhere);
        assert_eq!(resp.items.len(), 1);
    }
    assert_eq!(
        proxy.metric(
            "watchproxy_consistent_read_fallbacks_total",
            "resource=\"pods\""
        ),
        0.0
    );
    assert_eq!(
        proxy.metric(
            "watchproxy_etcd_requests_total",
            "request=\"exact_list_page\""
        ),
        0.0
    );
}

/// The reads etcd served (Range and Txn calls), from etcd's own metrics:
/// watchproxy's, and nothing else reads in these tests.
fn etcd_reads(etcd: &Etcd) -> f64 {
    let addr = etcd.client_url.trim_start_matches("http://");
    let text = http_get(addr, "/metrics");
    ["Range", "Txn"]
        .iter()
        .map(|m| {
            let labels = format!("grpc_method=\"{m}\",grpc_service=\"etcdserverpb.KV\"");
            metric_value(&text, "grpc_server_started_total", &labels)
        })
        .sum()
}

/// 1,000 consistent Lists at once on four connections, each seeing at
/// least the write before them; what they cost etcd, and the checks of
/// etcd's revision watchproxy made for them.
async fn thousand_lists(etcd: &Etcd, proxy: &Proxy, written: u64) -> (f64, f64) {
    let channels: Vec<_> = futures::future::join_all((0..4).map(|_| proxy.client())).await;
    let checks = || proxy.metric("watchproxy_freshness_checks_total", "resource=\"pods\"");
    let (before, checks_before) = (etcd_reads(etcd), checks());
    let lists: Vec<_> = (0..1000)
        .map(|i| {
            let mut c = channels[i % 4].clone();
            tokio::spawn(async move {
                let page = c.list(list("pods")).await.unwrap().into_inner();
                page.resource_version.parse::<u64>().unwrap()
            })
        })
        .collect();
    for l in lists {
        assert!(
            l.await.unwrap() >= written,
            "every list sees the last write"
        );
    }
    (etcd_reads(etcd) - before, checks() - checks_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_consistent_lists_cost_etcd_at_most_fifty_requests_idle_and_loaded() {
    // etcd's default: no progress notifications, so each read needs a
    // check of etcd's revision.
    let etcd = Etcd::start_with_default_progress().await;
    let mut ec = etcd.client().await;
    for i in 0..50 {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[], "").await;
    }
    let (proxy, mut client) = proxy_ready(&etcd).await;
    // Every resource has read its history: only checks read etcd now.
    wait_ready(&mut client, "nodes").await;
    wait_ready(&mut client, "blobs").await;
    let written = put_pod(&mut ec, "ns", "fresh", &[], "").await;
    // etcd moves on elsewhere: each check must prove nothing changed here.
    ec.put("/elsewhere/a", "x", None).await.unwrap();
    let (idle, idle_checks) = thousand_lists(&etcd, &proxy, written).await;

    // Loaded: writes under the prefix and elsewhere all the while, so
    // proofs fail and reads wait for the watch.
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (mut ec, stop) = (ec.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() && i < 100_000 {
                put_pod(&mut ec, "ns", &format!("w{}", i % 20), &[], "").await;
                ec.put(format!("/elsewhere/{}", i % 20), "x", None)
                    .await
                    .unwrap();
                i += 1;
            }
        })
    };
    let written = put_pod(&mut ec, "ns", "fresh", &[("v", "2")], "").await;
    let (loaded, loaded_checks) = thousand_lists(&etcd, &proxy, written).await;
    stop.cancel();
    writer.await.unwrap();
    println!(
        "1,000 concurrent consistent lists cost etcd {idle} reads in {idle_checks} checks idle, \
         {loaded} in {loaded_checks} loaded"
    );
    // A read shares the next check to start, and a check is one request:
    // the cost follows the rate of checks, not of reads.
    assert!(idle <= 50.0, "idle: {idle} etcd reads");
    assert!(loaded <= 50.0, "loaded: {loaded} etcd reads");
    assert!(
        idle <= idle_checks,
        "idle: {idle} etcd reads for {idle_checks} checks"
    );
    assert!(
        loaded <= loaded_checks,
        "loaded: {loaded} etcd reads for {loaded_checks} checks"
    );
    assert_eq!(
        proxy.metric(
            "watchproxy_consistent_read_fallbacks_total",
            "resource=\"pods\""
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_cut_from_the_first_pages_revision_while_writes_continue() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..250 {
        put_pod(&mut ec, "ns", &format!("p{i:03}"), &[("v", "1")], "").await;
    }
    let (proxy, mut client) = proxy_ready(&etcd).await;
    let mut token = String::new();
    let mut seen = Vec::new();
    let mut revisions = Vec::new();
    let mut pages = 0;
    loop {
        let resp = client
            .list(ListRequest {
                limit: 60,
                continue_token: token,
                ..list("pods")
            })
            .await
            .unwrap()
            .into_inner();
        revisions.push(resp.resource_version.clone());
        seen.extend(
            resp.items
                .iter()
                .map(|o| (o.name.clone(), o.labels["v"].clone())),
        );
        pages += 1;
        // Between pages: a new pod, a change and a deletion on later pages.
        put_pod(&mut ec, "ns", &format!("new-{pages}"), &[], "").await;
        put_pod(
            &mut ec,
            "ns",
            &format!("p{:03}", 249 - pages),
            &[("v", "2")],
            "",
        )
        .await;
        delete_key(&mut ec, &format!("/registry/pods/ns/p{:03}", 240 - pages)).await;
        if resp.continue_token.is_empty() {
            break;
        }
        token = resp.continue_token;
    }
    assert_eq!(pages, 5);
    assert!(
        revisions.windows(2).all(|w| w[0] == w[1]),
        "one revision for all pages: {revisions:?}"
    );
    let want: Vec<(String, String)> = (0..250)
        .map(|i| (format!("p{i:03}"), "1".to_string()))
        .collect();
    assert_eq!(seen, want, "every object once, as it was at the first page");
    assert_eq!(
        proxy.metric(
            "watchproxy_etcd_requests_total",
            "request=\"exact_list_page\""
        ),
        0.0,
        "pages come from the cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_token_whose_revision_left_the_window_is_out_of_range() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[], "").await;
    }
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64")
        .replace(
            "indexed_fields: [spec.nodeName]",
            "indexed_fields: [spec.nodeName]\n    cache: {min_events: 4, max_events: 4}",
        );
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let first = client
        .list(ListRequest {
            limit: 3,
            ..list("pods")
        })
        .await
        .unwrap()
        .into_inner();
    let mut last = 0;
    for i in 0..6 {
        last = put_pod(&mut ec, "ns", &format!("p{i}"), &[("round", "2")], "").await;
    }
    // Once the cache holds the writes, the token's revision has left its
    // window of 4 events.
    assert!(list_version(&mut client, "pods", &last.to_string()).await >= last);
    let err = client
        .list(ListRequest {
            limit: 3,
            continue_token: first.continue_token,
            ..list("pods")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("start the list again"),
        "{}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_watch_after_the_history_read_asks_etcd_for_no_previous_values() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..5 {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[], "").await;
    }
    let (_proxy, mut client) = proxy_ready(&etcd).await;
    let rv = list_version(&mut client, "pods", "").await;
    let mut stream = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;

    // etcd reads a previous value as a range at the revision before the
    // event: that is the cost a watch with previous values adds per event.
    let ranges = || etcd.metric("etcd_mvcc_range_total");
    let before = ranges();
    const UPDATES: usize = 30;
    for i in 0..UPDATES {
        put_pod(
            &mut ec,
            "ns",
            &format!("p{}", i % 5),
            &[("n", &i.to_string())],
            "",
        )
        .await;
    }
    assert_eq!(take_events(&mut stream, UPDATES).await.len(), UPDATES);
    let read = ranges() - before;
    assert!(
        read < UPDATES as f64 / 2.0,
        "etcd read {read} ranges for {UPDATES} updates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_resume_across_a_restart_of_watchproxy_without_out_of_range() {
    const WATCHERS: usize = 300;
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..20 {
        put_pod(
            &mut ec,
            "ns",
            &format!("p{i}"),
            &[],
            &format!("node-{}", i % 4),
        )
        .await;
    }
    let (mut first, client) = proxy_ready(&etcd).await;

    // Watchers over several connections, some filtered by node, follow
    // their events and remember the last version they saw.
    let mut streams = Vec::new();
    let channels: Vec<_> = futures::future::join_all((0..6).map(|_| first.client())).await;
    for i in 0..WATCHERS {
        let mut c = if i % 7 == 0 {
            client.clone()
        } else {
            channels[i % 6].clone()
        };
        let mut req = watch_req("pods", "0");
        if i % 3 == 0 {
            req.field_selector = format!("spec.nodeName=node-{}", i % 4);
        }
        streams.push((req.clone(), open_watch(&mut c, req).await));
    }
    // The last version each node's watchers see: a write concerns the node
    // a pod moves to and the node it leaves.
    let mut node_of: std::collections::HashMap<String, usize> =
        (0..20).map(|i| (format!("p{i}"), i % 4)).collect();
    let mut last_for_node = [0u64; 4];
    let mut revs = Vec::new();
    for i in 0..30 {
        let (pod, node) = (format!("p{}", i % 25), i % 4);
        let rev = put_pod(&mut ec, "ns", &pod, &[("w", "1")], &format!("node-{node}")).await;
        last_for_node[node] = rev;
        if let Some(old) = node_of.insert(pod, node) {
            last_for_node[old] = rev;
        }
        revs.push(rev);
    }
    let last_write = *revs.last().unwrap();
    let readers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, (req, mut s))| {
            let until = if req.field_selector.is_empty() {
                last_write
            } else {
                last_for_node[i % 4]
            };
            tokio::spawn(async move {
                let mut last = 0u64;
                while last < until {
                    match next_event(&mut s).await {
                        Ok(Some(e)) => last = last.max(summary(&e).2),
                        other => panic!("watch ended early: {other:?}"),
                    }
                }
                assert_eq!(last, until);
                (req, last)
            })
        })
        .collect();
    let mut positions = Vec::new();
    for r in readers {
        positions.push(r.await.unwrap());
    }

    // Restart: the old instance goes away, writes continue, a new one starts.
    first.stop().await;
    for i in 0..10 {
        revs.push(
            put_pod(
                &mut ec,
                "ns",
                &format!("q{i}"),
                &[],
                &format!("node-{}", i % 4),
            )
            .await,
        );
    }
    let (second, client) = proxy_ready(&etcd).await;
    let channels: Vec<_> = futures::future::join_all((0..6).map(|_| second.client())).await;
    let mut out_of_range = 0;
    let mut resumed = 0;
    for (i, (mut req, last)) in positions.into_iter().enumerate() {
        let mut c = if i % 7 == 0 {
            client.clone()
        } else {
            channels[i % 6].clone()
        };
        req.resource_version = last.to_string();
        match c.watch(req.clone()).await {
            Ok(s) => {
                let mut s = s.into_inner();
                // The next event is the first write after its position.
                let e = tokio::time::timeout(Duration::from_secs(10), s.message())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                assert!(summary(&e).2 > last && summary(&e).0 != EventType::Bookmark);
                resumed += 1;
            }
            Err(e) if e.code() == Code::OutOfRange => out_of_range += 1,
            Err(e) => panic!("resume from {last}: {e:?}"),
        }
    }
    println!("after a restart, {resumed} of {WATCHERS} watchers resumed, {out_of_range} got OUT_OF_RANGE");
    assert_eq!(out_of_range, 0);
    assert_eq!(resumed, WATCHERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_read_falls_back_to_etcd_when_the_cache_cannot_catch_up() {
    use std::collections::HashMap;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;
    use watchproxy::api::{Api, InitialStates, Served};
    use watchproxy::cache::WatchCache;
    use watchproxy::dispatch::Dispatcher;
    use watchproxy::object::Resource;
    use watchproxy::source::{spawn_freshness, Etcd as EtcdClient, Origin};
    use watchproxy::telemetry::Metrics;

    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "before", &[], "").await;

    // A cache made ready from a list, whose reflector never runs: it stays
    // at the list's revision whatever etcd does next.
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64");
    let config = Config::from_yaml(&yaml).unwrap();
    let resource = Arc::new(Resource::from(&config.resources[0]));
    let metrics = Metrics::default();
    let m = metrics.resource("pods");
    let client = EtcdClient::connect(&config.etcd.endpoints, Duration::from_secs(2), 100)
        .await
        .unwrap();
    let (start, end) = (resource.key_prefix(), resource.key_range_end());
    let mut pages = client.pages(&m, &start, &end);
    let mut objects = Vec::new();
    while let Some(kvs) = pages.next().await.unwrap() {
        objects.extend(kvs.iter().map(|kv| {
            let revision = kv.mod_revision() as u64;
            resource.decode(kv.key(), kv.value(), revision).unwrap()
        }));
    }
    let listed = pages.revision().unwrap();
    let dispatcher = Dispatcher::new(64, Duration::from_secs(60), m.clone());
    let (cache, mut writer) = WatchCache::new(
        resource.clone(),
        &config.resources[0].cache,
        dispatcher,
        m.clone(),
    );
    writer.replace(objects, listed).unwrap();
    let shutdown = CancellationToken::new();
    let origin = Origin::Etcd(Box::new(client));
    let (freshness, checker) =
        spawn_freshness(origin.clone(), cache.clone(), m.clone(), shutdown.clone());
    let served = HashMap::from([(
        "pods".to_string(),
        Served {
            cache,
            origin,
            freshness,
            metrics: m.clone(),
            watch_slots: Arc::new(tokio::sync::Semaphore::new(10)),
            initial_states: Arc::new(InitialStates::new(true, m.clone())),
        },
    )]);
    let api = Api::new(
        served,
        Duration::from_millis(600),
        10,
        metrics.clone(),
        shutdown.clone(),
    );

    put_pod(&mut ec, "ns", "after", &[], "").await;
    let resp = api
        .list(tonic::Request::new(list("pods")))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = resp.items.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        ["after", "before"],
        "answered from etcd, with the write"
    );
    assert!(resp.resource_version.parse::<u64>().unwrap() > listed);
    assert_eq!(m.consistent_read_fallbacks.get(), 1);
    // "0" asks for no freshness and is answered by the stale cache.
    let any = ListRequest {
        resource_version: "0".into(),
        ..list("pods")
    };
    assert_eq!(
        api.list(tonic::Request::new(any))
            .await
            .unwrap()
            .into_inner()
            .items
            .len(),
        1
    );
    shutdown.cancel();
    checker.await.unwrap();
}
