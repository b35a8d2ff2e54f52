//! watchproxy: a watch cache in front of etcd.
//!
//! ```text
//! etcd ──(1 watch per prefix)──> source (reflector) ──> cache (store + event window)
//!                                                          │
//!            List / Get ──> api <── snapshots ─────────────┤
//!                                                          ▼
//!            Watch ──────> api <── watcher queues <── dispatch (predicate per watcher)
//! ```
//!
//! Each configured resource (an etcd key prefix) has one reflector holding
//! one etcd watch, one [`cache::WatchCache`] and one dispatcher; any number
//! of gRPC clients list and watch it without reaching etcd.

pub mod access;
pub mod api;
/// Stage 2: the store, its indexes and snapshots, the event window.
pub mod cache;
/// Resources, limits, listeners: the YAML file.
pub mod config;
/// Stage 3: fan-out to watchers through the trigger index and inboxes.
pub mod dispatch;
pub mod etcd_api;
/// The generated types of etcd's own API, for its facade.
pub mod etcdpb;
pub mod kubernetes_api;
/// The boundary types: resource, object, event, resource version.
pub mod object;
/// The generated `watchproxy.v1` types.
pub mod pb;
/// Label and field selectors: the predicate of a request.
pub mod selector;
pub mod server;
/// Stage 1, the etcd side: reflectors, freshness checks, etcd reads.
pub mod source;
/// Logs, traces and Prometheus metrics.
pub mod telemetry;

#[cfg(test)]
mod fuzzing;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use api::{Api, InitialStates, Served};
use cache::WatchCache;
use config::Config;
use dispatch::Dispatcher;
use etcd_api::EtcdApi;
use object::Resource;
use server::router::Faces;
use source::{spawn_freshness, spawn_reflector, spawn_state_check, Etcd, Origin, Tier};
use telemetry::Metrics;

/// The sockets the service serves on, bound by the caller (so tests can
/// bind port 0).
pub struct Listeners {
    pub grpc: TcpListener,
    /// Serves `/metrics`.
    pub metrics: Option<TcpListener>,
    /// Serves only `grpc.health.v1`, in plain text.
    pub health: Option<TcpListener>,
    /// Serves Kubernetes' API, when `kubernetes_api` is enabled.
    pub kubernetes: Option<TcpListener>,
}

/// How often the dispatchers look for due bookmarks.
const BOOKMARK_TICK: Duration = Duration::from_millis(250);

