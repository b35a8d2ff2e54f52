//! The reflector's transitions, one step at a time, over a scripted
//! upstream (the real-etcd tests cover the same paths end to end).

use std::collections::VecDeque;
use std::sync::Arc;

use super::*;
use crate::cache::{Change, WatchCache};
use crate::config::CacheConfig;
use crate::dispatch::Dispatcher;
use crate::object::{Object, Resource};
use crate::source::history::History;
use crate::telemetry::Metrics;

type Answers = VecDeque<Result<Notice, EtcdError>>;

/// Answers each request with the next scripted answer; records where each
/// watch was asked to start.
#[derive(Default)]
struct Script {
    lists: VecDeque<Result<Listed, EtcdError>>,
    watches: VecDeque<Result<Answers, EtcdError>>,
    opened_after: Vec<Revision>,
}

impl Upstream for Script {
    type Watch = Answers;

    async fn list(&mut self) -> Result<Listed, EtcdError> {
        self.lists.pop_front().expect("a scripted list")
    }

    /// Its history read always fails: the list stands alone.
    async fn list_with_history(
        &mut self,
        _: u64,
    ) -> Result<(Listed, Result<History, EtcdError>), EtcdError> {
        Ok((self.list().await?, Err(EtcdError::Timeout)))
    }

    async fn watch(&mut self, after: Revision) -> Result<Answers, EtcdError> {
        self.opened_after.push(after);
        self.watches.pop_front().expect("a scripted watch")
    }

    async fn next(&mut self, watch: &mut Answers) -> Result<Notice, EtcdError> {
        watch.pop_front().expect("a scripted answer")
    }
}

fn resource() -> Arc<Resource> {
    Arc::new(Resource::raw_for_tests())
}

fn object(key: &str, revision: Revision) -> Object {
    resource()
        .decode(key.as_bytes(), b"v", revision)
        .expect("decodes")
}

fn listed(keys: &[(&str, Revision)], revision: Revision) -> Result<Listed, EtcdError> {
    Ok(Listed {
        objects: keys.iter().map(|(k, r)| object(k, *r)).collect(),
        revision,
        changed: revision,
    })
}

fn put(key: &str, revision: Revision) -> Change {
    Change {
        revision,
        key: Arc::from(key),
        object: Some(object(key, revision)),
    }
}

fn reflector(script: Script) -> (Reflector<Script>, Arc<WatchCache>, ResourceMetrics) {
    let metrics = Metrics::default().resource("pods");
    let dispatcher = Dispatcher::new(16, Duration::from_secs(60), metrics.clone());
    let (cache, writer) = WatchCache::new(
        resource(),
        &CacheConfig::default(),
        dispatcher,
        metrics.clone(),
    );
    (
        Reflector::new(script, writer, metrics.clone(), 0),
        cache,
        metrics,
    )
}

/// The state, as the assertions compare it.
fn shape<W>(s: &State<W>) -> String {
    match s {
        State::Listing => "listing".into(),
        State::Connecting { revision } => format!("connecting after {revision}"),
        State::Watching { watch_id, .. } => format!("watching {watch_id:?}"),
        State::Backoff { next } => format!("backoff, then {}", shape(next)),
    }
}

fn keys(cache: &WatchCache) -> Vec<String> {
    cache
        .snapshot()
        .store
        .iter()
        .map(|o| o.key().to_string())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_reflector_lists_watches_and_relists_after_a_compaction() {
    let mut script = Script::default();
    script.lists.extend([
        listed(&[("/p/a/x", 2)], 5),
        Err(EtcdError::Timeout),
        listed(&[("/p/a/y", 8)], 9),
    ]);
    script.watches.extend([
        Ok(Answers::from([
            Ok(Notice::Created { watch_id: 7 }),
            Ok(Notice::Changes(vec![put("/p/a/z", 6)])),
            Ok(Notice::Progress {
                watch_id: 7,
                revision: 7,
            }),
            // A requested notification may run ahead of undelivered
            // events: not taken as progress.
            Ok(Notice::Progress {
                watch_id: -1,
                revision: 100,
            }),
            Err(EtcdError::Compacted { compacted: 8 }),
        ])),
        Err(EtcdError::StreamEnded),
    ]);
    let (mut r, cache, metrics) = reflector(script);
    let mut steps = Vec::new();
    let mut state = State::Listing;
    for _ in 0..13 {
        state = r.step(state).await;
        let p = cache.progress();
        steps.push(format!(
            "{} | {}{:?}",
            shape(&state),
            if p.ready { "" } else { "not ready " },
            (p.revision, keys(&cache))
        ));
    }
    let want = [
        r#"connecting after 5 | (5, ["/p/a/x"])"#,
        r#"watching None | (5, ["/p/a/x"])"#,
        r#"watching Some(7) | (5, ["/p/a/x"])"#,
        r#"watching Some(7) | (6, ["/p/a/x", "/p/a/z"])"#,
        r#"watching Some(7) | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"watching Some(7) | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"backoff, then listing | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"listing | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"backoff, then listing | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"listing | (7, ["/p/a/x", "/p/a/z"])"#,
        r#"connecting after 9 | (9, ["/p/a/y"])"#,
        r#"backoff, then connecting after 9 | (9, ["/p/a/y"])"#,
        r#"connecting after 9 | (9, ["/p/a/y"])"#,
    ];
    assert_eq!(steps, want);
    assert_eq!(r.upstream.opened_after, [5, 9]);
    assert_eq!(metrics.relists.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_broken_watch_reconnects_from_what_the_cache_has_applied() {
    let mut script = Script::default();
    script.lists.push_back(listed(&[], 5));
    script.watches.extend([
        Ok(Answers::from([
            Ok(Notice::Created { watch_id: 1 }),
            Ok(Notice::Changes(vec![put("/p/a/x", 6), put("/p/a/y", 6)])),
            Err(EtcdError::StreamEnded),
        ])),
        Ok(Answers::from([Ok(Notice::Created { watch_id: 2 })])),
    ]);
    let (mut r, cache, _) = reflector(script);
    let mut state = State::Listing;
    for _ in 0..4 {
        state = r.step(state).await;
    }
    assert_eq!(shape(&state), "watching Some(1)");
    state = r.step(state).await;
    assert_eq!(shape(&state), "backoff, then connecting after 6");
    let before = tokio::time::Instant::now();
    state = r.step(state).await;
    assert!(before.elapsed() <= Backoff::MIN, "the first retry is quick");
    state = r.step(state).await;
    state = r.step(state).await;
    assert_eq!(shape(&state), "watching Some(2)");
    assert_eq!(r.upstream.opened_after, [5, 6]);
    assert_eq!(cache.progress().revision, 6);
}

#[test]
fn backoff_grows_to_a_cap_and_resets() {
    let mut b = Backoff::default();
    let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
    assert!(delays[0] <= Backoff::MIN);
    assert!(delays.iter().all(|d| *d <= Backoff::MAX));
    assert!(delays[11] >= Backoff::MAX / 2);
    b.reset();
    assert!(b.next_delay() <= Backoff::MIN);
}
