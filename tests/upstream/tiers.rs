//! Tiers: an edge watchproxy whose resources come from a core watchproxy
//! (`upstream:`) instead of etcd. etcd sees the core's watches only; the
//! edge lists and watches what etcd holds, at etcd's revisions, so a
//! client can resume on either tier with the versions the other gave; an
//! edge follows its core through a restart of the core.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use watchproxy::config::Config;
use watchproxy::pb::{self, EventType};

fn edge_config(etcd_url: &str, core: std::net::SocketAddr) -> Config {
    let yaml = format!("upstream: http://{core}\n{}", pods_yaml(etcd_url, 64));
    Config::from_yaml(&yaml).unwrap()
}

async fn listed(
    client: &mut pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
) -> BTreeMap<String, String> {
    list_items(client, "pods")
        .await
        .into_iter()
        .map(|o| (o.key, String::from_utf8_lossy(&o.value).into_owned()))
        .collect()
}

/// Pods `ns/p-0` to `ns/p-{n-1}`, labelled app=web, on node-1.
async fn put_web_pods(ec: &mut etcd_client::Client, n: usize) {
    for i in 0..n {
        put_pod(ec, "ns", &format!("p-{i}"), &[("app", "web")], "node-1").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_serves_what_etcd_holds_through_its_core() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_web_pods(&mut ec, 20).await;
    let watches_before = etcd.metric("etcd_debugging_mvcc_watcher_total");
    let (core, mut core_client) = proxy_ready(&etcd).await;
    let edge = Proxy::start_config(edge_config(&etcd.client_url, core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    wait_ready(&mut client, "nodes").await;
    wait_ready(&mut client, "blobs").await;
    // One watch per resource, the core's; the edge holds none.
    let watches = etcd.metric("etcd_debugging_mvcc_watcher_total") - watches_before;
    assert_eq!(watches, 3.0, "the core's three resources");
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);

    // A watch on the edge gets exactly the later writes, at etcd's
    // revisions; the same version resumes on the core.
    let rv = list_version(&mut client, "pods", "").await;
    let mut on_edge = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;
    let mut on_core = open_watch(&mut core_client, watch_req("pods", &rv.to_string())).await;
    let mut written = Vec::new();
    for i in 0..10 {
        let r = put_pod(&mut ec, "ns", &format!("p-{i}"), &[("app", "db")], "node-2").await;
        written.push((EventType::Modified, format!("ns/p-{i}"), r));
    }
    written.push((
        EventType::Deleted,
        "ns/p-19".into(),
        delete_key(&mut ec, "/registry/pods/ns/p-19").await,
    ));
    let r = put_pod(&mut ec, "ns", "new", &[], "node-1").await;
    written.push((EventType::Added, "ns/new".into(), r));
    let edge_saw: Vec<_> = take_events(&mut on_edge, 12)
        .await
        .iter()
        .map(summary)
        .collect();
    let core_saw: Vec<_> = take_events(&mut on_core, 12)
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(edge_saw, written);
    assert_eq!(core_saw, written);
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);

    // The field index and selectors work on the edge as on the core.
    let on_node = pb::ListRequest {
        resource: "pods".into(),
        field_selector: "spec.nodeName=node-2".into(),
        ..Default::default()
    };
    let items = client.list(on_node).await.unwrap().into_inner().items;
    assert_eq!(items.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_follows_its_core_through_a_restart() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "before", &[], "node-1").await;
    let (mut core, _) = proxy_ready(&etcd).await;
    let core_addr = core.addr;
    let edge = Proxy::start_config(edge_config(&etcd.client_url, core_addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    let rv = list_version(&mut client, "pods", "").await;
    let mut watch = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;

    core.stop().await;
    let during = put_pod(&mut ec, "ns", "during", &[], "node-1").await;
    let config = Config::from_yaml(&pods_yaml(&etcd.client_url, 64)).unwrap();
    let _core = Proxy::start_on(config, listener_at(core_addr).await).await;
    let after = put_pod(&mut ec, "ns", "after", &[], "node-1").await;

    // The edge's own watchers see every change once, in order, whether
    // the edge resumed its core or listed it again.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(30), watch.message())
            .await
            .expect("an event within 30 s")
            .expect("the watch goes on")
            .expect("not ended");
        if e.r#type != EventType::Bookmark as i32 {
            seen.push(summary(&e));
        }
    }
    assert_eq!(
        seen,
        [
            (EventType::Added, "ns/during".to_string(), during),
            (EventType::Added, "ns/after".to_string(), after),
        ]
    );
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);
}

