//! Consistent reads without an etcd request each: one revision check at a
//! time per resource, shared by every read that waits for it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{EtcdError, Origin};
use crate::cache::WatchCache;
use crate::object::Revision;
use crate::telemetry::ResourceMetrics;

/// The outcome of one check, numbered by the order checks started in.
#[derive(Debug, Clone)]
struct Checked {
    generation: u64,
    /// etcd's revision when the check ran, or why it could not be read.
    revision: Result<Revision, Arc<EtcdError>>,
}

/// Learns etcd's current revision for a resource's consistent reads, from
/// etcd or through the upstream watchproxy.
///
/// A read must see a revision read from etcd after the read arrived, so it
/// cannot reuse a check already running; it asks for the next one. Every
/// read that arrives while a check runs shares that next check, so a burst
/// of reads costs etcd one or two checks, not one each.
pub struct Freshness {
    /// Generations of checks started so far.
    started: AtomicU64,
    /// The highest generation any reader waits for.
    wanted: AtomicU64,
    wake: Notify,
    done: watch::Sender<Checked>,
}

impl Freshness {
    /// etcd's current revision, from a check that started after this call.
    pub async fn current_revision(&self) -> Result<Revision, Arc<EtcdError>> {
        let want = self.started.load(Ordering::SeqCst) + 1;
        self.wanted.fetch_max(want, Ordering::SeqCst);
        self.wake.notify_one();
        let mut rx = self.done.subscribe();
        let checked = rx
            .wait_for(|c| c.generation >= want)
            .await
            .map_err(|_| Arc::new(EtcdError::StreamEnded))?;
        checked.revision.clone()
    }
}

/// Starts the checker of a resource; the task exits on `shutdown`.
///
/// Each check also proves whether the cache's objects are already etcd's
/// current ones; if so reads are answered at once at etcd's revision,
/// otherwise the watch will deliver.
pub fn spawn_freshness(
    origin: Origin,
    cache: Arc<WatchCache>,
    metrics: ResourceMetrics,
    shutdown: CancellationToken,
) -> (Arc<Freshness>, tokio::task::JoinHandle<()>) {
    let span = tracing::info_span!("freshness", resource = %cache.resource.name);
    let check = move || {
        let (origin, cache, metrics) = (origin.clone(), cache.clone(), metrics.clone());
        async move {
            metrics.freshness_checks.inc();
            let now = origin.check(&metrics, &cache).await?;
            let at = cache.progress().valid_through;
            metrics.cache_lag.set(now.saturating_sub(at) as i64);
            Ok(now)
        }
    };
    spawn_checker(check, shutdown, span)
}

/// Runs `check` whenever a reader waits for one, one at a time.
fn spawn_checker<F, C>(
    mut check: F,
    shutdown: CancellationToken,
    span: tracing::Span,
) -> (Arc<Freshness>, tokio::task::JoinHandle<()>)
where
    F: FnMut() -> C + Send + 'static,
    C: Future<Output = Result<Revision, EtcdError>> + Send,
{
    let freshness = Arc::new(Freshness {
        started: AtomicU64::new(0),
        wanted: AtomicU64::new(0),
        wake: Notify::new(),
        done: watch::Sender::new(Checked {
            generation: 0,
            revision: Ok(0),
        }),
    });
    let f = freshness.clone();
    let task = tokio::spawn(
        async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = f.wake.notified() => {}
                }
                while f.wanted.load(Ordering::SeqCst) > f.started.load(Ordering::SeqCst) {
                    // Published before etcd is asked, so a reader that
                    // sees the old count is served by a later check.
                    let generation = f.started.fetch_add(1, Ordering::SeqCst) + 1;
                    let revision = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        r = check() => r.map_err(Arc::new),
                    };
                    f.done.send_replace(Checked {
                        generation,
                        revision,
                    });
                }
            }
        }
        .instrument(span),
    );
    (freshness, task)
}

