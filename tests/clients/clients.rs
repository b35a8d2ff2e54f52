//! The clients' informers against a real etcd: the Rust crate's and the
//! Python package's (through its CLI's handlers) follow random writes, a
//! start before the cache is ready, a restart, a resync and a relist, and
//! see each difference once; the Python and Node examples resume across
//! restarts and list again when their version has expired. Each ends with
//! etcd's state.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use watchproxy::config::Config;
use watchproxy_client::{Client, Event, EventStream, Informer, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_informer_resumes_across_restarts_and_relists_when_too_old() {
    informer_follows_etcd(python_informer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_aio_informer_resumes_across_restarts_and_relists_when_too_old() {
    informer_follows_etcd(python_aio_informer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_informer_resumes_across_restarts_and_relists_when_too_old() {
    let seen = informer_follows_etcd(node_informer()).await;
    // It waits as the server's RetryInfo advises (1 s for NOT_READY), not
    // a fixed pause.
    let waited: Vec<serde_json::Value> = seen
        .iter()
        .filter(|l| l.contains("list unavailable"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!waited.is_empty(), "{seen:#?}");
    for w in waited {
        assert_eq!(w["advised_ms"], 1000, "{w}");
        assert!(w["retry_ms"].as_f64().unwrap() >= 1000.0, "{w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_informer_prints_each_change_without_until() {
    let (etcd, proxy, _client) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "before", &[("app", "web")], "").await;
    let mut child = node_informer()
        .args([&proxy.addr.to_string(), "pods", "--selector", "app=web"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines_of = |pipe: Box<dyn std::io::Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        rx
    };
    let rx = lines_of(Box::new(child.stdout.take().unwrap()));
    let log = lines_of(Box::new(child.stderr.take().unwrap()));
    // Changes after its list, which it does not print.
    loop {
        let line = log
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the informer lists");
        if line.contains("\"listed\"") {
            break;
        }
    }
    let added = put_pod(&mut ec, "ns", "after", &[("app", "web")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/before").await;
    let mut printed = Vec::new();
    while printed.len() < 2 {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("printed only {printed:?}"));
        printed.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(printed[0]["type"], "ADDED", "{printed:?}");
    assert_eq!(printed[0]["key"], "/registry/pods/ns/after");
    assert_eq!(printed[0]["resource_version"], added.to_string());
    assert_eq!(printed[1]["type"], "DELETED", "{printed:?}");
    assert_eq!(printed[1]["key"], "/registry/pods/ns/before");
}

/// Runs `informer` (its command and script) through a start before the
/// cache is ready, writes, a restart, and a restart after etcd compacted
/// past its version.
async fn informer_follows_etcd(informer: Command) -> Vec<String> {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", app)], "").await;
    }
    // watchproxy starts cut off from etcd, so the informer's first List
    // finds the cache not ready (UNAVAILABLE at once) and retries.
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let yaml = pods_yaml(&forwarder.url, 64);
    let config = Config::from_yaml(&yaml).unwrap();
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = first.local_addr().unwrap();
    let mut proxy = Proxy::start_on(config.clone(), first).await;

    let mut informer = External::spawn(informer, &addr.to_string(), "app=web", "stop");
    tokio::task::block_in_place(|| informer.wait_for_log("list unavailable", 1));
    forwarder.restore();
    tokio::task::block_in_place(|| informer.wait_for_log("listed", 1));

    // Changes the informer follows: an update, a new object, a deletion,
    // and an object that starts matching the selector.
    put_pod(&mut ec, "ns", "p0", &[("app", "web"), ("v", "2")], "").await;
    put_pod(&mut ec, "ns", "p10", &[("app", "web")], "").await;
    delete_key(&mut ec, "/registry/pods/ns/p2").await;
    put_pod(&mut ec, "ns", "p1", &[("app", "web")], "").await;
    let sent = |proxy: &Proxy| {
        let m = |name| proxy.metric(name, "resource=\"pods\"");
        m("watchproxy_deliveries_total") + m("watchproxy_replayed_events_total")
    };
    wait_until("the four changes are sent to the informer", || {
        sent(&proxy) >= 4.0
    })
    .await;

    // Restart: the informer resumes from its version on the new instance.
    proxy.stop().await;
    put_pod(&mut ec, "ns", "p12", &[("app", "web")], "").await;
    let mut proxy = Proxy::start_on(config.clone(), listener_at(addr).await).await;
    tokio::task::block_in_place(|| informer.wait_for_log("resuming", 1));
    put_pod(&mut ec, "ns", "p14", &[("app", "web")], "").await;
    wait_until("p12 and p14 are sent to the informer", || {
        sent(&proxy) >= 2.0
    })
    .await;

    // Restart after etcd compacted past the informer's version: too old,
    // so it lists again.
    proxy.stop().await;
    delete_key(&mut ec, "/registry/pods/ns/p4").await;
    let now = put_pod(&mut ec, "ns", "p16", &[("app", "web")], "").await;
    ec.compact(now as i64, None).await.unwrap();
    let _proxy = Proxy::start_on(config, listener_at(addr).await).await;
    tokio::task::block_in_place(|| informer.wait_for_log("listed", 2));
    put_pod(&mut ec, "ns", "stop", &[("app", "web")], "").await;

    let (result, seen) = tokio::task::block_in_place(|| informer.finish());
    let got: BTreeMap<String, String> = serde_json::from_value(result["objects"].clone()).unwrap();
    let want = web_pods(&mut ec).await;
    assert_eq!(got, want, "the informer's copy is etcd's state");
    assert!(seen.iter().any(|l| l.contains("too old")), "{seen:#?}");
    assert!(result["resumes"].as_u64().unwrap() >= 2, "{result}");
    assert_eq!(result["lists"], 2, "{result}");
    // Each client decodes the reasons from the statuses' details
    // (grpcio-status; protobufjs on grpc-js' raw trailer).
    for (event, reason) in [
        ("list unavailable", "NOT_READY"),
        ("resuming", "SHUTTING_DOWN"),
        ("too old", "TOO_OLD_RESOURCE_VERSION"),
    ] {
        assert!(
            seen.iter().any(|l| l.contains(event) && l.contains(reason)),
            "{event} with {reason}: {seen:#?}"
        );
    }
    seen
}

/// The Rust informer's copy: key → value.
fn copy_of(store: &Store) -> BTreeMap<String, String> {
    let objects = store.list().into_iter();
    objects
        .map(|o| {
            (
                o.key.clone(),
                String::from_utf8_lossy(&o.value).into_owned(),
            )
        })
        .collect()
}

/// Everything the informer has told its subscriber so far.
fn drain(events: &mut EventStream) -> Vec<Event> {
    let mut got = Vec::new();
    while let Ok(e) = events.as_mut().try_recv() {
        got.push(e);
    }
    got
}

async fn write_randomly(ec: &mut etcd_client::Client, rng: &mut StdRng, n: usize) {
    for _ in 0..n {
        let name = format!("p{}", rng.random_range(0..20));
        if rng.random_bool(0.2) {
            delete_key(ec, &format!("/registry/pods/ns/{name}")).await;
        } else {
            let app = if rng.random_bool(0.6) { "web" } else { "db" };
            let node = format!("node-{}", rng.random_range(0..3));
            put_pod(ec, "ns", &name, &[("app", app)], &node).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_and_python_informers_follow_etcd_and_see_a_resync_or_a_relist_as_its_difference_once(
) {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let mut rng = StdRng::seed_from_u64(25);
    write_randomly(&mut ec, &mut rng, 30).await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let config = Config::from_yaml(&pods_yaml(&forwarder.url, 64)).unwrap();
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = first.local_addr().unwrap();
    let mut proxy = Proxy::start_on(config.clone(), first).await;

    let client = Client::builder(format!("http://{addr}"))
        .connect_lazy()
        .unwrap();
    let mut informer = Informer::new(client, "pods")
        .label_selector("app=web")
        .page_size(7)
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .index("node", |pod| {
            pod.field("spec.nodeName").into_iter().collect()
        });
    let mut events = informer.events(4096);
    let running = informer.start();
    let python = Mirror::start(&addr.to_string(), "app=web");
    // Not ready: the informer retries (NOT_READY) until the cache is.
    let not_ready = "resource=\"pods\",method=\"List\",code=\"Unavailable\"";
    wait_until("the informers' lists are answered NOT_READY", || {
        proxy.metric("watchproxy_call_duration_seconds_count", not_ready) >= 3.0
    })
    .await;
    assert!(!running.has_synced());
    forwarder.restore();
    tokio::time::timeout(Duration::from_secs(20), running.wait_until_synced())
        .await
        .expect("synced")
        .unwrap();
    let store = running.store();
    assert_eq!(copy_of(&store), web_pod_values(&mut ec).await);

    write_randomly(&mut ec, &mut rng, 60).await;
    let want = web_pod_values(&mut ec).await;
    wait_until("the copy follows etcd", || copy_of(&store) == want).await;

    // A restart: the informer resumes, no list.
    proxy.stop().await;
    write_randomly(&mut ec, &mut rng, 10).await;
    let mut proxy = Proxy::start_on(config.clone(), listener_at(addr).await).await;
    write_randomly(&mut ec, &mut rng, 10).await;
    let want = web_pod_values(&mut ec).await;
    wait_until("the copy follows etcd across a restart", || {
        copy_of(&store) == want
    })
    .await;
    assert_eq!(running.stats().lists, 1, "{:?}", running.stats());
    assert!(running.stats().resumes >= 1, "{:?}", running.stats());

    // Two ways the history since the informers' version is lost, each
    // seen by the Rust informer's subscriber and the Python informer's
    // handlers as the difference, each change once, then the marker:
    // - etcd compacts while watchproxy is cut off from it: watchproxy
    //   resyncs the open watches (marked events), no list;
    // - etcd compacts while watchproxy is down: the informers' resume is
    //   too old, and they list again.
    let mut lists = 1;
    for (phase, marker) in [("resync", "resync"), ("relist", "relisted")] {
        let want = web_pod_values(&mut ec).await;
        wait_until("the Python informer follows etcd", || python.copy() == want).await;
        python.take();
        // What came before this phase.
        drain(&mut events);
        let named = |key: &String| key.rsplit('/').next().unwrap().to_owned();
        let mut names = want.keys().map(named);
        let (gone, changed) = (names.next().unwrap(), names.next().unwrap());
        let new = format!("new-{phase}");
        if phase == "resync" {
            forwarder.cut();
        } else {
            proxy.stop().await;
        }
        delete_key(&mut ec, &format!("/registry/pods/ns/{gone}")).await;
        put_pod(
            &mut ec,
            "ns",
            &changed,
            &[("app", "web"), ("v", phase)],
            "node-1",
        )
        .await;
        put_pod(&mut ec, "ns", &new, &[("app", "web")], "node-2").await;
        let now = put_pod(
            &mut ec,
            "ns",
            "unseen",
            &[("app", "db"), ("v", phase)],
            "node-2",
        )
        .await;
        ec.compact(now as i64, None).await.unwrap();
        if phase == "resync" {
            forwarder.restore();
        } else {
            proxy = Proxy::start_on(config.clone(), listener_at(addr).await).await;
            lists += 1;
        }
        let want = web_pod_values(&mut ec).await;
        wait_until("the Rust informer's copy is etcd's", || {
            copy_of(&store) == want
        })
        .await;
        assert_eq!(
            running.stats().lists,
            lists,
            "{phase}: {:?}",
            running.stats()
        );
        let mut expected = vec![
            (String::new(), marker),
            (changed, "modified"),
            (gone, "deleted"),
            (new, "added"),
        ];
        expected.sort();
        // The marker follows the last change, which may reach the store
        // before the marker reaches the subscriber.
        let mut seen = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !seen.iter().any(|e| matches!(e, Event::Relisted { .. }))
            && std::time::Instant::now() < until
        {
            seen.extend(drain(&mut events));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen.extend(drain(&mut events));
        let rust = (seen.into_iter())
            .map(|e| match e {
                Event::Added(o) => (o.name.clone(), "added"),
                Event::Modified { new, .. } => (new.name.clone(), "modified"),
                Event::Deleted(o) => (o.name.clone(), "deleted"),
                Event::Relisted { resync, .. } => {
                    (String::new(), if resync { "resync" } else { "relisted" })
                }
            })
            .collect::<std::collections::BTreeSet<_>>();
        let rust: Vec<_> = rust.into_iter().collect();
        assert_eq!(rust, expected, "{phase}: the Rust informer's subscriber");
        wait_until("the Python informer's marker", || python.saw_marker()).await;
        let mut by_python = python.take();
        by_python.sort();
        assert_eq!(
            by_python, expected,
            "{phase}: the Python informer's handlers"
        );
    }
    let _proxy = proxy;

    // The index follows the objects.
    for node in ["node-0", "node-1", "node-2"] {
        let mut indexed: Vec<String> = store
            .by_index("node", node)
            .iter()
            .map(|o| o.key.clone())
            .collect();
        indexed.sort();
        let filed: Vec<String> = store
            .list()
            .into_iter()
            .filter(|o| o.json().unwrap()["spec"]["nodeName"] == node)
            .map(|o| o.key.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(indexed, filed, "{node}");
    }
    running.stop().await.unwrap();
}

/// etcd with pods p0..p5 in `ns`, the even ones app=web, the odd app=db.
async fn etcd_with_six_pods() -> (Etcd, etcd_client::Client) {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..6 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", app)], "").await;
    }
    (etcd, ec)
}

/// Written by rename, as Kubernetes rotates a projected token.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_informer_resumes_with_its_rotated_token_when_the_old_one_is_revoked() {
    let (etcd, mut ec) = etcd_with_six_pods().await;
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("tokens.yaml");
    replace_file(&served, "- {token: t1, user: reader}\n");
    let presented = dir.path().join("token");
    replace_file(&presented, "t1\n");
    let yaml = pods_yaml(&etcd.client_url, 64)
        + &format!(
            "auth: {{tokens_file: {}, allow_plaintext_tokens: true}}\n",
            served.display()
        );
    let proxy = Proxy::start_config(Config::from_yaml(&yaml).unwrap()).await;
    let addr = proxy.addr.to_string();

    let client = Client::builder(format!("http://{addr}"))
        .token_file(&presented)
        .connect_lazy()
        .unwrap();
    let informer = Informer::new(client, "pods")
        .label_selector("app=web")
        .backoff(Duration::from_millis(50), Duration::from_secs(1));
    let running = informer.start();
    let token = ["--token-file", presented.to_str().unwrap()];
    let mut python = External::spawn_with(python_informer(), &addr, "app=web", "stop", &token);
    let mut aio = External::spawn_with(python_aio_informer(), &addr, "app=web", "stop", &token);
    let mut node = External::spawn_with(node_informer(), &addr, "app=web", "stop", &token);
    tokio::time::timeout(Duration::from_secs(20), running.wait_until_synced())
        .await
        .expect("synced")
        .unwrap();
    tokio::task::block_in_place(|| {
        python.wait_for_log("listed", 1);
        aio.wait_for_log("listed", 1);
        node.wait_for_log("listed", 1);
    });

    // Each informer's watch is open with the old token (a watch opened
    // after the rotation would carry the new one and never end).
    wait_until("the four informers watch", || {
        proxy.metric("watchproxy_watchers", "resource=\"pods\"") == 4.0
    })
    .await;
    // The token rotates: the clients' file first, then the server's.
    replace_file(&presented, "t2\n");
    replace_file(&served, "- {token: t2, user: reader}\n");
    tokio::task::block_in_place(|| {
        python.wait_for_log("CREDENTIAL_REVOKED", 1);
        aio.wait_for_log("CREDENTIAL_REVOKED", 1);
        node.wait_for_log("CREDENTIAL_REVOKED", 1);
    });
    wait_until("the Rust informer resumed", || running.stats().resumes >= 1).await;
    put_pod(&mut ec, "ns", "p0", &[("app", "web"), ("v", "2")], "").await;
    put_pod(&mut ec, "ns", "p1", &[("app", "web")], "").await;
    put_pod(&mut ec, "ns", "stop", &[("app", "web")], "").await;

    let want = web_pods(&mut ec).await;
    for informer in [python, aio, node] {
        let (result, seen) = tokio::task::block_in_place(|| informer.finish());
        let got: BTreeMap<String, String> =
            serde_json::from_value(result["objects"].clone()).unwrap();
        assert_eq!(got, want, "{seen:#?}");
        assert_eq!(result["lists"], 1, "resumed, not listed again: {result}");
    }
    let store = running.store();
    let values = web_pod_values(&mut ec).await;
    wait_until("the Rust informer follows etcd", || {
        copy_of(&store) == values
    })
    .await;
    assert_eq!(running.stats().lists, 1, "{:?}", running.stats());
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"credential_revoked\""
        ),
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_informers_resume_with_a_renewed_client_certificate_when_the_old_one_expires() {
    let (etcd, mut ec) = etcd_with_six_pods().await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        replace_file(&path, text);
        path.to_str().unwrap().to_owned()
    };
    let (server_ca, client_ca) = (test_ca("server-ca"), test_ca("client-ca"));
    let tls = mutual_tls(dir.path(), &server_ca, &client_ca.pem(), "client-ca.crt");
    let proxy = Proxy::start_config(pods_config_and(&etcd.client_url, &tls)).await;
    let target = format!("localhost:{}", proxy.addr.port());

    // A certificate that expires soon, as cert-manager renews them: the
    // files are rewritten in place before it does.
    let now = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.unwrap().as_secs()
    };
    let (short, short_key) = leaf_until(&client_ca, "agent", now() + 6);
    let ca = file("ca.crt", &server_ca.pem());
    let (cert, key) = (file("client.crt", &short), file("client.key", &short_key));
    let options = ["--ca", &ca, "--cert", &cert, "--key", &key];
    let mut python = External::spawn_with(python_informer(), &target, "app=web", "stop", &options);
    let mut aio = External::spawn_with(python_aio_informer(), &target, "app=web", "stop", &options);
    tokio::task::block_in_place(|| {
        python.wait_for_log("listed", 1);
        aio.wait_for_log("listed", 1);
    });
    wait_until("both informers watch", || {
        proxy.metric("watchproxy_watchers", "resource=\"pods\"") == 2.0
    })
    .await;
    let (fresh, fresh_key) = leaf_until(&client_ca, "agent", now() + 600);
    file("client.key", &fresh_key);
    file("client.crt", &fresh);
    tokio::task::block_in_place(|| {
        python.wait_for_log("CREDENTIAL_EXPIRED", 1);
        aio.wait_for_log("CREDENTIAL_EXPIRED", 1);
    });
    put_pod(&mut ec, "ns", "p0", &[("app", "web"), ("v", "2")], "").await;
    put_pod(&mut ec, "ns", "p1", &[("app", "web")], "").await;
    put_pod(&mut ec, "ns", "stop", &[("app", "web")], "").await;

    let want = web_pods(&mut ec).await;
    for informer in [python, aio] {
        let (result, seen) = tokio::task::block_in_place(|| informer.finish());
        let got: BTreeMap<String, String> =
            serde_json::from_value(result["objects"].clone()).unwrap();
        assert_eq!(got, want, "{seen:#?}");
        assert_eq!(result["lists"], 1, "resumed, not listed again: {result}");
        assert!(result["resumes"].as_u64().unwrap() >= 1, "{result}");
    }
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"credential_expired\""
        ),
        2.0
    );
}
