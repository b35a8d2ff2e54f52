//! `grpc.health.v1`: overall and per-resource serving status.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::cache::WatchCache;

/// The health service name of the API itself.
pub const SERVICE: &str = "watchproxy.v1.WatchProxy";

/// SERVING while the process runs (until shutdown), whatever etcd does:
/// for liveness probes, which must not restart a pod that waits for etcd.
pub const LIVENESS: &str = "liveness";

/// The health service name of one resource, e.g. `watchproxy.v1.WatchProxy/pods`.
pub fn resource_service(resource: &str) -> String {
    format!("{SERVICE}/{resource}")
}

/// Reports each resource SERVING once its cache is ready, and the server
/// ("" and the API) once all are; everything NOT_SERVING at shutdown. The
/// task exits after marking shutdown.
pub fn spawn_health(
    reporter: HealthReporter,
    caches: Vec<Arc<WatchCache>>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let resources: Vec<String> = caches
            .iter()
            .map(|c| resource_service(&c.resource.name))
            .collect();
        let all: Vec<&str> = ["", SERVICE]
            .into_iter()
            .chain(resources.iter().map(String::as_str))
            .collect();
        set(&reporter, &all, ServingStatus::NotServing).await;
        set(&reporter, &[LIVENESS], ServingStatus::Serving).await;
        let ready_all = async {
            for (cache, name) in caches.iter().zip(&resources) {
                cache.wait_ready().await;
                set(&reporter, &[name], ServingStatus::Serving).await;
            }
            set(&reporter, &["", SERVICE], ServingStatus::Serving).await;
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = ready_all => shutdown.cancelled().await,
        }
        set(&reporter, &all, ServingStatus::NotServing).await;
        set(&reporter, &[LIVENESS], ServingStatus::NotServing).await;
    })
}

async fn set(reporter: &HealthReporter, names: &[&str], status: ServingStatus) {
    for name in names {
        reporter.set_service_status(*name, status).await;
    }
}
