//! The reflector of one resource: lists the prefix, then keeps one etcd
//! watch on it, feeding the cache's writer. Its loop is a state machine
//! stepped over an [`Upstream`], so each transition can be tested alone.

use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::revival::Revival;
use super::upstream::{EtcdUpstream, Listed, Notice, Upstream};
use super::{classify, EtcdError, Origin, Recovery};
use crate::cache::{CacheWriter, OverBudget};
use crate::object::Revision;
use crate::telemetry::{ReflectorState, ResourceMetrics};

/// The reflector's loop, one state at a time.
#[derive(Debug)]
enum State<W> {
    /// List the prefix (again) and install it in the cache.
    Listing,
    /// Open a watch for the changes after `revision`.
    Connecting { revision: Revision },
    /// Apply what the watch sends.
    Watching {
        watch: Box<W>,
        /// The id of the watch, once etcd said it is created.
        watch_id: Option<i64>,
    },
    /// Wait, then go on with `next`.
    Backoff { next: Box<State<W>> },
}

impl<W> State<W> {
    fn name(&self) -> &'static str {
        match self {
            State::Listing => "listing",
            State::Connecting { .. } => "connecting",
            State::Watching { .. } => "watching",
            State::Backoff { .. } => "backoff",
        }
    }

    fn shown(&self) -> ReflectorState {
        match self {
            State::Listing => ReflectorState::listing,
            State::Connecting { .. } => ReflectorState::connecting,
            State::Watching { .. } => ReflectorState::watching,
            State::Backoff { .. } => ReflectorState::backoff,
        }
    }
}

/// Keeps one resource's cache in step with its upstream.
struct Reflector<U: Upstream> {
    upstream: U,
    writer: CacheWriter,
    metrics: ResourceMetrics,
    backoff: Backoff,
    listed_once: bool,
    /// How many revisions before the first list to read into the window.
    history_depth: u64,
    /// The state last published in `watchproxy_reflector_state`.
    shown_state: Option<ReflectorState>,
}

/// Starts the reflector of a resource. The task exits when `shutdown` is
/// cancelled; etcd failures never end it.
pub fn spawn_reflector(
    origin: Origin,
    writer: CacheWriter,
    metrics: ResourceMetrics,
    history_depth: u64,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let resource = writer.cache().resource.clone();
    let span = tracing::info_span!("reflector", resource = %resource.name);
    match origin {
        Origin::Etcd(etcd) => {
            let etcd = EtcdUpstream {
                etcd: *etcd,
                resource,
                metrics: metrics.clone(),
            };
            spawn_with(etcd, writer, metrics, history_depth, shutdown, span)
        }
        Origin::Tier(tier) => spawn_with(*tier, writer, metrics, history_depth, shutdown, span),
    }
}

/// Runs a reflector over `upstream` in a task of its own.
fn spawn_with<U: Upstream>(
    upstream: U,
    writer: CacheWriter,
    metrics: ResourceMetrics,
    history_depth: u64,
    shutdown: CancellationToken,
    span: tracing::Span,
) -> tokio::task::JoinHandle<()> {
    let reflector = Reflector::new(upstream, writer, metrics, history_depth);
    tokio::spawn(reflector.run(shutdown).instrument(span))
}

impl<U: Upstream> Reflector<U> {
    fn new(upstream: U, writer: CacheWriter, metrics: ResourceMetrics, history_depth: u64) -> Self {
        Self {
            upstream,
            writer,
            metrics,
            backoff: Backoff::default(),
            listed_once: false,
            history_depth,
            shown_state: None,
        }
    }