impl Origin {
    /// etcd's current revision, read after this call; a cache proven to
    /// hold etcd's current objects has its reads moved to it.
    async fn check(&self, m: &ResourceMetrics, cache: &WatchCache) -> Result<Revision, EtcdError> {
        match self {
            // Count-only reads: nothing etcd holds under the prefix
            // changed since the cache's revision.
            Origin::Etcd(etcd) => {
                let (start, end) = (cache.resource.key_prefix(), cache.resource.key_range_end());
                let since = cache.progress().revision;
                let (now, unchanged) = etcd.unchanged_since(m, &start, &end, since).await?;
                if unchanged {
                    cache.confirm_unchanged(since, now);
                }
                Ok(now)
            }
            Origin::Tier(tier) => {
                let (now, same) = tier.current().await?;
                if let Some(same) = same {
                    cache.confirm_same(same, now);
                }
                Ok(now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// A run: etcd's revision moves at `writes` (ms); readers arrive at
    /// `reads` (ms); each check is read by etcd `serve` ms after it starts
    /// and answers `answer` ms later.
    #[derive(Debug, Clone)]
    struct Run {
        writes: Vec<u64>,
        reads: Vec<u64>,
        serve: Vec<u64>,
        answer: Vec<u64>,
    }

    fn runs() -> impl Strategy<Value = Run> {
        (
            prop::collection::vec(0..200u64, 0..40),
            prop::collection::vec(0..200u64, 1..60),
            prop::collection::vec(0..20u64, 1..8),
            prop::collection::vec(0..20u64, 1..8),
        )
            .prop_map(|(writes, reads, serve, answer)| Run {
                writes,
                reads,
                serve,
                answer,
            })
    }

    /// Each reader's revision and etcd's when it arrived; the checks run.
    async fn play(run: Run) -> (Vec<(Revision, Revision)>, usize) {
        let etcd = Arc::new(AtomicU64::new(1));
        let checks = Arc::new(AtomicUsize::new(0));
        let check = {
            let (etcd, checks, run) = (etcd.clone(), checks.clone(), run.clone());
            move || {
                let n = checks.fetch_add(1, Ordering::SeqCst);
                let serve = Duration::from_millis(run.serve[n % run.serve.len()]);
                let answer = Duration::from_millis(run.answer[n % run.answer.len()]);
                let etcd = etcd.clone();
                async move {
                    tokio::time::sleep(serve).await;
                    let now = etcd.load(Ordering::SeqCst);
                    tokio::time::sleep(answer).await;
                    Ok(now)
                }
            }
        };
        let shutdown = CancellationToken::new();
        let (freshness, task) = spawn_checker(check, shutdown.clone(), tracing::Span::none());
        for &at in &run.writes {
            let etcd = etcd.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(at)).await;
                etcd.fetch_add(1, Ordering::SeqCst);
            });
        }
        let readers: Vec<_> = (run.reads.iter())
            .map(|&at| {
                let (etcd, freshness) = (etcd.clone(), freshness.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    let arrived = etcd.load(Ordering::SeqCst);
                    let got = freshness.current_revision().await.unwrap();
                    (got, arrived)
                })
            })
            .collect();
        let mut seen = Vec::new();
        for r in readers {
            seen.push(r.await.unwrap());
        }
        shutdown.cancel();
        task.await.unwrap();
        (seen, checks.load(Ordering::SeqCst))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// No interleaving of reads, writes and checks answers a read with
        /// a revision etcd had passed when the read arrived, and readers
        /// share checks: never more checks than readers.
        #[test]
        fn no_read_is_answered_from_a_check_older_than_itself(run in runs()) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let readers = run.reads.len();
            let (seen, checks) = rt.block_on(play(run));
            for (got, arrived) in seen {
                prop_assert!(got >= arrived, "a read that arrived at {arrived} got {got}");
            }
            prop_assert!(checks <= readers, "{checks} checks for {readers} reads");
        }
    }
}
