//! Filling the event window from etcd's history at start, so clients that
//! reconnect with the versions they had keep resuming after a restart.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType as EtcdEventType, KeyValue, WatchOptions};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Etcd, EtcdError};
use crate::cache::Change;
use crate::object::{Event, Object, Resource, Revision};
use crate::telemetry::{EtcdRequest, ResourceMetrics};

/// The changes under a prefix before a list, and after it up to where the
/// reading stopped.
pub struct History {
    /// Every event in `(oldest, list revision]`, in order, with the
    /// previous state of each object.
    pub events: Vec<Event>,
    pub oldest: Revision,
    /// The history is complete up to here: the list revision, or an
    /// earlier revision etcd proved its objects the same at (keys created
    /// and deleted in between then come from the live watch).
    pub through: Revision,
    /// Changes after the list revision that arrived while reading history.
    pub live: Vec<Change>,
}

/// Reads the history of `resource` from up to `depth` revisions before
/// `listed` (or from etcd's compaction point), on a watch with previous
/// values. The watch ends with the reading: the live watch goes without
/// previous values, which would have etcd read and send every object twice.
///
/// etcd gives no marker for the end of history on a new watch (requested
/// progress notifications may run ahead of events before 3.4.31 / 3.5.13),
/// so the history counts as complete up to `listed` when an event after it
/// arrives, and up to the last event read when etcd proves its objects the
/// same there as at `listed`.
pub async fn read(
    etcd: &Etcd,
    metrics: &ResourceMetrics,
    resource: &Resource,
    listed: Revision,
    depth: u64,
    budget: Duration,
) -> Result<History, EtcdError> {
    let deadline = Instant::now() + budget;
    let mut from = listed.saturating_sub(depth).max(1);
    // etcd's compaction point, once a watch was refused for starting
    // before it: the oldest state etcd can still read.
    let mut compacted: Option<Revision> = None;
    let (start, end) = (resource.key_prefix(), resource.key_range_end());
    'open: loop {
        metrics.etcd_request(EtcdRequest::watch);
        let options = WatchOptions::new()
            .with_range(end.clone())
            .with_start_revision(from as i64)
            .with_progress_notify()
            .with_prev_key();
        // A request that times out under load (a storm of clients
        // reconnecting to a restarted instance) is tried again within the
        // budget: failing would start the cache without its window, and
        // every one of those clients with OUT_OF_RANGE.
        let mut stream = match etcd.watch(start.clone(), options).await {
            Ok(stream) => stream,
            Err(EtcdError::Timeout) if Instant::now() < deadline => continue 'open,
            Err(e) => return Err(e),
        };
        let (mut events, mut oldest, mut live) = (Vec::new(), from - 1, Vec::new());
        let mut seen = from - 1;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EtcdError::Timeout);
            }
            // A quiet stream is the moment to ask etcd whether anything
            // is still to come.
            let quiet =
                match tokio::time::timeout(left.min(Duration::from_millis(200)), stream.message())
                    .await
                {
                    Ok(Ok(Some(r))) => {
                        if r.canceled() {
                            match r.compact_revision() {
                                c if c > 0 && (c as Revision) > from => {
                                    debug!(
                                        compacted = c,
                                        "history starts at etcd's compaction point"
                                    );
                                    from = c as Revision;
                                    compacted = Some(from);
                                    continue 'open;
                                }
                                _ => {
                                    return Err(EtcdError::WatchCanceled(
                                        r.cancel_reason().to_owned(),
                                    ))
                                }
                            }
                        }
                        for e in r.events() {
                            let Some(kv) = e.kv() else { continue };
                            let revision = kv.mod_revision() as Revision;
                            if revision > listed {
                                live.extend(change(resource, metrics, kv, e.event_type()));
                                continue;
                            }
                            seen = revision;
                            match past_event(resource, kv, e.prev_kv(), e.event_type()) {
                                Past::Event(ev) => events.push(ev),
                                Past::Nothing => {}
                                // The previous state is gone from etcd: resumes
                                // from before this point cannot be exact.
                                Past::Unknown => {
                                    events.clear();
                                    oldest = revision;
                                }
                            }
                        }
                        false
                    }
                    Ok(Ok(None)) => return Err(EtcdError::StreamEnded),
                    Ok(Err(e)) => return Err(EtcdError::Client(e)),
                    Err(_) => true,
                };
            // The state the proof starts from must be one etcd can read: at
            // the compaction point, when no event after it came yet; the
            // history then vouches for nothing at or before it.
            let since = match compacted {
                Some(c) if seen < c => c,
                _ => seen,
            };
            let through = if !live.is_empty() || seen >= listed {
                Some(listed)
            } else if quiet
                && match etcd
                    .unchanged_between(metrics, &start, &end, since, Some(listed))
                    .await
                {
                    Ok((_, same)) => same,
                    Err(EtcdError::Timeout) => false,
                    Err(e) => return Err(e),
                }
            {
                if since > seen {
                    oldest = since;
                }
                Some(since)
            } else {
                None
            };
            if let Some(through) = through {
                return Ok(History {
                    events,
                    oldest,
                    through,
                    live,
                });
            }
        }
    }
}

enum Past {
    Event(Event),
    /// A key that never held a readable value.
    Nothing,
    /// A change whose previous state etcd no longer has.
    Unknown,
}

fn past_event(
    resource: &Resource,
    kv: &KeyValue,
    prev: Option<&KeyValue>,
    t: EtcdEventType,
) -> Past {
    let revision = kv.mod_revision() as Revision;
    let prev = prev.and_then(|p| super::decode(resource, p).ok());
    let object = match t {
        EtcdEventType::Put => super::decode(resource, kv).ok(),
        EtcdEventType::Delete => None,
    };
    let existed_before = match t {
        EtcdEventType::Put => kv.version() > 1,
        EtcdEventType::Delete => true,
    };
    if existed_before && prev.is_none() && (t == EtcdEventType::Delete || object.is_some()) {
        return Past::Unknown;
    }
    match Event::between(revision, prev.map(Arc::new), object.map(Arc::new)) {
        Some(event) => Past::Event(event),
        None => Past::Nothing,
    }
}

/// A watch event as a change to the cache; an undecodable new value is
/// counted, logged and becomes a deletion of whatever the cache held. A key
/// that is not UTF-8 is counted, logged and skipped.
pub fn change(
    resource: &Resource,
    metrics: &ResourceMetrics,
    kv: &KeyValue,
    t: EtcdEventType,
) -> Option<Change> {
    let revision = kv.mod_revision() as Revision;
    let object: Option<Object> = match t {
        EtcdEventType::Put => match super::decode(resource, kv) {
            Ok(o) => Some(o),
            Err(e) => {
                super::skip(metrics, kv.key(), revision, &e);
                None
            }
        },
        EtcdEventType::Delete => None,
    };
    let Ok(key) = std::str::from_utf8(kv.key()) else {
        metrics.undecodable.inc();
        warn!(key = ?String::from_utf8_lossy(kv.key()), "skipping key that is not UTF-8");
        return None;
    };
    Some(Change {
        revision,
        key: Arc::from(key),
        object,
    })
}
