//! A shared initial state is, message for message, the one each joiner
//! would have made alone, however the joiners' reads interleave.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::initial::{InitialCursor, InitialStates};
use crate::cache::WatchCache;
use crate::config::CacheConfig;
use crate::dispatch::{Dispatcher, Inbox, Wants};
use crate::object::{Projection, Resource};
use crate::selector::Predicate;
use crate::telemetry::Metrics;

const SELECTORS: [(&str, &str); 3] = [("", ""), ("app=web", ""), ("", "spec.nodeName=n1")];
const PROJECTIONS: [&[&str]; 3] = [&[], &["metadata"], &["spec.nodeName", "metadata.labels"]];

/// A cache holding one object per `(node, web)`, of varied sizes.
fn cache(objects: &[(u8, bool)]) -> Arc<WatchCache> {
    let r = Arc::new(Resource::for_tests(&["spec.nodeName"]));
    let metrics = Metrics::default().resource("pods");
    let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
    let decoded = objects.iter().enumerate().map(|(i, &(node, web))| {
        let app = if web { "web" } else { "db" };
        let pad = "x".repeat(i * 37 % 400);
        let value = format!(
            r#"{{"metadata":{{"labels":{{"app":"{app}"}}}},"spec":{{"nodeName":"n{node}","pad":"{pad}"}}}}"#
        );
        let key = format!("/p/ns-{}/o{i}", i % 3);
        r.decode(key.as_bytes(), value.as_bytes(), 2 + i as u64)
            .unwrap()
    });
    writer
        .replace(decoded.collect(), 2 + objects.len() as u64)
        .unwrap();
    cache
}

fn wants(r: &Resource, selector: usize, projection: usize) -> Wants {
    let (labels, fields) = SELECTORS[selector];
    let paths: Vec<String> = PROJECTIONS[projection]
        .iter()
        .map(|p| p.to_string())
        .collect();
    Wants {
        predicate: Predicate::new(r, "", "", labels, fields).unwrap(),
        projection: Projection::new(&paths, false).unwrap().map(Arc::new),
    }
}

/// Every message of a cursor, as the bytes sent.
fn drain(cursor: &mut InitialCursor) -> Vec<bytes::Bytes> {
    std::iter::from_fn(|| cursor.next_message(None))
        .map(|m| m.encoded.to_bytes())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]
    #[test]
    fn a_shared_initial_state_is_the_one_each_joiner_makes_alone(
        objects in prop::collection::vec((0u8..3, any::<bool>()), 0..300),
        selector in 0..SELECTORS.len(),
        projection in 0..PROJECTIONS.len(),
        batched in any::<bool>(),
        joiners in 2..5usize,
        turns in prop::collection::vec(0..5usize, 0..2000),
    ) {
        let cache = cache(&objects);
        let r = cache.resource.clone();
        let metrics = Metrics::default().resource("pods");
        let (shared, alone) = (
            InitialStates::new(true, metrics.clone()),
            InitialStates::new(false, metrics),
        );
        let join = |states: &InitialStates| {
            let w = wants(&r, selector, projection);
            let (watcher, state) = states.join(&cache, &Inbox::solo(), w, 0, batched, false).unwrap();
            (watcher, InitialCursor::new(state))
        };
        let (_w, mut own) = join(&alone);
        let want = drain(&mut own);
        let mut cursors: Vec<_> = (0..joiners).map(|_| join(&shared)).collect();
        let mut got = vec![Vec::new(); joiners];
        // The joiners read in turns, in any order, each to its end.
        for turn in turns {
            let j = turn % joiners;
            if let Some(m) = cursors[j].1.next_message(None) {
                got[j].push(m.encoded.to_bytes());
            }
        }
        for (j, (_, cursor)) in cursors.iter_mut().enumerate() {
            got[j].extend(drain(cursor));
            prop_assert_eq!(&got[j], &want, "joiner {}", j);
        }
    }
}

#[test]
fn the_bytes_of_initial_states_are_held_while_read_and_let_go_after() {
    let objects: Vec<(u8, bool)> = (0..600).map(|i| (i as u8 % 3, i % 2 == 0)).collect();
    let cache = cache(&objects);
    let r = cache.resource.clone();
    for share in [true, false] {
        let metrics = Metrics::default().resource("pods");
        let states = InitialStates::new(share, metrics.clone());
        let join = || {
            let w = wants(&r, 0, 0);
            let (watcher, state) = states
                .join(&cache, &Inbox::solo(), w, 0, false, false)
                .unwrap();
            (watcher, InitialCursor::new(state))
        };
        let (mut first, mut second) = (join(), join());
        assert_eq!(metrics.snapshot_bytes.get(), 0, "nothing encoded yet");
        let m = first.1.next_message(Some(super::compression::Codec::Gzip));
        let one = m.unwrap().encoded.size() as i64;
        let held = metrics.snapshot_bytes.get();
        assert!(held >= one, "share {share}: {held} < {one}");
        drain(&mut first.1);
        drain(&mut second.1);
        if share {
            // Kept for any joiner still reading: the whole state.
            assert!(metrics.snapshot_bytes.get() > held);
        } else {
            // Each message let go once read.
            assert_eq!(metrics.snapshot_bytes.get(), 0);
        }
        drop((first, second));
        assert_eq!(metrics.snapshot_bytes.get(), 0, "share {share}");
    }
}
