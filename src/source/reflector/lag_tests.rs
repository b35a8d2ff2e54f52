//! The freshness check against a watch that lags, on a real etcd: only the
//! watch's answers are held back, one change at a time, while reads go
//! straight to etcd. A key created and deleted while the watch lags leaves
//! no trace in the check's proof; its two events must still reach the
//! watchers that asked for them, in order, with no read, bookmark or window
//! position running ahead of them.

use std::collections::VecDeque;
use std::sync::Arc;

use etcd_client::WatchStream;
use futures::FutureExt;
use tokio::sync::Semaphore;
use watchproxy_testkit::Etcd as TestEtcd;

use super::*;
use crate::cache::{Progress, WatchCache, WatchFrom};
use crate::config::CacheConfig;
use crate::dispatch::{Dispatcher, Inbox, Next, Watcher};
use crate::object::Resource;
use crate::selector::Predicate;
use crate::source::freshness::spawn_freshness;
use crate::source::history::History;
use crate::source::{Etcd, Origin};
use crate::telemetry::Metrics;

/// etcd, with each change the watch sends passed on only for a permit.
struct Held {
    etcd: EtcdUpstream,
    permits: Arc<Semaphore>,
    pending: VecDeque<Notice>,
}

impl Upstream for Held {
    type Watch = WatchStream;

    async fn list(&mut self) -> Result<Listed, EtcdError> {
        self.etcd.list().await
    }

    async fn list_with_history(
        &mut self,
        depth: u64,
    ) -> Result<(Listed, Result<History, EtcdError>), EtcdError> {
        self.etcd.list_with_history(depth).await
    }

    async fn watch(&mut self, after: Revision) -> Result<WatchStream, EtcdError> {
        self.etcd.watch(after).await
    }

    async fn next(&mut self, watch: &mut WatchStream) -> Result<Notice, EtcdError> {
        if self.pending.is_empty() {
            match self.etcd.next(watch).await? {
                Notice::Changes(changes) => self
                    .pending
                    .extend(changes.into_iter().map(|c| Notice::Changes(vec![c]))),
                other => return Ok(other),
            }
        }
        self.permits
            .acquire()
            .await
            .expect("the semaphore stays open")
            .forget();
        Ok(self.pending.pop_front().expect("a held change"))
    }
}

/// What a watcher has to show now: events and bookmarks, in order.
fn shown(cache: &WatchCache, w: &mut Watcher) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(next) = w.next(cache).now_or_never() {
        match next {
            Next::Event(v) => out.push(format!("{:?} {}@{}", v.kind, v.object.key(), v.revision)),
            Next::Bookmark(r) => out.push(format!("bookmark@{r}")),
            other => panic!("{other:?}"),
        }
    }
    out
}

/// Waits until the cache has applied the events up to `revision`.
async fn applied(cache: &WatchCache, revision: Revision) -> Progress {
    for _ in 0..500 {
        let p = cache.progress();
        if p.revision >= revision {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cache did not apply revision {revision}");
}

#[tokio::test]
async fn a_key_that_came_and_went_while_the_watch_lagged_is_never_skipped() {
    let server = TestEtcd::start_with_default_progress().await;
    let mut client = server.client().await;
    client.put("/p/ns/a", "a", None).await.unwrap();

    let resource = Arc::new(Resource::raw_for_tests());
    let metrics = Metrics::default().resource("pods");
    let dispatcher = Dispatcher::new(64, Duration::from_secs(60), metrics.clone());
    let (cache, writer) = WatchCache::new(
        resource.clone(),
        &CacheConfig::default(),
        dispatcher,
        metrics.clone(),
    );
    let etcd = Etcd::connect(
        std::slice::from_ref(&server.client_url),
        Duration::from_secs(5),
        100,
    )
    .await
    .unwrap();
    let permits = Arc::new(Semaphore::new(0));
    let held = Held {
        etcd: EtcdUpstream {
            etcd: etcd.clone(),
            resource,
            metrics: metrics.clone(),
        },
        permits: permits.clone(),
        pending: VecDeque::new(),
    };
    let shutdown = CancellationToken::new();
    let reflector = Reflector::new(held, writer, metrics.clone(), 0);
    let reflecting = tokio::spawn(reflector.run(shutdown.clone()));
    let (freshness, checking) = spawn_freshness(
        Origin::Etcd(Box::new(etcd)),
        cache.clone(),
        metrics,
        shutdown.clone(),
    );
    cache.wait_ready().await;
    let s = cache.progress().revision;

    // A watcher from S, before the key comes and goes behind the lagging
    // watch.
    let mut from_s = cache
        .watch(
            &Inbox::solo(),
            Predicate::default(),
            WatchFrom::Revision(s),
            true,
        )
        .unwrap()
        .watcher;
    client.put("/p/ns/b", "b", None).await.unwrap();
    client.delete("/p/ns/b", None).await.unwrap();

    // etcd now stands at S+2 and proves its objects are those of S. Reads
    // may be answered at S+2; the history stays at S.
    let now = freshness.current_revision().await.unwrap();
    assert_eq!(now, s + 2);
    let p = cache.progress();
    assert_eq!(
        (p.revision, p.valid_through),
        (s, s + 2),
        "the cache's revision moved past events not yet applied"
    );
    let read = cache.snapshot();
    assert_eq!(read.revision, s + 2);
    assert_eq!(
        read.store
            .iter()
            .map(|o| o.key().to_string())
            .collect::<Vec<_>>(),
        ["/p/ns/a"]
    );
    // A watch from that read skips what came before it.
    let mut from_read = cache
        .watch(&Inbox::solo(), Predicate::default(), WatchFrom::State, true)
        .unwrap();
    assert_eq!(from_read.state.as_ref().map(|st| st.revision), Some(s + 2));
    // No bookmark may run ahead of the held events.
    cache
        .dispatcher()
        .send_due_bookmarks(tokio::time::Instant::now() + Duration::from_secs(600));
    assert_eq!(shown(&cache, &mut from_s), Vec::<String>::new());

    // The creation arrives: the objects are etcd's at S+1 only, so a read
    // at S+2 waits instead of showing the key as present.
    permits.add_permits(1);
    let p = applied(&cache, s + 1).await;
    assert_eq!((p.revision, p.valid_through), (s + 1, s + 1));
    assert!(cache
        .wait_for(s + 2, Duration::from_millis(300))
        .await
        .is_err());
    assert!(cache.snapshot_at(s + 2).is_err());
    assert_eq!(
        shown(&cache, &mut from_s),
        [format!("Added /p/ns/b@{}", s + 1)]
    );

    // The deletion arrives, then the bookmark may carry S+2.
    permits.add_permits(1);
    applied(&cache, s + 2).await;
    cache
        .dispatcher()
        .send_due_bookmarks(tokio::time::Instant::now() + Duration::from_secs(1200));
    assert_eq!(
        shown(&cache, &mut from_s),
        [
            format!("Deleted /p/ns/b@{}", s + 2),
            format!("bookmark@{}", s + 2)
        ]
    );
    assert_eq!(shown(&cache, &mut from_read.watcher), Vec::<String>::new());
    // The window holds both events, in order, for a watch resuming at S.
    let mut resumed = cache
        .watch(
            &Inbox::solo(),
            Predicate::default(),
            WatchFrom::Revision(s),
            false,
        )
        .unwrap()
        .watcher;
    assert_eq!(
        shown(&cache, &mut resumed),
        [
            format!("Added /p/ns/b@{}", s + 1),
            format!("Deleted /p/ns/b@{}", s + 2)
        ]
    );

    shutdown.cancel();
    let _ = tokio::join!(reflecting, checking);
}
