//! Two replicas on one etcd, and informers in Rust and Python that use
//! both: when a replica stops, and each time a connection reaches its
//! maximum age, their watches move to a replica that is there and resume
//! from their version, never listing again, and end with etcd's state.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use tokio_util::sync::CancellationToken;
use watchproxy::config::Config;
use watchproxy_client::{Client, Informer};

/// Writes to web pods every 40 ms until `stop`.
async fn keep_writing(mut ec: etcd_client::Client, stop: CancellationToken) -> usize {
    let mut writes = 0;
    while !stop.is_cancelled() && writes < 1000 {
        let name = format!("p{}", writes % 30);
        if writes % 7 == 3 {
            delete_key(&mut ec, &format!("/registry/pods/ns/{name}")).await;
        } else {
            let v = writes.to_string();
            put_pod(&mut ec, "ns", &name, &[("app", "web"), ("v", &v)], "").await;
        }
        writes += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informers_move_between_replicas_without_listing_again() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..30 {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", "web")], "").await;
    }
    let yaml = pods_yaml(&etcd.client_url, 64).replace(
        "limits:\n",
        "limits:\n  max_connection_age: 6s\n  max_connection_age_grace: 1s\n",
    );
    let config = Config::from_yaml(&yaml).unwrap();
    let mut replicas = [
        Proxy::start_config(config.clone()).await,
        Proxy::start_config(config.clone()).await,
    ];
    let addrs = [replicas[0].addr, replicas[1].addr];

    let client = Client::builder(format!("http://{}", addrs[0]))
        .endpoint(format!("http://{}", addrs[1]))
        .connect_lazy()
        .unwrap();
    let rust = Informer::new(client, "pods")
        .label_selector("app=web")
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .start();
    let target = format!("ipv4:{},{}", addrs[0], addrs[1]);
    let mut python = External::spawn(python_informer(), &target, "app=web", "stop");
    tokio::time::timeout(Duration::from_secs(30), rust.wait_until_synced())
        .await
        .expect("the Rust informer syncs")
        .unwrap();
    tokio::task::block_in_place(|| python.wait_for_log("listed", 1));

    let stop_writing = CancellationToken::new();
    let writer = tokio::spawn(keep_writing(etcd.client().await, stop_writing.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A rolling restart: each replica stops (its watches end with
    // SHUTTING_DOWN and move to the other) and starts again on its
    // address; when the second stops, every watch is on it.
    for i in 0..2 {
        replicas[i].stop().await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        replicas[i] = Proxy::start_on(config.clone(), listener_at(addrs[i]).await).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    // Then the connections reach their maximum age (6 s, 1 s of grace).
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop_writing.cancel();
    let writes = writer.await.unwrap();
    put_pod(&mut ec, "ns", "stop", &[("app", "web")], "").await;

    let want = web_pods(&mut ec).await;
    let (result, seen) = tokio::task::block_in_place(|| python.finish());
    let got: BTreeMap<String, String> = serde_json::from_value(result["objects"].clone()).unwrap();
    assert_eq!(got, want, "the Python informer's copy is etcd's");
    assert_eq!(result["lists"], 1, "{result} {seen:#?}");
    assert!(
        result["resumes"].as_u64().unwrap() >= 2,
        "{result} {seen:#?}"
    );
    for reason in ["SHUTTING_DOWN", "CONNECTION_AGED"] {
        let said = seen
            .iter()
            .any(|l| l.contains("resuming") && l.contains(reason));
        assert!(said, "{reason}: {seen:#?}");
    }

    let store = rust.store();
    let copy = || -> BTreeMap<String, String> {
        let objects = store.list().into_iter();
        objects
            .map(|o| (o.key.clone(), o.resource_version.clone()))
            .collect()
    };
    wait_until("the Rust informer's copy is etcd's", || copy() == want).await;
    let stats = rust.stats();
    assert_eq!(stats.lists, 1, "{stats:?}");
    assert!(stats.resumes >= 2, "{stats:?}");
    assert!(writes > 100, "{writes} writes");
    rust.stop().await.unwrap();
}
