//! Cost of server-side filtering: dispatch per event as watchers grow, and
//! List with an indexed field selector against a full scan.
//!
//! `cargo bench --bench filtering`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use watchproxy::cache::{Change, WatchCache};
use watchproxy::config::CacheConfig;
use watchproxy::dispatch::{Dispatcher, Inbox, Trigger};
use watchproxy::object::{Event, Object, Resource};
use watchproxy::selector::Predicate;
use watchproxy::telemetry::Metrics;

fn resource(indexed: bool) -> Resource {
    let indexed: &[&str] = if indexed { &["spec.nodeName"] } else { &[] };
    Resource::namespaced_json("pods", "/registry/pods", &["spec.nodeName"], indexed)
}

fn pod(r: &Resource, i: usize, node: usize, revision: u64) -> Object {
    let v = format!(
        r#"{{"metadata":{{"labels":{{"app":"web","i":"{i}"}}}},"spec":{{"nodeName":"node-{node}","containers":[{{"name":"c","image":"registry.example/app:1"}}]}}}}"#
    );
    r.decode(
        format!("/registry/pods/ns-{}/pod-{i}", i % 10).as_bytes(),
        v.as_bytes(),
        revision,
    )
    .unwrap()
}

/// Each watcher pins its own node; each event modifies a pod on one node,
/// so exactly one watcher is interested. Events go either to every node in
/// turn (each delivery finds its watcher cold in the CPU caches, as in a
/// large cluster) or always to one node (the watcher stays warm).
fn dispatch(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_per_event");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for watchers in [100usize, 1_000, 10_000] {
        for indexed in [true, false] {
            let r = resource(indexed);
            let d = Arc::new(Dispatcher::new(
                64,
                Duration::from_secs(3600),
                Metrics::default().resource("pods"),
            ));
            let subs: Vec<_> = (0..watchers)
                .map(|n| {
                    let p =
                        Predicate::new(&r, "", "", "", &format!("spec.nodeName=node-{n}")).unwrap();
                    let trigger = match indexed {
                        true => Trigger::Field {
                            field: 0,
                            value: format!("node-{n}"),
                        },
                        false => Trigger::All,
                    };
                    d.register(&Inbox::solo(), p, trigger, 0, false, false)
                })
                .collect();
            let events: Vec<Arc<Event>> = (0..watchers)
                .map(|n| {
                    let (before, after) = (pod(&r, n, n, 1), pod(&r, n, n, 2));
                    Arc::new(Event::modified(2, Arc::new(after), Arc::new(before)))
                })
                .collect();
            let name = if indexed { "indexed" } else { "unindexed" };
            // Every event for one node: the interested watcher stays in
            // the CPU caches, so this is the cost of passing the others by.
            group.bench_with_input(
                BenchmarkId::new(format!("{name}_one_node"), watchers),
                &watchers,
                |b, _| {
                    b.iter(|| {
                        d.dispatch(std::slice::from_ref(&events[7]));
                        black_box(
                            subs[7]
                                .mailbox
                                .try_recv()
                                .expect("the interested watcher got it"),
                        );
                    });
                },
            );
            // In service an event has just been decoded, so it is in cache
            // while the watchers are not: each iteration reads its event
            // first, then times only the dispatch.
            group.bench_with_input(BenchmarkId::new(name, watchers), &watchers, |b, _| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for i in 0..iters as usize {
                        let n = i % watchers;
                        let e = &events[n];
                        black_box((
                            e.key().len(),
                            e.object().unwrap().fields().get(0),
                            e.prev().unwrap().fields().get(0),
                        ));
                        let t = Instant::now();
                        d.dispatch(std::slice::from_ref(e));
                        spent += t.elapsed();
                        black_box(
                            subs[n]
                                .mailbox
                                .try_recv()
                                .expect("the interested watcher got it"),
                        );
                    }
                    spent
                });
            });
        }
    }
    group.finish();
}

/// 100,000 pods over 1,000 nodes; list the 100 pods of one node.
fn list(c: &mut Criterion) {
    let mut group = c.benchmark_group("list_100k_by_node");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for indexed in [true, false] {
        let r = Arc::new(resource(indexed));
        let m = Metrics::default().resource("pods");
        let d = Dispatcher::new(64, Duration::from_secs(3600), m.clone());
        let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, m);
        writer.replace(vec![], 1).unwrap();
        let changes: Vec<Change> = (0..100_000)
            .map(|i| {
                let o = pod(&r, i, i % 1000, 2);
                Change::put(o)
            })
            .collect();
        writer.apply(changes).unwrap();
        let snapshot = cache.snapshot();
        let p = Predicate::new(&r, "", "", "", "spec.nodeName=node-7").unwrap();
        assert_eq!(snapshot.select(&r, &p, None).count(), 100);
        let name = if indexed { "indexed" } else { "full_scan" };
        group.bench_function(name, |b| {
            b.iter(|| black_box(snapshot.select(&r, &p, None).count()))
        });
    }
    group.finish();
}

criterion_group!(benches, dispatch, list);
criterion_main!(benches);
