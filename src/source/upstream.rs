//! What a reflector asks of etcd, behind a trait: etcd itself in the
//! service, a scripted upstream in the reflector's unit tests, so that its
//! transitions can be driven one at a time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{WatchOptions, WatchStream};
use tracing::debug;

use super::etcd::ListedKv;
use super::history::{self, History};
use super::revival::Revival;
use super::{Etcd, EtcdError};
use crate::cache::{Change, OverBudget};
use crate::object::{Object, Resource, Revision};
use crate::telemetry::{EtcdRequest, ResourceMetrics};

/// One answer on a watch, as the reflector acts on it. A cancelled watch
/// and a stream that ends are errors, classified like every other.
#[derive(Debug)]
pub enum Notice {
    /// The watch exists; its progress notifications carry this id.
    Created { watch_id: i64 },
    /// Nothing under the prefix changed up to `revision` (a notification
    /// of watch `watch_id`, or a requested one: -1).
    Progress { watch_id: i64, revision: Revision },
    /// Changes, in revision order; values that could not be decoded were
    /// counted and logged.
    Changes(Vec<Change>),
}

/// A full list of the prefix, cut from one revision.
pub struct Listed {
    pub objects: Vec<Object>,
    pub revision: Revision,
    /// The revision of the newest change in the objects, where the
    /// upstream says (another watchproxy does); else `revision`.
    pub changed: Revision,
}

pub trait Upstream: Send + 'static {
    type Watch: Send;

    /// Lists the whole prefix; undecodable values are counted and skipped.
    fn list(&mut self) -> impl Future<Output = Result<Listed, EtcdError>> + Send;

    /// Lists the whole prefix with the history of up to `depth` revisions
    /// before the list; a failed history read leaves the list.
    fn list_with_history(
        &mut self,
        depth: u64,
    ) -> impl Future<Output = Result<(Listed, Result<History, EtcdError>), EtcdError>> + Send;

    /// Opens a watch for the changes after `after`.
    fn watch(
        &mut self,
        after: Revision,
    ) -> impl Future<Output = Result<Self::Watch, EtcdError>> + Send;

    /// The next answer on `watch`.
    fn next(
        &mut self,
        watch: &mut Self::Watch,
    ) -> impl Future<Output = Result<Notice, EtcdError>> + Send;

    /// Whether the upstream answers a small request, so a reflector
    /// backing off learns early that it can go on.
    fn probe(&mut self) -> impl Future<Output = bool> + Send {
        async { false }
    }

    /// Shared with the reflectors of the other resources of the same
    /// origin; none where there are none.
    fn revival(&self) -> Option<Arc<Revival>> {
        None
    }
}

/// How long a probe may take: an origin slower than this is not back.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long reading history at start may take before the reflector starts
/// without it (and a client resuming from before the start gets
/// OUT_OF_RANGE). Long enough for a start under a reconnect storm: 10,000
/// watches retrying every 200 ms on 2 cores took the read past 10 s.
const HISTORY_BUDGET: Duration = Duration::from_secs(30);

/// etcd, for one resource.
pub struct EtcdUpstream {
    pub etcd: Etcd,
    pub resource: Arc<Resource>,
    pub metrics: ResourceMetrics,
}

