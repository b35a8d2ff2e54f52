//! Where a read is answered from under Kubernetes' resource version rules:
//! the cache once it is ready and has caught up to the version asked for
//! (or, unset, to etcd's revision at the time of the call), else the
//! resource's origin (etcd, or the upstream watchproxy).

use std::time::Duration;

use tokio::time::Instant;

use super::error::ApiError;
use super::{Api, Served};
use crate::cache::Snapshot;
use crate::object::{RequestedVersion, Revision};

/// Where a read is answered from.
pub enum ReadFrom {
    /// The cache, at the snapshot's revision.
    Cache(Snapshot),
    /// The origin at this revision: the cache did not catch up in time.
    Origin(Revision),
}

impl Api {
    /// Fails at once while the first list is not in: the client gets
    /// UNAVAILABLE with retry advice instead of a call held for the wait
    /// budget.
    async fn ready(&self, s: &Served) -> Result<(), ApiError> {
        if s.cache.progress().ready {
            return Ok(());
        }
        let resource = s.cache.resource.name.clone();
        Err(match s.cache.over_budget() {
            Some(over) => ApiError::OverBudget {
                resource,
                bytes: over.bytes,
                budget: over.budget,
            },
            None => ApiError::NotReady { resource },
        })
    }

    /// Brings the cache to `min`, or (no `min`) to etcd's revision at the
    /// time of the call, learned from a check shared with concurrent reads.
    /// If the cache does not get there within `freshness_wait`, a version
    /// etcd has not reached is "too large"; otherwise the read falls back
    /// to the origin at etcd's current revision (counted).
    pub async fn catch_up(&self, s: &Served, min: Option<Revision>) -> Result<ReadFrom, ApiError> {
        self.ready(s).await?;
        let cache = &s.cache;
        if min.is_some_and(|m| cache.progress().valid_through >= m) {
            return Ok(ReadFrom::Cache(cache.snapshot()));
        }
        let deadline = Instant::now() + self.freshness_wait;
        let mut target = min;
        loop {
            // Each check also advances an idle cache that etcd proves
            // unchanged, so waiting below ends at once in that case.
            let now = s.freshness.current_revision().await?;
            let target = *target.get_or_insert(now);
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(250));
            if cache.wait_for(target, step).await.is_ok() {
                return Ok(ReadFrom::Cache(cache.snapshot()));
            }
            if Instant::now() >= deadline {
                return match min {
                    Some(requested) if requested > now => Err(ApiError::TooLarge {
                        requested,
                        current: cache.progress().revision,
                    }),
                    _ => {
                        s.metrics.consistent_read_fallbacks.inc();
                        Ok(ReadFrom::Origin(now))
                    }
                };
            }
        }
    }

    /// Where to answer a read at a request's resource version
    /// (not-older-than rules).
    pub async fn source_for(
        &self,
        s: &Served,
        version: RequestedVersion,
    ) -> Result<ReadFrom, ApiError> {
        match version {
            RequestedVersion::Latest => self.catch_up(s, None).await,
            RequestedVersion::At(n) => self.catch_up(s, Some(n)).await,
            RequestedVersion::Any => {
                self.ready(s).await?;
                Ok(ReadFrom::Cache(s.cache.snapshot()))
            }
        }
    }

    /// A snapshot of the cache for a watch, which cannot fall back to etcd.
    pub async fn cache_for(
        &self,
        s: &Served,
        version: RequestedVersion,
    ) -> Result<Snapshot, ApiError> {
        match self.source_for(s, version).await? {
            ReadFrom::Cache(snapshot) => Ok(snapshot),
            ReadFrom::Origin(_) => Err(ApiError::NotFresh {
                resource: s.cache.resource.name.clone(),
            }),
        }
    }
}
