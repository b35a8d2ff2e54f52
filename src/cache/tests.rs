//! The cache's own unit tests.

use super::*;
use crate::config::ValueFormat;
use crate::dispatch::Next;
use crate::object::EventType;
use crate::telemetry::Metrics;
use futures::FutureExt;

fn resource() -> Arc<Resource> {
    Arc::new(Resource {
        format: ValueFormat::Raw,
        ..Resource::for_tests(&[])
    })
}

fn obj(key: &str, revision: Revision) -> Object {
    let r = resource();
    r.decode(key.as_bytes(), revision.to_string().as_bytes(), revision)
        .unwrap()
}

fn new_cache() -> (Arc<WatchCache>, CacheWriter) {
    let metrics = Metrics::default().resource("pods");
    let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    WatchCache::new(resource(), &CacheConfig::default(), d, metrics)
}

/// Everything a watcher has to show now, live or from the window.
fn shown(cache: &WatchCache, w: &mut Watcher) -> Vec<(EventType, String, Revision)> {
    let mut out = Vec::new();
    while let Some(next) = w.next(cache).now_or_never() {
        match next {
            Next::Event(v) => out.push((v.kind, v.object.key.to_string(), v.revision)),
            other => panic!("{other:?}"),
        }
    }
    out
}

#[test]
fn a_relist_turns_the_difference_into_events() {
    let (cache, mut w) = new_cache();
    w.replace(
        vec![
            obj("/p/a/keep", 2),
            obj("/p/a/change", 3),
            obj("/p/a/gone", 4),
        ],
        10,
    );
    let mut live = cache
        .watch(
            &Inbox::solo(),
            Predicate::default(),
            WatchFrom::State,
            false,
        )
        .unwrap()
        .watcher;
    w.replace(
        vec![
            obj("/p/a/keep", 2),
            obj("/p/a/change", 15),
            obj("/p/a/new", 12),
        ],
        20,
    );
    assert_eq!(
        shown(&cache, &mut live),
        [
            (EventType::Added, "/p/a/new".into(), 12),
            (EventType::Modified, "/p/a/change".into(), 15),
            (EventType::Deleted, "/p/a/gone".into(), 20),
        ]
    );
    // The same events are in the window for watchers that resume later.
    let mut start = cache
        .watch(
            &Inbox::solo(),
            Predicate::default(),
            WatchFrom::Revision(12),
            false,
        )
        .unwrap();
    assert!(start.state.is_none());
    let replay: Vec<Revision> = shown(&cache, &mut start.watcher)
        .iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(replay, [15, 20]);
    assert_eq!(
        cache.progress(),
        Progress {
            revision: 20,
            valid_through: 20,
            ready: true
        }
    );
}

#[test]
fn deleting_an_unknown_key_emits_nothing_but_advances_the_revision() {
    let (cache, mut w) = new_cache();
    w.replace(vec![], 5);
    let mut watcher = cache
        .watch(
            &Inbox::solo(),
            Predicate::default(),
            WatchFrom::State,
            false,
        )
        .unwrap()
        .watcher;
    w.apply(vec![Change {
        revision: 6,
        key: Arc::from("/p/a/x"),
        object: None,
    }]);
    assert!(shown(&cache, &mut watcher).is_empty());
    assert_eq!(cache.progress().revision, 6);
}

#[test]
fn select_reads_only_the_pinned_range() {
    let (cache, mut w) = new_cache();
    w.replace(
        vec![
            obj("/p/a/x", 2),
            obj("/p/b/x", 3),
            obj("/p/b/y", 4),
            obj("/p/c/x", 5),
        ],
        5,
    );
    let snap = cache.snapshot();
    let r = resource();
    let keys = |p: &Predicate, after: Option<&str>| {
        snap.select(&r, p, after)
            .map(|o| o.key.to_string())
            .collect::<Vec<_>>()
    };
    let ns_b = Predicate::new(&r, "b", "", "", "").unwrap();
    assert_eq!(keys(&ns_b, None), ["/p/b/x", "/p/b/y"]);
    assert_eq!(keys(&ns_b, Some("/p/b/x")), ["/p/b/y"]);
    let one = Predicate::new(&r, "b", "y", "", "").unwrap();
    assert_eq!(keys(&one, None), ["/p/b/y"]);
    assert_eq!(keys(&one, Some("/p/b/y")), Vec::<String>::new());
    assert_eq!(keys(&Predicate::default(), Some("/p/b/y")), ["/p/c/x"]);
}