/// Runs the service until `shutdown` is cancelled, then drains: open
/// watches end with UNAVAILABLE and the version to resume from, and every
/// task has exited when this returns.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Metrics::default();
    // Files and rules that cannot be used fail the start before anything
    // runs.
    let client_ca = Arc::new(access::ClientCa::default());
    let tls = (config.tls.as_ref())
        .map(|files| server::tls::Tls::load(files, client_ca.clone(), metrics.clone()))
        .transpose()?;
    let resources: Vec<Resource> = config.resources.iter().map(Resource::from).collect();
    let auth = access::Auth::new(&config, &resources, client_ca, metrics.clone())?;
    let sealer = match &config.continue_token_key_file {
        Some(path) => {
            let key = std::fs::read(path)
                .with_context(|| format!("reading continue_token_key_file {}", path.display()))?;
            anyhow::ensure!(
                key.len() >= 32,
                "continue_token_key_file {} holds {} bytes; a key needs at least 32",
                path.display(),
                key.len()
            );
            api::Sealer::new(&key)
        }
        None => api::Sealer::random(),
    };
    let mut tasks = Vec::new();
    let served = start_resources(&config, &resources, &metrics, &shutdown, &mut tasks).await?;

    if let Some(listener) = listeners.metrics {
        info!(addr = %listener.local_addr()?, "serving /metrics");
        tasks.push(telemetry::spawn_metrics_server(
            listener,
            metrics.clone(),
            shutdown.clone(),
        ));
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    let health_service = server::router::HealthRoute::new(health_service, &config.limits);
    if let Some(listener) = listeners.health {
        info!(addr = %listener.local_addr()?, "serving health checks in plain text");
        tasks.push(server::spawn_health_only(
            listener,
            health_service.clone(),
            &config.limits,
            shutdown.clone(),
        ));
    }
    let caches = served.values().map(|s| s.cache.clone()).collect();
    tasks.push(server::health::spawn_health(
        health,
        caches,
        shutdown.clone(),
    ));
    let base = base_routes(&config, health_service)?;
    let api = Api::new(
        served,
        config.watch.freshness_wait,
        config.limits.max_watchers,
        metrics.clone(),
        shutdown.clone(),
    )
    .with_auth(auth)
    .with_continue_key(sealer)
    .with_user_limits(access::limits::UserLimits::new(&config.limits))
    .with_watch_compression(&config.watch.compression);
    // Expiries, and the token and key files, end the watches they must.
    tasks.push(api.authority().spawn_guard(shutdown.clone()));
    tasks.extend(access::reconfigure::spawn_config_reload(
        config.clone(),
        api.authority().clone(),
        api.user_limits().clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    info!(
        addr = %listeners.grpc.local_addr()?,
        resources = config.resources.len(),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        serve_path = ?config.watch.serve_path,
        "serving gRPC"
    );
    let etcd = (config.etcd_api.enabled).then(|| EtcdApi::new(api.clone(), &config.etcd_api));
    if etcd.is_some() {
        info!("serving etcd's read API (KV.Range, Watch) beside watchproxy.v1");
    }
    let mut api_addrs = vec![listeners.grpc.local_addr()?];
    if config.kubernetes_api.enabled {
        let listener =
            (listeners.kubernetes).context("kubernetes_api is enabled: its listener is needed")?;
        api_addrs.push(listener.local_addr()?);
        let (catalog, left_out) = kubernetes_api::catalog::Catalog::new(&config.resources)?;
        if !left_out.is_empty() {
            warn!(
                resources = left_out.join(", "),
                "not on Kubernetes' API: raw values, or a prefix that names no kind; give each a kubernetes section to serve it there"
            );
        }
        info!(addr = %listener.local_addr()?, "serving Kubernetes' read API (discovery, get, list, watch)");
        let face = kubernetes_api::KubernetesApi::new(api.clone(), catalog);
        tasks.push(server::kubernetes::spawn(
            listener,
            tls.clone(),
            face,
            &config.limits,
            config.shutdown_grace,
            shutdown.clone(),
        ));
    }
    let faces = Faces { api, etcd };
    let routes = server::router::routes(&faces, base, &config.limits);
    if let Some(tls) = &tls {
        // A client CA read again judges open connections' certificates.
        let authority = Arc::downgrade(faces.api.authority());
        let judge_again = move || {
            if let Some(authority) = authority.upgrade() {
                authority.credentials_changed();
            }
        };
        tasks.push(tls.clone().spawn_reload(shutdown.clone(), judge_again));
    }
    tasks.extend(server::spawn_insecure_warning(
        &api_addrs,
        &config,
        &metrics,
        shutdown.clone(),
    ));
    let serve = server::serve(
        listeners.grpc,
        tls,
        faces,
        routes,
        &config.limits,
        &config.watch,
        shutdown.clone(),
    );
    // After shutdown starts, open calls get the grace period to finish.
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(config.shutdown_grace).await;
    };
    tokio::select! {
        () = serve => {}
        _ = grace => warn!(grace = ?config.shutdown_grace, "grace period over; closing the remaining calls"),
    }

    shutdown.cancel();
    for t in tasks {
        let _ = t.await;
    }
    info!("stopped");
    Ok(())
}

/// Starts each configured resource: its reflector on etcd or an upstream
/// watchproxy, its cache and dispatcher, its revision checks, and the
/// bookmark ticks of all of them. The tasks go to `tasks`.
async fn start_resources(
    config: &Config,
    resources: &[Resource],
    metrics: &Metrics,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<HashMap<String, Served>> {
    let upstreams: Vec<Option<&String>> = (config.resources.iter())
        .map(|rc| rc.upstream.as_ref().or(config.upstream.as_ref()))
        .collect();
    // An edge whose every resource comes from another watchproxy never
    // connects to etcd.
    let etcd = match upstreams.iter().any(Option::is_none) {
        true => Some(Etcd::from_config(&config.etcd).await?),
        false => None,
    };
    for (r, upstream) in resources.iter().zip(&upstreams) {
        if let (Some(etcd), None) = (&etcd, upstream) {
            etcd.check_readable(&r.key_prefix(), &r.key_range_end())
                .await?;
        }
    }

    let mut served = HashMap::new();
    let mut dispatchers = Vec::new();
    for ((rc, resource), upstream) in config.resources.iter().zip(resources).zip(upstreams) {
        let resource = Arc::new(resource.clone());
        let m = metrics.resource(&resource.name);
        let dispatcher = Dispatcher::new(
            config.watch.watcher_queue,
            config.watch.bookmark_interval,
            m.clone(),
        )
        .with_encoder(Arc::new(api::wire::encode_event));
        let (cache, writer) = WatchCache::new(resource.clone(), &rc.cache, dispatcher, m.clone());
        dispatchers.push(cache.dispatcher().clone());
        let origin = match upstream {
            Some(url) => Origin::Tier(Box::new(Tier::new(
                url,
                config.upstream_tls.as_ref(),
                config.upstream_token_file.as_deref(),
                resource.clone(),
                m.clone(),
            )?)),
            None => Origin::Etcd(Box::new(
                etcd.clone()
                    .context("etcd is connected for this resource")?,
            )),
        };
        tasks.push(spawn_reflector(
            origin.clone(),
            writer,
            m.clone(),
            rc.cache.max_events as u64,
            shutdown.clone(),
        ));
        let (freshness, checker) =
            spawn_freshness(origin.clone(), cache.clone(), m.clone(), shutdown.clone());
        tasks.push(checker);
        let every = config.watch.state_check_interval;
        if let (Origin::Etcd(etcd), false) = (&origin, every.is_zero()) {
            let (etcd, cache, m) = ((**etcd).clone(), cache.clone(), m.clone());
            tasks.push(spawn_state_check(etcd, cache, m, every, shutdown.clone()));
        }
        served.insert(
            resource.name.clone(),
            Served {
                cache,
                origin,
                freshness,
                metrics: m.clone(),
                watch_slots: Arc::new(tokio::sync::Semaphore::new(
                    config.limits.max_watchers_per_resource,
                )),
                initial_states: Arc::new(InitialStates::new(config.watch.share_initial_state, m)),
            },
        );
    }

    tasks.push(dispatch::spawn_bookmarks(
        dispatchers,
        BOOKMARK_TICK,
        shutdown.clone(),
    ));

    Ok(served)
}

/// Health and server reflection, which every listener of the main port
/// serves before the faces.
fn base_routes(
    config: &Config,
    health: server::router::HealthRoute,
) -> anyhow::Result<tonic::service::Routes> {
    let reflection = || {
        let builder = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // The error details every status carries, so that grpcurl and
            // other reflection clients show ErrorInfo decoded.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
        match config.etcd_api.enabled {
            true => builder.register_encoded_file_descriptor_set(etcdpb::FILE_DESCRIPTOR_SET),
            false => builder,
        }
    };
    // Its requests stream for as long as a client explores: each message
    // bounded, read as it comes.
    let reflection_v1 = reflection()
        .build_v1()
        .context("building the reflection service")?
        .max_decoding_message_size(server::router::REFLECTION_REQUEST_BYTES);
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .context("building the reflection service")?
        .max_decoding_message_size(server::router::REFLECTION_REQUEST_BYTES);

    Ok(tonic::service::Routes::new(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}
