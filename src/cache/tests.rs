//! The cache's own unit tests.

use super::*;
use crate::config::OnHistoryLost;
use crate::dispatch::Next;
use crate::object::{EventType, Projection};
use crate::telemetry::Metrics;
use futures::FutureExt;

fn resource() -> Arc<Resource> {
    Arc::new(Resource::raw_for_tests())
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
            Next::Event(v) => out.push((v.kind, v.object.key().to_string(), v.revision)),
            other => panic!("{other:?}"),
        }
    }
    out
}

/// What a watcher has to show now, resync ends included: each event as
/// its type, key, revision and the version a client resumes from after it.
fn shown_all(cache: &WatchCache, w: &mut Watcher) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(next) = w.next(cache).now_or_never() {
        out.push(match next {
            Next::Event(v) => format!(
                "{:?} {}@{} resumes {}",
                v.kind,
                v.object.key(),
                v.revision,
                v.resync_from.unwrap_or(v.revision)
            ),
            Next::ResyncEnd(r) => format!("resync end {r}"),
            Next::Expired { after, oldest } => {
                out.push(format!("expired after {after}, oldest {oldest}"));
                break;
            }
            other => panic!("{other:?}"),
        });
    }
    out
}

fn relisted(mode: OnHistoryLost) -> (Arc<WatchCache>, CacheWriter, Watcher) {
    let metrics = Metrics::default().resource("pods");
    let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    let config = CacheConfig {
        on_history_lost: mode,
        ..CacheConfig::default()
    };
    let (cache, mut w) = WatchCache::new(resource(), &config, d, metrics);
    w.replace(
        vec![
            obj("/p/a/keep", 2),
            obj("/p/a/change", 3),
            obj("/p/a/gone", 4),
        ],
        10,
    )
    .unwrap();
    let live = cache
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
    )
    .unwrap();
    (cache, w, live)
}

#[test]
fn a_watch_in_the_middle_of_a_resync_resumes_from_where_it_started() {
    let (cache, _w, mut live) = relisted(OnHistoryLost::Resync);
    let first = live.next(&*cache).now_or_never();
    assert!(matches!(first, Some(Next::Event(_))), "{first:?}");
    // From inside (10, 20) a resume is refused; from 10, the whole resync
    // comes again.
    assert_eq!(live.complete_revision(), 10);
    shown_all(&cache, &mut live);
    assert_eq!(live.complete_revision(), 20);
}

#[test]
fn a_relist_sends_the_difference_as_a_marked_resync() {
    let (cache, _w, mut live) = relisted(OnHistoryLost::Resync);
    let resync = [
        "Modified /p/a/change@20 resumes 10",
        "Deleted /p/a/gone@20 resumes 10",
        "Added /p/a/new@20 resumes 10",
        "resync end 20",
    ];
    assert_eq!(shown_all(&cache, &mut live), resync);
    // A resume from before the lost history gets the same resync from the
    // window; from inside it, none is exact; from its end, nothing more.
    let resume = |from| {
        cache
            .watch(
                &Inbox::solo(),
                Predicate::default(),
                WatchFrom::Revision(from),
                false,
            )
            .map(|start| start.watcher)
    };
    assert_eq!(shown_all(&cache, &mut resume(10).unwrap()), resync);
    assert_eq!(resume(15).err(), Some(TooOld { oldest: 20 }));
    assert!(shown_all(&cache, &mut resume(20).unwrap()).is_empty());
    assert_eq!(
        cache.progress(),
        Progress {
            revision: 20,
            valid_through: 20,
            ready: true
        }
    );
    let keys: Vec<_> = cache
        .snapshot()
        .store
        .iter()
        .map(|o| o.key().to_string())
        .collect();
    assert_eq!(keys, ["/p/a/change", "/p/a/keep", "/p/a/new"]);
}

#[test]
fn a_relist_ends_every_watch_when_asked_to() {
    let (cache, _w, mut live) = relisted(OnHistoryLost::End);
    assert_eq!(
        shown_all(&cache, &mut live),
        ["expired after 10, oldest 20"]
    );
    let resumed = cache.watch(
        &Inbox::solo(),
        Predicate::default(),
        WatchFrom::Revision(10),
        false,
    );
    assert_eq!(resumed.err(), Some(TooOld { oldest: 20 }));
    assert_eq!(cache.snapshot().store.len(), 3);
}

