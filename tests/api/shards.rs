//! Sharded List and Watch through the proto: N shard selectors whose
//! ranges tile the hash space split a resource N ways, list and watch,
//! every event reaching exactly one of them and encoded once however many
//! shards there are; a shard on a changing field sees objects move in and
//! out; bad shards are refused naming the field.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;
use tonic_types::StatusExt;
use watchproxy::object::shard_hash;
use watchproxy::pb::{self, EventType, HashRange, ListRequest, ShardSelector};

fn pod_with_uid(ns: &str, name: &str, uid: &str) -> String {
    serde_json::json!({
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": "node-1"},
    })
    .to_string()
}

fn shard(field: &str, ranges: &[(u64, u64)]) -> ShardSelector {
    ShardSelector {
        field: field.into(),
        ranges: ranges
            .iter()
            .map(|&(start, end)| HashRange { start, end })
            .collect(),
    }
}

/// `watchers` shards that tile the hash space at random: the space is cut
/// at random points and each piece given to a random shard, so a shard
/// holds several ranges, some of them touching.
fn random_tiling(rng: &mut StdRng, watchers: usize, pieces: usize) -> Vec<Vec<(u64, u64)>> {
    let mut cuts: Vec<u64> = (1..pieces).map(|_| rng.random()).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let starts = std::iter::once(0).chain(cuts.iter().copied());
    let ends = cuts.iter().copied().chain([0]);
    let mut shards = vec![Vec::new(); watchers];
    for (i, range) in starts.zip(ends).enumerate() {
        // The first pieces go one to each shard, so none is empty.
        let to = if i < watchers {
            i
        } else {
            rng.random_range(0..watchers)
        };
        shards[to].push(range);
    }
    shards
}

type Seen = (String, u64, i32);