impl EtcdUpstream {
    /// Lists the whole prefix; `beside` gets the list's revision once the
    /// first page is read, and runs while the others are. Each page is
    /// decoded on a blocking thread while the next is read, and let go once
    /// decoded: the list takes about as long as etcd takes to send it, and
    /// holds one page of raw pairs at a time.
    async fn list_beside<F: Future>(
        &self,
        beside: impl FnOnce(Revision) -> F,
    ) -> Result<(Listed, F::Output), EtcdError> {
        let (start, end) = (self.resource.key_prefix(), self.resource.key_range_end());
        let mut pages = self.etcd.pages(&self.metrics, &start, &end);
        let mut next = pages.next().await?;
        let revision = pages.revision().expect("a page was read");
        let rest = async {
            let (mut objects, mut bytes) = (Vec::new(), 0);
            let mut decoding: Option<tokio::task::JoinHandle<Vec<Object>>> = None;
            loop {
                if let Some(kvs) = next.take() {
                    let (resource, metrics) = (self.resource.clone(), self.metrics.clone());
                    decoding = Some(tokio::task::spawn_blocking(move || {
                        decode_page(&resource, &metrics, kvs)
                    }));
                }
                let Some(page) = decoding.take() else {
                    return Ok::<_, EtcdError>(objects);
                };
                let decoded = async { page.await.expect("decoding a page does not panic") };
                let (read, decoded) = tokio::join!(pages.next(), decoded);
                bytes += decoded.iter().map(Object::cost).sum::<u64>();
                if let Some(budget) = self.resource.max_bytes.filter(|&b| bytes > b) {
                    // Stopped here, rather than holding a list it cannot keep.
                    return Err(OverBudget { bytes, budget }.into());
                }
                objects.extend(decoded);
                next = read?;
            }
        };
        let (objects, beside) = tokio::join!(rest, beside(revision));
        Ok((
            Listed {
                objects: objects?,
                revision,
                changed: revision,
            },
            beside,
        ))
    }
}

impl Upstream for EtcdUpstream {
    type Watch = WatchStream;

    async fn list(&mut self) -> Result<Listed, EtcdError> {
        let (listed, _) = self.list_beside(|_| async {}).await?;
        Ok(listed)
    }

    /// The history is read while the list's pages after the first are: its
    /// watch waits for etcd's next sync of old watches (every 100 ms), and
    /// twice when the first start is compacted.
    async fn list_with_history(
        &mut self,
        depth: u64,
    ) -> Result<(Listed, Result<History, EtcdError>), EtcdError> {
        let (etcd, metrics, resource) = (&self.etcd, &self.metrics, &self.resource);
        self.list_beside(|listed| {
            history::read(etcd, metrics, resource, listed, depth, HISTORY_BUDGET)
        })
        .await
    }

    async fn watch(&mut self, after: Revision) -> Result<WatchStream, EtcdError> {
        self.metrics.etcd_request(EtcdRequest::watch);
        let options = WatchOptions::new()
            .with_range(self.resource.key_range_end())
            .with_start_revision(after as i64 + 1)
            .with_progress_notify();
        let stream = self.etcd.watch(self.resource.key_prefix(), options).await?;
        debug!(from = after + 1, "watch opened");
        Ok(stream)
    }

    async fn probe(&mut self) -> bool {
        let (start, end) = (self.resource.key_prefix(), self.resource.key_range_end());
        let read = self.etcd.current_revision(&self.metrics, &start, &end);
        matches!(tokio::time::timeout(PROBE_TIMEOUT, read).await, Ok(Ok(_)))
    }

    fn revival(&self) -> Option<Arc<Revival>> {
        Some(self.etcd.revival.clone())
    }

    async fn next(&mut self, watch: &mut WatchStream) -> Result<Notice, EtcdError> {
        let response = match watch.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(EtcdError::StreamEnded),
            Err(e) => return Err(EtcdError::Client(e)),
        };
        if response.canceled() {
            return Err(match response.compact_revision() {
                0 => EtcdError::WatchCanceled(response.cancel_reason().to_owned()),
                c => EtcdError::Compacted {
                    compacted: c as Revision,
                },
            });
        }
        if response.created() {
            return Ok(Notice::Created {
                watch_id: response.watch_id(),
            });
        }
        if response.events().is_empty() {
            let revision = response.header().map_or(0, |h| h.revision() as Revision);
            return Ok(Notice::Progress {
                watch_id: response.watch_id(),
                revision,
            });
        }
        let changes = response
            .events()
            .iter()
            .filter_map(|e| history::change(&self.resource, &self.metrics, e.kv()?, e.event_type()))
            .collect();
        Ok(Notice::Changes(changes))
    }
}

/// The objects of a listed page; undecodable pairs are counted and logged.
fn decode_page(resource: &Resource, metrics: &ResourceMetrics, kvs: Vec<ListedKv>) -> Vec<Object> {
    kvs.iter()
        .filter_map(|kv| match super::decode(resource, kv) {
            Ok(o) => Some(o),
            Err(e) => {
                super::skip(metrics, kv.key(), kv.mod_revision() as Revision, &e);
                None
            }
        })
        .collect()
}