#[test]
fn deleting_an_unknown_key_emits_nothing_but_advances_the_revision() {
    let (cache, mut w) = new_cache();
    w.replace(vec![], 5).unwrap();
    let mut watcher = watching_all(&cache);
    w.apply(vec![Change {
        revision: 6,
        key: Arc::from("/p/a/x"),
        object: None,
    }])
    .unwrap();
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
    )
    .unwrap();
    let snap = cache.snapshot();
    let r = resource();
    let keys = |p: &Predicate, after: Option<&str>| {
        snap.select(&r, p, after)
            .map(|o| o.key().to_string())
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

/// Watchers with equal projections that replay the window are shown the
/// very cut the live watchers got: each object version is cut once.
#[test]
fn replays_reuse_the_cut_live_watchers_were_shown() {
    let r = Arc::new(Resource::for_tests(&[]));
    let metrics = Metrics::default().resource("pods");
    let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    let (cache, mut writer) = WatchCache::new(r.clone(), &CacheConfig::default(), d, metrics);
    writer.replace(vec![], 1).unwrap();
    let projection = || {
        let p = Projection::new(&["metadata".into()], false).unwrap();
        Some(Arc::new(p.unwrap()))
    };
    let wants = || Wants {
        predicate: Predicate::default(),
        projection: projection(),
    };
    let mut live = (cache.watch(&Inbox::solo(), wants(), WatchFrom::Revision(1), false))
        .unwrap()
        .watcher;
    for rev in 2..5 {
        let value = format!(r#"{{"metadata":{{"name":"a{rev}"}},"spec":{{"x":{rev}}}}}"#);
        let o = r.decode(b"/p/ns/a", value.as_bytes(), rev).unwrap();
        writer.apply(vec![Change::put(o)]).unwrap();
    }
    let objects = |w: &mut Watcher| {
        let mut out = Vec::new();
        while let Some(Next::Event(v)) = w.next(&cache).now_or_never() {
            out.push(v.object.clone());
        }
        out
    };
    let shown_live = objects(&mut live);
    assert_eq!(shown_live.len(), 3);
    for _ in 0..2 {
        let mut replaying = (cache.watch(&Inbox::solo(), wants(), WatchFrom::Revision(1), false))
            .unwrap()
            .watcher;
        let replayed = objects(&mut replaying);
        assert_eq!(replayed.len(), 3);
        for (a, b) in shown_live.iter().zip(&replayed) {
            assert!(Arc::ptr_eq(a, b), "{} cut again", a.revision);
        }
    }
}

#[test]
fn the_budget_sheds_the_window_first_then_gives_up_the_objects() {
    let one = obj("/p/a/x", 1).cost();
    let r = Arc::new(Resource {
        max_bytes: Some(6 * one),
        ..(*resource()).clone()
    });
    let metrics = Metrics::default().resource("pods");
    let d = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    let (cache, mut w) = WatchCache::new(r, &CacheConfig::default(), d, metrics.clone());
    w.replace(vec![obj("/p/a/x", 2), obj("/p/a/y", 3)], 3)
        .unwrap();
    let inbox = Inbox::solo();
    let mut watcher = cache
        .watch(&inbox, Predicate::default(), WatchFrom::Revision(3), false)
        .unwrap()
        .watcher;
    // Updates fill the window until it is shed to fit: 2 objects and at
    // most 4 events' states in 6 objects' worth.
    for rev in 4..14 {
        let o = obj("/p/a/x", rev);
        w.apply(vec![Change::put(o)]).unwrap();
    }
    let s = cache.state.lock();
    assert!(s.bytes + s.ring.bytes() <= 6 * one, "within the budget");
    assert!(
        s.ring.len() < 10 && !s.ring.is_empty(),
        "{} events",
        s.ring.len()
    );
    drop(s);
    assert!(metrics.window_shed.get() > 0);
    assert!(cache.over_budget().is_none());
    // Objects that alone exceed it: given up, the watch ends.
    let many: Vec<Change> = (0..8)
        .map(|i| {
            let o = obj(&format!("/p/b/{i}"), 20);
            Change::put(o)
        })
        .collect();
    let over = w.apply(many).unwrap_err();
    assert_eq!(over.budget, 6 * one);
    assert!(over.bytes > over.budget);
    assert_eq!(cache.over_budget(), Some(over));
    assert!(!cache.progress().ready);
    assert_eq!(cache.state.lock().store.len(), 0);
    assert!(
        shown_all(&cache, &mut watcher)
            .last()
            .is_some_and(|l| l.starts_with("expired")),
        "the watch ends"
    );
    // A list that fits brings it back.
    w.replace(vec![obj("/p/a/x", 21)], 21).unwrap();
    assert!(cache.progress().ready && cache.over_budget().is_none());
}

/// A watcher of every object, from the cache's state.
fn watching_all(cache: &WatchCache) -> Watcher {
    let inbox = Inbox::solo();
    let start = cache.watch(&inbox, Predicate::default(), WatchFrom::State, false);
    start.unwrap().watcher
}

#[test]
fn a_revision_shown_in_part_is_settled_only_once_the_rest_is_shown() {
    let (cache, mut w) = new_cache();
    w.replace(vec![], 5).unwrap();
    let mut watcher = watching_all(&cache);
    // One transaction, two keys.
    w.apply(vec![
        Change::put(obj("/p/a/x", 6)),
        Change::put(obj("/p/a/y", 6)),
    ])
    .unwrap();
    assert!(matches!(
        watcher.next(&*cache).now_or_never(),
        Some(Next::Event(_))
    ));
    assert_eq!(watcher.complete_revision(), 5);
    assert_eq!(watcher.settled_revision(&cache), 5, "one of two shown");
    assert!(matches!(
        watcher.next(&*cache).now_or_never(),
        Some(Next::Event(_))
    ));
    assert_eq!(watcher.complete_revision(), 5, "a live watcher cannot tell");
    assert_eq!(watcher.settled_revision(&cache), 6, "the window can");
}
