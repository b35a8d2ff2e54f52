//! Consistent reads without an etcd request each: one revision check at a
//! time per resource, shared by every read that waits for it.

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
    let span = tracing::info_span!("freshness", resource = %cache.resource.name);
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
                        r = origin.check(&metrics, &cache) => r,
                    };
                    let revision = match revision {
                        Ok(now) => {
                            let at = cache.progress().valid_through;
                            metrics.cache_lag.set(now.saturating_sub(at) as i64);
                            Ok(now)
                        }
                        Err(e) => Err(Arc::new(e)),
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
