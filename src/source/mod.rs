//! The etcd side: a reflector per resource lists the prefix, then keeps one
//! etcd watch on it, feeding the watch cache.

mod etcd;
mod freshness;
mod history;
mod read;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{WatchOptions, WatchResponse, WatchStream};
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::cache::CacheWriter;
use crate::object::{Object, Resource, Revision};
use crate::telemetry::{EtcdRequest, ReflectorState, ResourceMetrics};

pub use etcd::{Etcd, EtcdError};
pub use freshness::{spawn_freshness, Freshness};
pub use read::ObjectsPage;

/// What to do after an etcd failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Transient (connection lost, leader change, timeout): back off, then
    /// retry the same step.
    Retry,
    /// The revision we continue from is gone: list again.
    Relist,
}

/// Sorts an etcd failure into a recovery. Nothing is fatal: a reflector
/// retries for as long as the service runs, logging each failure, because a
/// watch cache that gave up would serve stale data forever.
pub fn classify(err: &EtcdError) -> Recovery {
    match err {
        EtcdError::Compacted { .. } => Recovery::Relist,
        EtcdError::Client(_)
        | EtcdError::Timeout
        | EtcdError::FutureRevision
        | EtcdError::WatchCanceled(_)
        | EtcdError::StreamEnded => Recovery::Retry,
    }
}

/// The reflector's loop, one state at a time.
enum State {
    /// List the prefix (again) and install it in the cache.
    Listing,
    /// Open a watch for the changes after `revision`.
    Connecting { revision: Revision },
    /// Apply what the watch sends.
    Watching {
        stream: Box<WatchStream>,
        watch_id: Option<i64>,
    },
    /// Wait, then go on with `next`.
    Backoff { next: Box<State> },
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Listing => "listing",
            State::Connecting { .. } => "connecting",
            State::Watching { .. } => "watching",
            State::Backoff { .. } => "backoff",
        }
    }
}

/// Keeps one resource's cache in step with etcd.
pub struct Reflector {
    etcd: Etcd,
    resource: Arc<Resource>,
    writer: CacheWriter,
    metrics: ResourceMetrics,
    backoff: Backoff,
    listed_once: bool,
    /// How many revisions before the first list to read into the window.
    history_depth: u64,
    /// The state last published in `watchproxy_reflector_state`.
    shown_state: Option<ReflectorState>,
}

/// How long reading history at start may take before the reflector starts
/// without it.
const HISTORY_BUDGET: Duration = Duration::from_secs(10);

/// Starts the reflector of a resource. The task exits when `shutdown` is
/// cancelled; etcd failures never end it.
pub fn spawn_reflector(
    etcd: Etcd,
    writer: CacheWriter,
    metrics: ResourceMetrics,
    history_depth: u64,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let resource = writer.cache().resource.clone();
    let span = tracing::info_span!("reflector", resource = %resource.name);
    let reflector = Reflector {
        etcd,
        resource,
        writer,
        metrics,
        backoff: Backoff::default(),
        listed_once: false,
        history_depth,
        shown_state: None,
    };
    tokio::spawn(reflector.run(shutdown).instrument(span))
}