/// etcd's pods at `revision`: key → value.
async fn pods_at(c: &mut etcd_client::Client, revision: u64) -> BTreeMap<String, String> {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_revision(revision as i64);
    let got = c.get("/registry/pods/", Some(options)).await.unwrap();
    (got.kvs().iter())
        .map(|kv| {
            let key = kv.key_str().unwrap().trim_start_matches("/registry/pods/");
            (key.to_owned(), kv.value_str().unwrap().to_owned())
        })
        .collect()
}

/// A list of the pods exactly at `revision`; later pages carry it in
/// their token instead.
fn exact(revision: u64) -> pb::ListRequest {
    pb::ListRequest {
        resource: "pods".into(),
        resource_version: revision.to_string(),
        resource_version_match: pb::ResourceVersionMatch::Exact.into(),
        ..Default::default()
    }
}

/// An edge that cannot reach etcd at all: the only etcd endpoint it is
/// given has nothing listening.
fn edge_without_etcd(core: std::net::SocketAddr) -> Config {
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unreachable = format!("http://{}", nothing.local_addr().unwrap());
    drop(nothing);
    edge_config(&unreachable, core)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_reads_consistently_and_at_old_versions_through_its_core_alone() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_web_pods(&mut ec, 10).await;
    let old = put_pod(&mut ec, "ns", "p-10", &[], "node-2").await;
    for i in 0..10 {
        put_pod(&mut ec, "ns", &format!("p-{i}"), &[("app", "db")], "node-3").await;
    }
    delete_key(&mut ec, "/registry/pods/ns/p-10").await;
    let (core, _) = proxy_ready(&etcd).await;
    let edge = Proxy::start_config(edge_without_etcd(core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;

    // Consistent: a write etcd acknowledged is in the next read.
    let written = put_pod(&mut ec, "ns", "fresh", &[], "node-1").await;
    let page = client
        .list(pb::ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(page.resource_version.parse::<u64>().unwrap() >= written);
    assert!(page.items.iter().any(|o| o.name == "fresh"));

    // Writes elsewhere move etcd's revision past the idle resource; a
    // consistent read is still answered from the edge's cache, confirmed
    // through the core, not read from the core.
    let mut elsewhere = 0;
    for i in 0..5 {
        let put = ec.put(format!("/elsewhere/{i}"), "x", None).await.unwrap();
        elsewhere = put.header().unwrap().revision() as u64;
    }
    let rv = list_version(&mut client, "pods", "").await;
    assert!(rv >= elsewhere, "{rv} is older than etcd's {elsewhere}");
    let fallbacks = "watchproxy_consistent_read_fallbacks_total";
    assert_eq!(edge.metric(fallbacks, "resource=\"pods\""), 0.0);

    // A version older than the edge's window is read through the core,
    // in pages cut from that version.
    let mut pages = 0;
    let mut seen = BTreeMap::new();
    let mut token = String::new();
    loop {
        let request = match token.is_empty() {
            true => exact(old),
            false => pb::ListRequest {
                resource: "pods".into(),
                continue_token: token.clone(),
                ..Default::default()
            },
        };
        let page = client
            .list(pb::ListRequest {
                limit: 4,
                ..request
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert_eq!(page.resource_version, old.to_string());
        assert!(page.items.len() <= 4);
        for o in page.items {
            seen.insert(
                format!("{}/{}", o.namespace, o.name),
                String::from_utf8_lossy(&o.value).into_owned(),
            );
        }
        if page.continue_token.is_empty() {
            break;
        }
        assert!(!page.continue_token.contains('/'), "an opaque token");
        let left = page
            .remaining_item_count
            .expect("counted without selectors");
        assert_eq!(left as usize, 11 - seen.len());
        token = page.continue_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, pods_at(&mut ec, old).await);

    // With a selector, filtered on the edge.
    let selected = client
        .list(pb::ListRequest {
            resource: "pods".into(),
            label_selector: "app=web".into(),
            ..exact(old)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(selected.items.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_reaches_a_core_that_asks_for_tls_and_a_token() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "node-1").await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca = test_ca("tiers");
    let (cert, key) = test_leaf(&ca, "core", &["localhost"], false);
    let tokens = file("tokens.yaml", "- {token: edge-secret, user: edge}\n");
    let core_config = Config::from_yaml(&format!(
        "{}auth:\n  tokens_file: {}\ntls:\n  cert_file: {}\n  key_file: {}\n",
        pods_yaml(&etcd.client_url, 64),
        tokens.display(),
        file("tls.crt", &cert).display(),
        file("tls.key", &key).display(),
    ))
    .unwrap();
    let core = Proxy::start_config(core_config).await;
    let edge_yaml = |token: &str| {
        format!(
            "upstream: https://localhost:{}\nupstream_tls:\n  ca_file: {}\nupstream_token_file: {}\n{}",
            core.addr.port(),
            file("ca.crt", &ca.pem()).display(),
            file(&format!("{token}.token"), &format!("{token}\n")).display(),
            pods_yaml(&etcd.client_url, 64)
        )
    };

    let edge = Proxy::start_config(Config::from_yaml(&edge_yaml("edge-secret")).unwrap()).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);
    let rv = list_version(&mut client, "pods", "").await;
    assert!(rv >= etcd_revision(&mut ec).await);

    // A token the core does not know: the edge never becomes ready, and
    // says why without the token.
    let refused = Proxy::start_config(Config::from_yaml(&edge_yaml("wrong-secret")).unwrap()).await;
    let mut client = refused.client().await;
    let backing_off = "resource=\"pods\",state=\"backoff\"";
    wait_until("the core refuses the edge's token", || {
        refused.metric("watchproxy_reflector_state", backing_off) == 1.0
    })
    .await;
    let status = client
        .list(pb::ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(!format!("{status:?}").contains("wrong-secret"));
}

async fn etcd_revision(c: &mut etcd_client::Client) -> u64 {
    let got = c.get("/", None).await.unwrap();
    got.header().unwrap().revision() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_on_the_core_reaches_the_edges_watchers_as_a_marked_difference() {
    use EventType::*;
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "keep", &[], "").await;
    put_pod(&mut ec, "ns", "change", &[("v", "1")], "").await;
    put_pod(&mut ec, "ns", "gone", &[], "").await;
    let core = Proxy::start(&forwarder.url).await;
    let edge = Proxy::start_config(edge_without_etcd(core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    let watch = pb::WatchRequest {
        allow_bookmarks: true,
        ..watch_req("pods", "")
    };
    let mut stream = open_watch(&mut client, watch).await;
    assert_eq!(take_events(&mut stream, 3).await.len(), 3);
    let before = list_version(&mut client, "pods", "0").await;

    forwarder.cut();
    let changed = put_pod(&mut ec, "ns", "change", &[("v", "2")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/gone").await;
    let new = put_pod(&mut ec, "ns", "new", &[], "").await;
    let compact_at = put_pod(&mut ec, "ns", "short-lived", &[], "").await;
    let last = delete_key(&mut ec, "/registry/pods/ns/short-lived").await;
    ec.compact(compact_at as i64, None).await.unwrap();
    forwarder.restore();

    // The edge lists its core again and sends the difference, marked,
    // resuming from the version its own lost history starts from, each
    // object at its own version (a deletion at the list's).
    let mut got = Vec::new();
    let mut end = 0;
    for _ in 0..100 {
        if end > 0 {
            break;
        }
        let e = next_event(&mut stream)
            .await
            .unwrap()
            .expect("the stream goes on");
        match (e.r#type == Bookmark as i32, e.resync) {
            (true, false) => continue,
            (true, true) => end = summary(&e).2,
            (false, resync) => {
                assert!(resync, "{e:?} is part of the resync");
                assert_eq!(e.resume_resource_version, before.to_string());
                got.push(summary(&e));
            }
        }
    }
    assert_eq!(
        got,
        [
            (Modified, "ns/change".into(), changed),
            (Deleted, "ns/gone".into(), end),
            (Added, "ns/new".into(), new),
        ]
    );
    assert!(
        end >= last,
        "the resync ends at {end}, not at or after etcd's {last}"
    );
    assert_eq!(
        edge.metric("watchproxy_relists_total", "resource=\"pods\""),
        1.0
    );
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_on_a_new_edge_with_a_version_from_before_it_started() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let (core, mut core_client) = proxy_ready(&etcd).await;
    let first = put_pod(&mut ec, "ns", "p-0", &[], "node-1").await;
    let mut written = Vec::new();
    for i in 1..6 {
        let r = put_pod(&mut ec, "ns", &format!("p-{i}"), &[], "node-1").await;
        written.push((EventType::Added, format!("ns/p-{i}"), r));
    }
    let r = delete_key(&mut ec, "/registry/pods/ns/p-0").await;
    written.push((EventType::Deleted, "ns/p-0".into(), r));
    // The version a client of the core holds.
    assert!(list_version(&mut core_client, "pods", "").await >= r);

    let edge = Proxy::start_config(edge_without_etcd(core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    let mut resumed = open_watch(&mut client, watch_req("pods", &first.to_string())).await;
    let seen: Vec<_> = take_events(&mut resumed, written.len())
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(seen, written);
    assert_eq!(listed(&mut client).await, pod_values(&mut ec).await);
    // Its consistent reads are still confirmed without reading the core.
    list_version(&mut client, "pods", "").await;
    let fallbacks = "watchproxy_consistent_read_fallbacks_total";
    assert_eq!(edge.metric(fallbacks, "resource=\"pods\""), 0.0);
}

/// A consistent List of `pods` on `client` within 10 s: the edge must
/// prove its own cache fresh, as its `freshness_wait` is longer.
async fn consistent_pods(
    client: &mut pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
) -> Result<usize, tonic::Status> {
    let mut request = tonic::Request::new(pb::ListRequest {
        resource: "pods".into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(10));
    Ok(client.list(request).await?.into_inner().items.len())
}

/// An edge whose freshness waits outlast a client's deadline.
fn patient_edge(core: std::net::SocketAddr) -> Config {
    let mut config = edge_without_etcd(core);
    config.watch.freshness_wait = Duration::from_secs(30);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_confirms_reads_of_an_idle_resource_after_a_first_start_and_a_restart() {
    // No progress notifications from etcd: nothing but the proofs moves an
    // idle resource's reads.
    let etcd = Etcd::start_with_default_progress().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "idle", &[], "").await;
    ec.put("/registry/minions/n1", "{}", None).await.unwrap();
    let core = Proxy::start(&forwarder.url).await;
    wait_ready(&mut core.client().await, "pods").await;
    ec.put("/registry/minions/n1", "{\"v\":2}", None)
        .await
        .unwrap();

    // A first start after the data exists.
    let mut edge = Proxy::start_config(patient_edge(core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    for _ in 0..3 {
        assert_eq!(consistent_pods(&mut client).await.unwrap(), 1);
    }
    let fallbacks = "watchproxy_consistent_read_fallbacks_total";
    assert_eq!(edge.metric(fallbacks, "resource=\"pods\""), 0.0);
    // Each consistent read is one RequestProgress to the core.
    let asked = core.metric(
        "watchproxy_call_duration_seconds_count",
        "resource=\"pods\",method=\"RequestProgress\",code=\"Ok\"",
    );
    assert!(
        asked >= 3.0,
        "the core answered {asked} RequestProgress calls"
    );
    edge.stop().await;

    // The core relists with an empty difference (its history was
    // compacted while it was cut off, with nothing changed under the
    // prefix), then an edge starts again.
    forwarder.cut();
    for i in 0..3 {
        ec.put("/registry/minions/n1", format!("{{\"v\":{i}}}"), None)
            .await
            .unwrap();
    }
    compact_all(&mut ec).await;
    forwarder.restore();
    wait_until("the core relists pods", || {
        core.metric("watchproxy_relists_total", "resource=\"pods\"") >= 1.0
    })
    .await;
    let edge = Proxy::start_config(patient_edge(core.addr)).await;
    let mut client = edge.client().await;
    wait_ready(&mut client, "pods").await;
    for _ in 0..3 {
        assert_eq!(consistent_pods(&mut client).await.unwrap(), 1);
    }
    assert_eq!(edge.metric(fallbacks, "resource=\"pods\""), 0.0);
}