fn seen(e: &pb::WatchEvent) -> Seen {
    let o = e.object.as_ref().unwrap();
    (o.key.clone(), o.resource_version.parse().unwrap(), e.r#type)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_that_tile_the_hash_space_list_and_watch_each_object_once() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut rng = StdRng::seed_from_u64(5866);
    // Live objects by key, with their uid.
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    let mut generation = 0;
    for i in 0..60 {
        let (ns, name) = (format!("ns-{}", i % 3), format!("pod-{i}"));
        let uid = format!("uid-{i}-{generation}");
        let key = format!("/registry/pods/{ns}/{name}");
        ec.put(key.clone(), pod_with_uid(&ns, &name, &uid), None)
            .await
            .unwrap();
        live.insert(key, uid);
    }
    let from = list_version(&mut client, "pods", "").await;

    let fields = ["metadata.uid", "metadata.name", "metadata.namespace"];
    let mut streams = Vec::new();
    for field in fields {
        let tiling = random_tiling(&mut rng, 5, 12);
        let mut listed: Vec<String> = Vec::new();
        for ranges in &tiling {
            let list = client
                .list(ListRequest {
                    resource: "pods".into(),
                    resource_version: from.to_string(),
                    shard: Some(shard(field, ranges)),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            // The list names its shard: the ranges sorted, touching ones joined.
            let covered = list.shard.expect("the list names its shard");
            assert_eq!(covered.field, field);
            let mut want = ranges.clone();
            want.sort_unstable();
            let mut joined: Vec<(u64, u64)> = Vec::new();
            for (start, end) in want {
                match joined.last_mut() {
                    Some(last) if last.1 == start => last.1 = end,
                    _ => joined.push((start, end)),
                }
            }
            let got: Vec<(u64, u64)> = covered.ranges.iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, joined, "{field}");
            listed.extend(list.items.into_iter().map(|o| o.key));
            let req = pb::WatchRequest {
                shard: Some(shard(field, ranges)),
                ..watch_req("pods", &from.to_string())
            };
            streams.push(open_watch(&mut client, req).await);
        }
        listed.sort();
        let all: Vec<&String> = live.keys().collect();
        assert_eq!(listed.iter().collect::<Vec<_>>(), all, "{field}: lists");
    }
    let encodings = proxy.metric("watchproxy_encodings_total", "resource=\"pods\"");

    // Updates keep an object's uid; a re-creation gets a new one.
    let mut want: Vec<Seen> = Vec::new();
    for _ in 0..90 {
        let i = rng.random_range(0..70);
        let (ns, name) = (format!("ns-{}", i % 3), format!("pod-{i}"));
        let key = format!("/registry/pods/{ns}/{name}");
        let (kind, revision) = match (live.get(&key).cloned(), rng.random_bool(0.25)) {
            (Some(_), true) => {
                live.remove(&key);
                (EventType::Deleted, delete_key(&mut ec, &key).await)
            }
            (uid, _) => {
                generation += 1;
                let kind = match uid {
                    Some(_) => EventType::Modified,
                    None => EventType::Added,
                };
                let uid = uid.unwrap_or(format!("uid-{i}-{generation}"));
                let value = pod_with_uid(&ns, &name, &uid);
                let put = ec.put(key.clone(), value, None).await.unwrap();
                live.insert(key.clone(), uid);
                (kind, put.header().unwrap().revision() as u64)
            }
        };
        want.push((key, revision, kind as i32));
    }

    // Each tiling delivers every event once between its shards.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for (i, mut stream) in streams.into_iter().enumerate() {
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            while let Ok(Some(e)) = stream.message().await {
                if e.r#type != EventType::Bookmark as i32 && tx.send((i / 5, seen(&e))).is_err() {
                    return;
                }
            }
        }));
    }
    let mut got: Vec<Vec<Seen>> = vec![Vec::new(); fields.len()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.iter().map(Vec::len).sum::<usize>() < want.len() * fields.len() {
        let (tiling, e) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("every event within 20 s")
            .unwrap();
        got[tiling].push(e);
    }
    // Nothing more arrives: no event went to two shards.
    let extra = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
    assert!(extra.is_err(), "an event beyond the writes: {extra:?}");
    want.sort();
    for (field, mut got) in fields.iter().zip(got) {
        got.sort();
        assert_eq!(got, want, "{field}");
    }
    // One encoding per event, for all fifteen shard watchers.
    let encodings = proxy.metric("watchproxy_encodings_total", "resource=\"pods\"") - encodings;
    assert_eq!(encodings, want.len() as f64);
    readers.iter().for_each(|r| r.abort());
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_on_a_changing_field_sees_objects_move_and_bad_shards_are_refused() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "node-1").await;
    let from = list_version(&mut client, "pods", "").await.to_string();
    let only = |node: &str| {
        let h = shard_hash(node);
        shard("spec.nodeName", &[(h, h.wrapping_add(1))])
    };
    let watch = |node: &str| pb::WatchRequest {
        shard: Some(only(node)),
        send_initial_events: true,
        ..watch_req("pods", "")
    };
    let mut one = open_watch(&mut client, watch("node-1")).await;
    let mut two = open_watch(&mut client, watch("node-2")).await;
    let first = take_events(&mut one, 1).await;
    assert_eq!(summary(&first[0]).1, "ns/a");
    put_pod(&mut ec, "ns", "a", &[], "node-2").await;
    let left = take_events(&mut one, 1).await;
    let joined = take_events(&mut two, 1).await;
    assert_eq!(summary(&left[0]).0, EventType::Deleted);
    assert_eq!(summary(&joined[0]).0, EventType::Added);
    assert!(summary(&joined[0]).2 > from.parse().unwrap());

    let bad = [
        shard("spec.color", &[(0, 0)]),
        shard("metadata.name", &[]),
        shard("metadata.name", &[(9, 9)]),
        shard("metadata.name", &[(9, 3)]),
    ];
    for selector in bad {
        let status = client
            .list(ListRequest {
                resource: "pods".into(),
                shard: Some(selector.clone()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        let watch = client
            .watch(pb::WatchRequest {
                shard: Some(selector.clone()),
                ..watch_req("pods", "")
            })
            .await;
        let watch_status = match watch {
            Ok(stream) => stream.into_inner().message().await.unwrap_err(),
            Err(status) => status,
        };
        for status in [status, watch_status] {
            assert_eq!(status.code(), Code::InvalidArgument, "{selector:?}");
            let fields: Vec<String> = (status.get_details_bad_request().unwrap())
                .field_violations
                .into_iter()
                .map(|v| v.field)
                .collect();
            assert_eq!(fields, ["shard"], "{selector:?}: {}", status.message());
        }
    }
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_and_a_python_informer_split_a_resource_between_their_shards() {
    let (etcd, proxy, _client) = start_ready().await;
    let mut ec = etcd.client().await;
    let put = |i: usize, generation: usize| {
        let (ns, name) = (format!("ns-{}", i % 2), format!("pod-{i}"));
        let key = format!("/registry/pods/{ns}/{name}");
        (
            key,
            pod_with_uid(&ns, &name, &format!("uid-{i}-{generation}")),
        )
    };
    for i in 0..40 {
        let (key, value) = put(i, 0);
        ec.put(key, value, None).await.unwrap();
    }
    let half = 1u64 << 63;
    let client = watchproxy_client::Client::builder(format!("http://{}", proxy.addr))
        .connect_lazy()
        .unwrap();
    let lower = watchproxy_client::Informer::new(client, "pods")
        .shard("metadata.uid", [(0, half)])
        .start();
    let upper = Mirror::start_with(
        &proxy.addr.to_string(),
        &["--shard", &format!("metadata.uid:{half}-0")],
    );
    lower.wait_until_synced().await.unwrap();
    // Changes after both listed: updates, deletions, re-creations with a
    // new uid (which may move a pod from one informer to the other).
    for i in 0..30 {
        match i % 3 {
            0 => {
                let (key, value) = put(i, 0);
                ec.put(key, value.replace("node-1", "node-2"), None)
                    .await
                    .unwrap();
            }
            1 => {
                delete_key(&mut ec, &put(i, 0).0).await;
            }
            _ => {
                let (key, value) = put(i, 1);
                ec.put(key, value, None).await.unwrap();
            }
        }
    }
    let want = pod_values(&mut ec).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mine: BTreeMap<String, String> = (lower.store().list().into_iter())
            .map(|o| {
                (
                    o.key.clone(),
                    String::from_utf8_lossy(&o.value).into_owned(),
                )
            })
            .collect();
        let theirs = upper.copy();
        let disjoint = mine.keys().all(|k| !theirs.contains_key(k));
        let mut both = mine.clone();
        both.extend(theirs.clone());
        if disjoint && both == want {
            assert!(
                !mine.is_empty() && !theirs.is_empty(),
                "each shard holds some pods"
            );
            break;
        }
        let (m, t, w) = (mine.len(), theirs.len(), want.len());
        assert!(
            tokio::time::Instant::now() < deadline,
            "the informers did not converge: {m} + {t} of {w}, disjoint: {disjoint}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(proxy);
}
