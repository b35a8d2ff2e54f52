//! A sampled, periodic check that a cache holds etcd's objects: a few of
//! its keys' versions and its number of keys against etcd's at the cache's
//! revision, in one request. A difference is a defect, logged and counted,
//! so an operator learns of it from the service.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, TxnOp};
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, Instrument};

use super::{Etcd, EtcdError};
use crate::cache::WatchCache;
use crate::object::Revision;
use crate::telemetry::{EtcdRequest, ResourceMetrics};

/// Keys compared per check.
const SAMPLE: usize = 8;

/// Starts the periodic check of a resource read from etcd; the task exits
/// on `shutdown`.
pub fn spawn_state_check(
    etcd: Etcd,
    cache: Arc<WatchCache>,
    metrics: ResourceMetrics,
    every: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let span = tracing::info_span!("state_check", resource = %cache.resource.name);
    tokio::spawn(
        async move {
            loop {
                // Jittered, so the resources of many replicas spread out.
                let wait = every.mul_f64(rand::rng().random_range(0.5..=1.5));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                match check(&etcd, &cache, &metrics).await {
                    Ok(_) => {}
                    Err(e) => debug!(error = %e, "state check skipped"),
                }
            }
        }
        .instrument(span),
    )
}

/// One check; the differences found (each logged and counted).
pub async fn check(
    etcd: &Etcd,
    cache: &WatchCache,
    metrics: &ResourceMetrics,
) -> Result<usize, EtcdError> {
    let Some(sample) = cache.sample(SAMPLE) else {
        return Ok(0);
    };
    let resource = &cache.resource;
    let (start, end) = (resource.key_prefix(), resource.key_range_end());
    let at = sample.revision as i64;
    let mut ops = vec![TxnOp::get(
        start.as_str(),
        Some(
            GetOptions::new()
                .with_range(end)
                .with_count_only()
                .with_revision(at),
        ),
    )];
    ops.extend(sample.keys.iter().map(|(key, _)| {
        TxnOp::get(
            key.as_str(),
            Some(GetOptions::new().with_keys_only().with_revision(at)),
        )
    }));
    metrics.etcd_request(EtcdRequest::state_check);
    let (_, answers) = etcd.reads(ops).await?;
    let mut gets = answers.into_iter();
    let count = gets.next().map_or(0, |g| g.count()) as usize;
    let mut differences = 0;
    if count != sample.count {
        differences += 1;
        error!(
            revision = sample.revision,
            cache = sample.count,
            etcd = count,
            "the cache holds another number of keys than etcd at its revision"
        );
    }
    for ((key, version), got) in sample.keys.iter().zip(gets) {
        let etcd_version = got.kvs().first().map(|kv| kv.mod_revision() as Revision);
        if etcd_version != Some(*version) {
            differences += 1;
            error!(
                revision = sample.revision,
                key,
                cache = version,
                etcd = ?etcd_version,
                "the cache holds a key at another version than etcd at its revision"
            );
        }
    }
    metrics.state_mismatch.inc_by(differences as u64);
    Ok(differences)
}

#[cfg(test)]
mod tests {
    use watchproxy_testkit::Etcd as TestEtcd;

    use super::*;
    use crate::config::CacheConfig;
    use crate::dispatch::Dispatcher;
    use crate::object::Resource;
    use crate::telemetry::Metrics;

    #[tokio::test]
    async fn a_cache_that_differs_from_etcd_is_caught_and_counted() {
        let server = TestEtcd::start().await;
        let mut client = server.client().await;
        let mut written = Vec::new();
        for k in 0..20 {
            let r = client
                .put(format!("/p/ns/k{k:02}"), "v", None)
                .await
                .unwrap();
            written.push((
                format!("/p/ns/k{k:02}"),
                r.header().unwrap().revision() as Revision,
            ));
        }
        let revision = written.last().unwrap().1;
        let etcd = Etcd::connect(
            std::slice::from_ref(&server.client_url),
            Duration::from_secs(5),
            100,
        )
        .await
        .unwrap();
        let resource = Arc::new(Resource::raw_for_tests());
        let metrics = Metrics::default().resource("p");
        let cache_with = |objects: &[(String, Revision)]| {
            let d = Dispatcher::new(4, Duration::from_secs(60), metrics.clone());
            let (cache, mut writer) = WatchCache::new(
                resource.clone(),
                &CacheConfig::default(),
                d,
                metrics.clone(),
            );
            let objects = (objects.iter())
                .map(|(k, v)| resource.decode(k.as_bytes(), b"v", *v).unwrap())
                .collect();
            writer.replace(objects, revision).unwrap();
            (cache, writer)
        };

        let (right, _writer) = cache_with(&written);
        assert_eq!(check(&etcd, &right, &metrics).await.unwrap(), 0);

        // Every key at a version that is not its own, and one missing.
        let wrong: Vec<_> = written[1..]
            .iter()
            .map(|(k, v)| (k.clone(), v - 1))
            .collect();
        let (wrong, _writer) = cache_with(&wrong);
        assert_eq!(check(&etcd, &wrong, &metrics).await.unwrap(), 1 + SAMPLE);
        assert_eq!(metrics.state_mismatch.get(), 1 + SAMPLE as u64);
    }
}
