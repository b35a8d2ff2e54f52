//! The etcd side: a reflector per resource lists the prefix, then keeps one
//! etcd watch on it (or follows another watchproxy), feeding the watch
//! cache; freshness checks and reads at past revisions for the API.

mod audit;
mod connect;
mod etcd;
mod freshness;
mod history;
mod read;
mod reflector;
mod revival;
mod tier;
mod upstream;

pub use audit::spawn_state_check;
pub use etcd::{Etcd, EtcdError};
pub use freshness::{spawn_freshness, Freshness};
pub use read::{ObjectsPage, PageStart};
pub use reflector::spawn_reflector;
pub use tier::Tier;

/// Where a resource's objects come from: etcd, or another watchproxy
/// (`upstream:`). The reflector follows it; freshness checks and reads at
/// revisions the cache cannot show ask it too, so an edge never reads etcd.
#[derive(Clone)]
pub enum Origin {
    Etcd(Box<Etcd>),
    Tier(Box<Tier>),
}

use crate::object::{DecodeError, KvMeta, Object, Resource, Revision};
use crate::telemetry::ResourceMetrics;

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
        EtcdError::Compacted { .. } | EtcdError::OverBudget(_) | EtcdError::UpstreamResynced => {
            Recovery::Relist
        }
        EtcdError::Client(_)
        | EtcdError::Timeout
        | EtcdError::FutureRevision
        | EtcdError::WatchCanceled(_)
        | EtcdError::StreamEnded
        | EtcdError::Upstream(_) => Recovery::Retry,
    }
}

/// An etcd pair as an object, with what etcd keeps of its key.
pub(crate) fn decode(
    resource: &Resource,
    kv: &etcd_client::KeyValue,
) -> Result<Object, DecodeError> {
    let o = resource.decode(kv.key(), kv.value(), kv.mod_revision() as Revision)?;
    Ok(o.stored_as(KvMeta {
        create_revision: kv.create_revision() as Revision,
        version: kv.version(),
        lease: kv.lease(),
    }))
}

/// Counts and logs a pair that could not become an object. A value the
/// apiserver encrypted at rest is named as such, never as corruption.
pub(crate) fn skip(metrics: &ResourceMetrics, key: &[u8], revision: Revision, e: &DecodeError) {
    let key = String::from_utf8_lossy(key);
    match e {
        DecodeError::Encrypted(provider) => {
            metrics.encrypted.inc();
            tracing::warn!(%key, revision, %provider, "skipping a value encrypted at rest: watchproxy reads etcd directly and holds no key to decrypt it");
        }
        _ => {
            metrics.undecodable.inc();
            tracing::warn!(%key, revision, error = %e, "skipping undecodable value");
        }
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
            (EtcdError::UpstreamResynced, Recovery::Relist),
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
}