    async fn run(mut self, shutdown: CancellationToken) {
        let mut state = State::Listing;
        loop {
            state = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = self.step(state) => next,
            };
        }
    }

    async fn step(&mut self, state: State<U::Watch>) -> State<U::Watch> {
        let shown = state.shown();
        // Watching lasts many steps (one per etcd response); publish changes only.
        if self.shown_state != Some(shown) {
            self.metrics.reflector_state(shown);
            self.shown_state = Some(shown);
        }
        match state {
            State::Listing => match self.list().await {
                Ok(next) => {
                    self.answered();
                    next
                }
                Err(e) => self.recover(e, State::Listing),
            },
            State::Connecting { revision } => match self.upstream.watch(revision).await {
                Ok(watch) => State::Watching {
                    watch: Box::new(watch),
                    watch_id: None,
                },
                Err(e) => self.recover(e, State::Connecting { revision }),
            },
            State::Watching {
                mut watch,
                mut watch_id,
            } => match self.upstream.next(&mut watch).await {
                Ok(notice) => {
                    self.answered();
                    match self.apply(notice, &mut watch_id) {
                        Ok(()) => State::Watching { watch, watch_id },
                        // The watch goes; a list is tried again later.
                        Err(over) => self.recover(over.into(), State::Listing),
                    }
                }
                Err(e) => {
                    let revision = self.writer.cache().progress().revision;
                    self.recover(e, State::Connecting { revision })
                }
            },
            State::Backoff { next } => {
                let delay = self.backoff.next_delay();
                debug!(?delay, next = next.name(), "backing off");
                self.wait_out(delay).await;
                *next
            }
        }
    }

    /// The upstream answered: the backoff starts over, and after a failure
    /// the other reflectors of the origin learn it is back.
    fn answered(&mut self) {
        if self.backoff.reset() {
            if let Some(revival) = self.upstream.revival() {
                revival.announce();
            }
        }
    }

    /// Waits `delay`, or less once the upstream is known to answer again:
    /// another reflector of the origin got through, or a probe, one per
    /// [`PROBE_EVERY`](super::revival::PROBE_EVERY) for the whole origin, did.
    async fn wait_out(&mut self, delay: Duration) {
        let Some(revival) = self.upstream.revival() else {
            return tokio::time::sleep(delay).await;
        };
        let mut woken = revival.subscribe();
        let until = tokio::time::Instant::now() + delay;
        loop {
            let probe_at = tokio::time::Instant::now() + Revival::probe_delay();
            tokio::select! {
                _ = tokio::time::sleep_until(until.min(probe_at)) => {}
                Ok(()) = woken.changed() => {
                    tokio::time::sleep(Revival::wake_jitter()).await;
                    return;
                }
            }
            if tokio::time::Instant::now() >= until {
                return;
            }
            if revival.may_probe() && self.upstream.probe().await {
                debug!("the upstream answers again");
                revival.announce();
                return;
            }
        }
    }

    fn recover(&mut self, err: EtcdError, retry: State<U::Watch>) -> State<U::Watch> {
        let next = match classify(&err) {
            Recovery::Retry => retry,
            Recovery::Relist => State::Listing,
        };
        warn!(error = %err, next = next.name(), "cannot go on; backing off");
        State::Backoff {
            next: Box::new(next),
        }
    }

    /// Lists the whole prefix in pages cut from one revision. The first
    /// list also reads the history before it into the event window; a later
    /// list (after compaction) turns its difference with the cache into
    /// events instead.
    async fn list(&mut self) -> Result<State<U::Watch>, EtcdError> {
        let relist = self.listed_once;
        let listed = if !relist && self.history_depth > 0 {
            (self.upstream.list_with_history(self.history_depth).await)
                .map(|(listed, history)| (listed, Some(history)))
        } else {
            self.upstream.list().await.map(|listed| (listed, None))
        };
        let (
            Listed {
                objects,
                revision,
                changed,
            },
            history,
        ) = match listed {
            Err(EtcdError::OverBudget(over)) => {
                self.writer.refuse(over);
                return Err(over.into());
            }
            other => other?,
        };
        self.listed_once = true;
        if relist {
            self.metrics.relists.inc();
        }
        info!(objects = objects.len(), revision, relist, "listed");
        if let Some(history) = history {
            match history {
                Ok(h) => {
                    info!(events = h.events.len(), oldest = h.oldest, "read history");
                    self.writer.replace_with_history(
                        objects, revision, changed, h.oldest, h.through, h.events,
                    )?;
                    self.writer.apply(h.live)?;
                    let revision = self.writer.cache().progress().revision;
                    return Ok(State::Connecting { revision });
                }
                Err(e) => warn!(error = %e, "could not read history; resumes start at the list"),
            }
        }
        self.writer.replace_changed(objects, revision, changed)?;
        Ok(State::Connecting { revision })
    }

    fn apply(&mut self, notice: Notice, watch_id: &mut Option<i64>) -> Result<(), OverBudget> {
        match notice {
            Notice::Created { watch_id: id } => *watch_id = Some(id),
            // Only the periodic notification of our own watch is ordered
            // with its events; a requested one (watch id -1) may run ahead
            // of undelivered events on etcd before 3.4.31 / 3.5.13.
            Notice::Progress {
                watch_id: id,
                revision,
            } => {
                if *watch_id == Some(id) {
                    self.writer.progress(revision);
                }
            }
            Notice::Changes(changes) => return self.writer.apply(changes),
        }
        Ok(())
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

    /// Starts over; whether it was backing off.
    fn reset(&mut self) -> bool {
        std::mem::replace(&mut self.current, Self::MIN) > Self::MIN
    }

    fn next_delay(&mut self) -> Duration {
        let d = self.current.mul_f64(rand::rng().random_range(0.5..=1.0));
        self.current = (self.current * 2).min(Self::MAX);
        d
    }
}

#[cfg(test)]
mod lag_tests;
#[cfg(test)]
mod tests;
