//! Projection through the proto: `fields` and `metadata_only` cut what
//! List, Get and Watch send (initial state, live changes, replays), while
//! selectors still see whole objects; a projected stream is the full
//! stream with the mask applied; each distinct projection of an event is
//! encoded once for all its watchers.

use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tonic::Code;
use watchproxy::pb::{self, EventType, GetRequest, ListRequest, WatchRequest};

fn value(o: &pb::Object) -> Value {
    serde_json::from_slice(&o.value).unwrap()
}

/// `full` with only `paths` kept, as the client expects it.
fn masked(full: &Value, paths: &[&str]) -> Value {
    let mut out = json!({});
    for path in paths {
        let steps: Vec<&str> = path.split('.').collect();
        let mut found = Some(full);
        for step in &steps {
            found = found.and_then(|v| v.as_object()).and_then(|m| m.get(*step));
        }
        let Some(found) = found else { continue };
        let mut slot = &mut out;
        for step in &steps[..steps.len() - 1] {
            slot = slot
                .as_object_mut()
                .unwrap()
                .entry(*step)
                .or_insert(json!({}));
        }
        slot[*steps.last().unwrap()] = found.clone();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_and_watch_send_only_the_paths_asked_for() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[("app", "web")], "node-1").await;
    put_pod(&mut ec, "ns", "b", &[("app", "db")], "node-2").await;
    let from = list_version(&mut client, "pods", "").await;

    let fields = vec!["spec.nodeName".to_owned(), "metadata.name".to_owned()];
    let list = client
        .list(ListRequest {
            resource: "pods".into(),
            // Selectors see the whole object.
            label_selector: "app=web".into(),
            fields: fields.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        value(&list.items[0]),
        json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-1"}})
    );
    assert_eq!(list.items[0].labels["app"], "web", "labels stay");

    let got = client
        .get(GetRequest {
            resource: "pods".into(),
            namespace: "ns".into(),
            name: "b".into(),
            metadata_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        value(&got).as_object().unwrap().keys().collect::<Vec<_>>(),
        ["metadata"]
    );

    // Initial state, a live change, a change that stops matching (DELETED
    // with its previous state), all cut; a replay from a version too.
    let watch = |rv: &str, initial: bool| WatchRequest {
        resource: "pods".into(),
        field_selector: "spec.nodeName=node-1".into(),
        resource_version: rv.into(),
        send_initial_events: initial,
        metadata_only: true,
        ..Default::default()
    };
    let mut live = open_watch(&mut client, watch("", true)).await;
    let mut replayed = open_watch(&mut client, watch(&from.to_string(), false)).await;
    let initial = take_events(&mut live, 1).await;
    assert_eq!(
        value(initial[0].object.as_ref().unwrap())
            .as_object()
            .unwrap()
            .len(),
        1
    );
    put_pod(&mut ec, "ns", "a", &[("app", "web"), ("v", "2")], "node-1").await;
    put_pod(&mut ec, "ns", "a", &[("app", "web")], "node-9").await;
    for stream in [&mut live, &mut replayed] {
        let events = take_events(stream, 2).await;
        let kinds: Vec<i32> = events.iter().map(|e| e.r#type).collect();
        assert_eq!(
            kinds,
            [EventType::Modified as i32, EventType::Deleted as i32]
        );
        for e in &events {
            let v = value(e.object.as_ref().unwrap());
            assert_eq!(
                v.as_object().unwrap().keys().collect::<Vec<_>>(),
                ["metadata"],
                "{v}"
            );
        }
    }

    let bad = client
        .list(ListRequest {
            resource: "pods".into(),
            fields: vec!["spec..x".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let raw = client
        .list(ListRequest {
            resource: "blobs".into(),
            metadata_only: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(raw.code(), Code::InvalidArgument, "{raw:?}");
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projected_stream_is_the_full_stream_masked_and_each_projection_is_encoded_once() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let from = list_version(&mut client, "pods", "").await.to_string();
    let masks: [&[&str]; 3] = [
        &["metadata"],
        &["spec.nodeName", "metadata.labels"],
        &["status"],
    ];
    let request = |paths: &[&str]| WatchRequest {
        fields: paths.iter().map(|p| p.to_string()).collect(),
        ..watch_req("pods", &from)
    };
    let mut full = open_watch(&mut client, watch_req("pods", &from)).await;
    let mut streams = Vec::new();
    for mask in masks {
        // Two watchers of each projection.
        streams.push((mask, open_watch(&mut client, request(mask)).await));
        streams.push((mask, open_watch(&mut client, request(mask)).await));
    }
    let before = proxy.metric("watchproxy_encodings_total", "resource=\"pods\"");
    let mut rng = StdRng::seed_from_u64(26);
    let writes = 40;
    for _ in 0..writes {
        let name = format!("p{}", rng.random_range(0..8));
        let node = format!("node-{}", rng.random_range(0..3));
        put_pod(&mut ec, "ns", &name, &[("app", "web")], &node).await;
    }
    let whole = take_events(&mut full, writes).await;
    for (mask, stream) in &mut streams {
        let cut = take_events(stream, writes).await;
        for (w, c) in whole.iter().zip(&cut) {
            let (w, c) = (w.object.as_ref().unwrap(), c.object.as_ref().unwrap());
            assert_eq!((&w.key, &w.resource_version), (&c.key, &c.resource_version));
            assert_eq!(value(c), masked(&value(w), mask), "{mask:?}");
        }
    }
    // Every write is one type for every watcher here: one encoding for the
    // full watcher and one per distinct projection, not one per watcher.
    let encodings = proxy.metric("watchproxy_encodings_total", "resource=\"pods\"") - before;
    assert_eq!(encodings, (writes * (1 + masks.len())) as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_and_python_informers_keep_only_the_paths_asked_for() {
    let (etcd, proxy, _client) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[("app", "web")], "node-1").await;
    let client = watchproxy_client::Client::builder(format!("http://{}", proxy.addr))
        .connect_lazy()
        .unwrap();
    let informer = watchproxy_client::Informer::new(client, "pods")
        .fields(["spec.nodeName"])
        .index("node", |pod| {
            pod.field("spec.nodeName").into_iter().collect()
        })
        .start();
    informer.wait_until_synced().await.unwrap();
    put_pod(&mut ec, "ns", "b", &[("app", "web")], "node-1").await;
    let store = informer.store();
    wait_until("b arrives", || store.by_index("node", "node-1").len() == 2).await;
    for pod in store.list() {
        assert_eq!(pod.json().unwrap(), json!({"spec": {"nodeName": "node-1"}}));
    }

    let script = format!(
        r#"
import json
from watchproxy import Client, Informer
inf = Informer(Client("{}"), "pods", metadata_only=True)
inf.start(); assert inf.wait_synced(timeout=30)
print(json.dumps(sorted(list(o.json) for o in inf.store.list())))
inf.stop()
"#,
        proxy.addr
    );
    let out = python3()
        .args(["-c", &script])
        .output()
        .expect("python3 with the package's requirements: run ./scripts/install-deps.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys, json!([["metadata"], ["metadata"]]));
    // And its command line.
    let out = python3()
        .args([
            "-m",
            "watchproxy",
            &proxy.addr.to_string(),
            "get",
            "pods",
            "ns",
            "a",
        ])
        .args(["--fields", "spec.nodeName,metadata.name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cut: Value = serde_json::from_str(printed["value"].as_str().unwrap()).unwrap();
    assert_eq!(
        cut,
        json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-1"}})
    );
    informer.stop().await.unwrap();
}
