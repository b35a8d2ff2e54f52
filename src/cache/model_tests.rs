//! What each watcher receives through the trigger index equals, event for
//! event and type for type, a brute-force filter of the whole history.
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::dispatch::{transition, Next, Wants};
use crate::object::{EventType, Projection};
use crate::selector::Shard;
use crate::telemetry::Metrics;
use futures::FutureExt;

const NODES: [&str; 4] = ["node-0", "node-1", "node-2", "node-3"];
const PHASES: [&str; 2] = ["Running", "Pending"];

fn resource() -> Arc<Resource> {
    let mut r = Resource::for_tests(&["spec.nodeName", "status.phase"]);
    r.indexed_fields = vec!["spec.nodeName".into(), "status.phase".into()];
    Arc::new(r)
}

/// A change: which key (of 2 namespaces × 3 names), and the new state
/// (node, phase, app label, tier label) or a deletion.
type Step = (usize, Option<(usize, usize, usize, usize)>);

fn key_of(k: usize) -> (String, String) {
    (format!("ns{}", k % 2), format!("p{}", k / 2))
}

fn object(
    r: &Resource,
    k: usize,
    state: (usize, usize, usize, usize),
    revision: Revision,
) -> Object {
    let (ns, name) = key_of(k);
    let mut labels = serde_json::Map::new();
    labels.insert("app".into(), ["web", "db"][state.2].into());
    if state.3 > 0 {
        labels.insert("tier".into(), ["", "a", "b"][state.3].into());
    }
    let v = serde_json::json!({
        "metadata": {"labels": labels},
        "spec": {"nodeName": NODES[state.0]},
        "status": {"phase": PHASES[state.1]},
    });
    r.decode(
        r.key(&ns, &name).as_bytes(),
        v.to_string().as_bytes(),
        revision,
    )
    .unwrap()
}

