//! Memory cost of snapshots: 100,000 objects of about 1 KiB, then writes
//! at a steady rate while the cache keeps (or does not keep) snapshots at
//! earlier revisions, as paged lists and exact reads do.
//!
//! `cargo run --release -p watchproxy-bench --bin snapshot-memory`

use std::sync::Arc;
use std::time::Duration;

use watchproxy::cache::{Change, WatchCache};
use watchproxy::config::CacheConfig;
use watchproxy::dispatch::Dispatcher;
use watchproxy::object::{Object, Resource};
use watchproxy::telemetry::Metrics;

const OBJECTS: usize = 100_000;
const WRITES: usize = 20_000;

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn pod(r: &Resource, i: usize, generation: usize, revision: u64) -> Object {
    let pad = "x".repeat(800);
    let v = format!(
        r#"{{"metadata":{{"labels":{{"app":"web","gen":"{generation}"}}}},"spec":{{"nodeName":"node-{}"}},"pad":"{pad}"}}"#,
        i % 1000
    );
    r.decode(
        format!("/registry/pods/ns-{}/pod-{i}", i % 100).as_bytes(),
        v.as_bytes(),
        revision,
    )
    .unwrap()
}

fn run(keep_snapshots: bool) -> (f64, f64) {
    let node = ["spec.nodeName"];
    let r = Arc::new(Resource::namespaced_json(
        "pods",
        "/registry/pods",
        &node,
        &node,
    ));
    let m = Metrics::default().resource("pods");
    let config = CacheConfig {
        min_events: 1024,
        max_events: 100 * 1024,
        freshness: Duration::from_secs(75),
        ..CacheConfig::default()
    };
    let (cache, mut writer) = WatchCache::new(
        r.clone(),
        &config,
        Dispatcher::new(64, Duration::from_secs(60), m.clone()),
        m,
    );
    writer
        .replace((0..OBJECTS).map(|i| pod(&r, i, 0, 2)).collect(), 2)
        .unwrap();
    let base = rss_mib();
    for w in 0..WRITES {
        let rev = 3 + w as u64;
        let o = pod(&r, (w * 7919) % OBJECTS, 1, rev);
        writer.apply(vec![Change::put(o)]).unwrap();
        // A paged list every 2,500 writes pins the state it started at.
        if keep_snapshots && w % 2_500 == 0 {
            cache.remember(cache.snapshot());
        }
    }
    (base, rss_mib())
}

/// Each variant runs in a process of its own, so that memory one frees
/// does not hide what the other takes.
fn main() {
    if let Some(variant) = std::env::args().nth(1) {
        let (base, end) = run(variant == "with");
        println!("{base:.1} {end:.1}");
        return;
    }
    let measure = |variant: &str| -> (f64, f64) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .arg(variant)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut it = text.split_whitespace().map(|x| x.parse::<f64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    let (base, without) = measure("without");
    let (base_with, with) = measure("with");
    println!("{OBJECTS} objects of about 1 KiB: {base:.0} MiB RSS after loading");
    println!("then {WRITES} writes (the window keeps every event and the objects it references):");
    println!(
        "  no snapshots kept:                   +{:.0} MiB",
        without - base
    );
    println!(
        "  8 snapshots kept at spaced revisions: +{:.0} MiB",
        with - base_with
    );
    println!(
        "  cost of the snapshots:                {:.0} MiB",
        (with - base_with) - (without - base)
    );
}