impl Reflector {
    async fn run(mut self, shutdown: CancellationToken) {
        let mut state = State::Listing;
        loop {
            state = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = self.step(state) => next,
            };
        }
    }

    async fn step(&mut self, state: State) -> State {
        let shown = match &state {
            State::Listing => ReflectorState::listing,
            State::Connecting { .. } => ReflectorState::connecting,
            State::Watching { .. } => ReflectorState::watching,
            State::Backoff { .. } => ReflectorState::backoff,
        };
        // Watching lasts many steps (one per etcd response); publish changes only.
        if self.shown_state != Some(shown) {
            self.metrics.reflector_state(shown);
            self.shown_state = Some(shown);
        }
        match state {
            State::Listing => match self.list().await {
                Ok(next) => {
                    self.backoff.reset();
                    next
                }
                Err(e) => self.recover(e, State::Listing),
            },
            State::Connecting { revision } => match self.connect(revision).await {
                Ok(stream) => State::Watching {
                    stream: Box::new(stream),
                    watch_id: None,
                },
                Err(e) => self.recover(e, State::Connecting { revision }),
            },
            State::Watching {
                mut stream,
                mut watch_id,
            } => match self.watch_once(&mut stream, &mut watch_id).await {
                Ok(()) => State::Watching { stream, watch_id },
                Err(e) => {
                    let revision = self.writer.cache().progress().revision;
                    self.recover(e, State::Connecting { revision })
                }
            },
            State::Backoff { next } => {
                let delay = self.backoff.next_delay();
                debug!(?delay, next = next.name(), "backing off");
                tokio::time::sleep(delay).await;
                *next
            }
        }
    }

    fn recover(&mut self, err: EtcdError, retry: State) -> State {
        let next = match classify(&err) {
            Recovery::Retry => retry,
            Recovery::Relist => State::Listing,
        };
        warn!(error = %err, next = next.name(), "etcd failure");
        State::Backoff {
            next: Box::new(next),
        }
    }

    /// Lists the whole prefix in pages cut from one revision. The first
    /// list also reads the history before it into the event window; a later
    /// list (after compaction) turns its difference with the cache into
    /// events instead.
    async fn list(&mut self) -> Result<State, EtcdError> {
        let (start, end) = (self.resource.key_prefix(), self.resource.key_range_end());
        let (kvs, revision) = self
            .etcd
            .list_all(&self.metrics, &start, &end, None)
            .await?;
        let objects: Vec<Object> = kvs
            .iter()
            .filter_map(|(k, v, rev)| self.decode_or_count(k, v, *rev))
            .collect();
        let relist = std::mem::replace(&mut self.listed_once, true);
        if relist {
            self.metrics.relists.inc();
        }
        info!(objects = objects.len(), revision, relist, "listed");
        if !relist && self.history_depth > 0 {
            let read = history::read(
                &self.etcd,
                &self.metrics,
                &self.resource,
                revision,
                self.history_depth,
                HISTORY_BUDGET,
            );
            match read.await {
                Ok(h) => {
                    info!(events = h.events.len(), oldest = h.oldest, "read history");
                    self.writer
                        .replace_with_history(objects, revision, h.oldest, h.events);
                    self.writer.apply(h.live);
                    let revision = self.writer.cache().progress().revision;
                    return Ok(State::Connecting { revision });
                }
                Err(e) => warn!(error = %e, "could not read history; resumes start at the list"),
            }
        }
        self.writer.replace(objects, revision);
        Ok(State::Connecting { revision })
    }

    async fn connect(&mut self, revision: Revision) -> Result<WatchStream, EtcdError> {
        self.metrics.etcd_request(EtcdRequest::watch);
        let options = WatchOptions::new()
            .with_range(self.resource.key_range_end())
            .with_start_revision(revision as i64 + 1)
            .with_progress_notify();
        let stream = self.etcd.watch(self.resource.key_prefix(), options).await?;
        debug!(from = revision + 1, "watch opened");
        Ok(stream)
    }

    /// Handles one watch response.
    async fn watch_once(
        &mut self,
        stream: &mut WatchStream,
        watch_id: &mut Option<i64>,
    ) -> Result<(), EtcdError> {
        let response = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(EtcdError::StreamEnded),
            Err(e) => return Err(EtcdError::Client(e)),
        };
        self.backoff.reset();
        if response.canceled() {
            return Err(match response.compact_revision() {
                0 => EtcdError::WatchCanceled(response.cancel_reason().to_owned()),
                c => EtcdError::Compacted {
                    compacted: c as Revision,
                },
            });
        }
        if response.created() {
            *watch_id = Some(response.watch_id());
            return Ok(());
        }
        self.apply(response, *watch_id);
        Ok(())
    }

    fn apply(&mut self, response: WatchResponse, watch_id: Option<i64>) {
        if response.events().is_empty() {
            // Only the periodic notification of our own watch is ordered
            // with its events; a requested one (watch id -1) may run ahead
            // of undelivered events on etcd before 3.4.31 / 3.5.13.
            if watch_id == Some(response.watch_id()) {
                if let Some(h) = response.header() {
                    self.writer.progress(h.revision() as Revision);
                }
            }
            return;
        }
        let changes = response
            .events()
            .iter()
            .filter_map(|e| history::change(&self.resource, &self.metrics, e.kv()?, e.event_type()))
            .collect();
        self.writer.apply(changes);
    }

    fn decode_or_count(&self, key: &[u8], value: &[u8], revision: Revision) -> Option<Object> {
        match self.resource.decode(key, value, revision) {
            Ok(o) => Some(o),
            Err(e) => {
                self.metrics.undecodable.inc();
                warn!(key = %String::from_utf8_lossy(key), revision, error = %e, "skipping undecodable value");
                None
            }
        }
    }
}

/// Exponential backoff with jitter, from 100 ms up to 30 s.
#[derive(Debug)]
struct Backoff {
    current: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { current: Self::MIN }
    }
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(30);

    fn reset(&mut self) {
        self.current = Self::MIN;
    }

    fn next_delay(&mut self) -> Duration {
        let d = self.current.mul_f64(rand::rng().random_range(0.5..=1.0));
        self.current = (self.current * 2).min(Self::MAX);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_once() {
        let cases = [
            (EtcdError::Compacted { compacted: 7 }, Recovery::Relist),
            (EtcdError::Timeout, Recovery::Retry),
            (EtcdError::StreamEnded, Recovery::Retry),
            (
                EtcdError::WatchCanceled("permission denied".into()),
                Recovery::Retry,
            ),
            (
                EtcdError::Client(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                    "down",
                ))),
                Recovery::Retry,
            ),
        ];
        for (err, want) in cases {
            assert_eq!(classify(&err), want, "{err}");
        }
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
}