/// A watcher: when it joins (after how many transactions), from the
/// state or from how many revisions back, its request, and how many
/// changes it reads after each transaction (it may fall behind).
#[derive(Debug, Clone)]
struct WatcherSpec {
    joins_after: usize,
    replays: Option<u64>,
    namespace: &'static str,
    name: &'static str,
    labels: &'static str,
    fields: String,
    /// What authorization rules narrow the watch to, as the union of
    /// several selectors (none: no narrowing).
    within: Vec<(&'static str, String)>,
    reads: Vec<usize>,
    /// The paths it keeps of each value (none: the whole value).
    projection: Option<&'static [&'static str]>,
    /// The shard it asks for: a shard field, and ranges whose ends are
    /// picked from [`cuts`].
    shard: Option<(&'static str, Vec<(usize, usize)>)>,
}

fn watcher() -> impl Strategy<Value = WatcherSpec> {
    let labels = prop::sample::select(vec![
        "",
        "app=web",
        "app!=web",
        "tier in (a,b)",
        "tier notin (a)",
        "!tier",
        "tier",
    ]);
    let node = prop::option::of(0..NODES.len());
    let phase = prop::option::of((0..PHASES.len(), any::<bool>()));
    let scope = prop::sample::select(vec![("", ""), ("ns0", ""), ("ns1", "p1"), ("", "p0")]);
    let joins = (0..40usize, prop::option::weighted(0.3, 0..8u64));
    let reads = prop::collection::vec(0..4usize, 40);
    let within = prop::collection::vec(
        (
            prop::sample::select(vec!["", "app=web", "tier=a"]),
            prop::option::of(0..NODES.len()),
        ),
        0..3,
    );
    let projection = prop::sample::select(vec![
        None,
        None,
        Some(&["metadata"][..]),
        Some(&["spec.nodeName", "metadata.labels"][..]),
        Some(&["status"][..]),
    ]);
    let shard = prop::option::weighted(
        0.4,
        (
            prop::sample::select(vec!["metadata.name", "spec.nodeName", "metadata.namespace"]),
            prop::collection::vec((0..20usize, 0..20usize), 1..3),
        ),
    );
    (
        (joins, scope, labels, node, phase),
        (reads, within, projection, shard),
    )
        .prop_map(
            |(
                ((joins_after, replays), (namespace, name), labels, node, phase),
                (reads, within, projection, shard),
            )| {
                let mut fields = Vec::new();
                if let Some(n) = node {
                    fields.push(format!("spec.nodeName={}", NODES[n]));
                }
                if let Some((p, eq)) = phase {
                    fields.push(format!(
                        "status.phase{}{}",
                        if eq { "=" } else { "!=" },
                        PHASES[p]
                    ));
                }
                WatcherSpec {
                    joins_after,
                    replays,
                    namespace,
                    name,
                    labels,
                    fields: fields.join(","),
                    within: within
                        .into_iter()
                        .map(|(l, n)| {
                            (
                                l,
                                n.map(|n| format!("spec.nodeName={}", NODES[n]))
                                    .unwrap_or_default(),
                            )
                        })
                        .collect(),
                    reads,
                    projection,
                    shard,
                }
            },
        )
}

/// Where shard ranges of `field` may start and end: at the hashes of the
/// values it takes here and just after them (so a range can hold one
/// value and not another that hashes close by), and at 0.
fn cuts(field: &str) -> Vec<u64> {
    let values: Vec<String> = match field {
        "spec.nodeName" => NODES.iter().map(|n| n.to_string()).collect(),
        "metadata.namespace" => (0..2).map(|k| key_of(k).0).collect(),
        _ => (0..6).map(|k| key_of(k).1).collect(),
    };
    let hashes = values.iter().map(|v| crate::object::shard_hash(v));
    let mut cuts: Vec<u64> = hashes
        .flat_map(|h| [h, h.wrapping_add(1)])
        .chain([0])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

fn step() -> impl Strategy<Value = Step> {
    (
        0..6usize,
        prop::option::weighted(0.8, (0..NODES.len(), 0..PHASES.len(), 0..2usize, 0..3usize)),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn trigger_index_dispatch_equals_brute_force(
        steps in prop::collection::vec((step(), prop::bool::weighted(0.3)), 1..40),
        watchers in prop::collection::vec(watcher(), 1..12),
        queue in 2..6usize,
    ) {
        let r = resource();
        let metrics = Metrics::default().resource("pods");
        // Small queues, so watchers that read slowly fall behind, read
        // the window and rejoin, again and again.
        let d = Dispatcher::new(queue, Duration::from_secs(3600), metrics.clone());
        let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
        writer.replace(vec![], 1).unwrap();

        // Steps on distinct keys may share a revision (a transaction).
        let mut txns: Vec<Vec<Step>> = Vec::new();
        for (step, joins_previous) in steps {
            match txns.last_mut() {
                Some(t) if joins_previous && t.iter().all(|s| s.0 != step.0) => t.push(step),
                _ => txns.push(vec![step]),
            }
        }

        let mut model: BTreeMap<Arc<str>, Arc<Object>> = BTreeMap::new();
        let mut history: Vec<Event> = Vec::new();
        let mut subs = Vec::new();
        let mut states = vec![(1, model.clone())];
        for (i, txn) in txns.iter().enumerate() {
            for w in watchers.iter().filter(|w| w.joins_after == i) {
                let alternatives = w
                    .within
                    .iter()
                    .map(|(l, f)| Predicate::new(&r, "", "", l, f).unwrap())
                    .collect();
                let shard = w.shard.as_ref().map(|(field, ends)| {
                    let cuts = cuts(field);
                    let ranges = ends.iter().map(|&(a, b)| {
                        let (a, b) = (cuts[a % cuts.len()], cuts[b % cuts.len()]);
                        match (a.min(b), a.max(b)) {
                            (lo, hi) if lo == hi => (lo, 0),
                            (lo, hi) => (lo, hi),
                        }
                    });
                    Shard::new(&r, field, ranges).unwrap()
                });
                let p = Predicate::new(&r, w.namespace, w.name, w.labels, &w.fields)
                    .unwrap()
                    .within(alternatives)
                    .in_shard(shard);
                let now = cache.progress().revision;
                let from = match w.replays {
                    Some(back) => WatchFrom::Revision(now.saturating_sub(back).max(1)),
                    None => WatchFrom::State,
                };
                let fields: Vec<String> = w.projection.unwrap_or_default().iter().map(|f| f.to_string()).collect();
                let projection = Projection::new(&fields, false).unwrap().map(Arc::new);
                let wants = Wants { predicate: p.clone(), projection: projection.clone() };
                let watcher = cache.watch(&Inbox::solo(), wants, from, false).unwrap().watcher;
                subs.push((p, watcher.revision(), watcher, &w.reads, Vec::new(), projection));
            }
            let revision = i as Revision + 2;
            let mut changes = Vec::new();
            for (k, state) in txn {
                let (ns, name) = key_of(*k);
                let key: Arc<str> = Arc::from(r.key(&ns, &name));
                let object = state.map(|s| object(&r, *k, s, revision));
                let prev = model.get(&key).cloned();
                match &object {
                    Some(o) => model.insert(key.clone(), Arc::new(o.clone())),
                    None => model.remove(&key),
                };
                history.extend(Event::between(revision, prev, object.clone().map(Arc::new)));
                changes.push(Change { revision, key, object });
            }
            writer.apply(changes).unwrap();
            states.push((revision, model.clone()));
            for (_, _, watcher, reads, got, _) in &mut subs {
                for _ in 0..reads[i] {
                    match watcher.next(&cache).now_or_never() {
                        Some(Next::Event(v)) => got.push((v.kind, (*v.object).clone(), v.revision)),
                        None => break,
                        Some(other) => panic!("{other:?}"),
                    }
                }
            }
        }

        // The state at every past revision is rebuilt exactly.
        for (revision, state) in &states {
            let at = cache.snapshot_at(*revision).unwrap();
            let got: Vec<(&str, &Object)> = at.store.iter().map(|o| (o.key(), &*o.0)).collect();
            let want: Vec<(&str, &Object)> = state.iter().map(|(k, o)| (&**k, &**o)).collect();
            prop_assert_eq!(got, want, "state at {}", revision);
            for (p, ..) in &subs {
                let listed: Vec<&str> = at.select(&r, p, None).map(|o| o.key()).collect();
                let scanned: Vec<&str> = state.values().filter(|o| p.matches(o)).map(|o| o.key()).collect();
                prop_assert_eq!(listed, scanned, "indexed list at {}", revision);
            }
        }

        // Lists read through the indexes equal a scan of the model,
        // whole and from after each key.
        let snapshot = cache.snapshot();
        for (p, ..) in &subs {
            let all: Vec<&str> = model.values().filter(|o| p.matches(o)).map(|o| o.key()).collect();
            let listed: Vec<&str> = snapshot.select(&r, p, None).map(|o| o.key()).collect();
            prop_assert_eq!(&listed, &all, "list {:?}", p);
            for after in model.keys() {
                let rest: Vec<&str> = all.iter().copied().filter(|k| *k > &**after).collect();
                let page: Vec<&str> = snapshot.select(&r, p, Some(after)).map(|o| o.key()).collect();
                prop_assert_eq!(page, rest, "list {:?} after {}", p, after);
            }
        }

        for (p, from, mut watcher, _, mut got, projection) in subs {
            // Shown cut to its projection, as a brute-force cut of each.
            let shown = |o: Arc<Object>| match &projection {
                Some(cut) => (*cut.apply(&o)).clone(),
                None => (*o).clone(),
            };
            let want: Vec<(EventType, Object, Revision)> = history
                .iter()
                .filter(|e| e.revision > from)
                .filter_map(|e| transition(&p, e).map(|(t, o)| (t, shown(o.clone()), e.revision)))
                .collect();
            while let Some(next) = watcher.next(&cache).now_or_never() {
                let Next::Event(v) = next else { panic!("{next:?}") };
                got.push((v.kind, (*v.object).clone(), v.revision));
            }
            prop_assert_eq!(got, want, "watcher {:?}", p);
        }
    }
}
