//! Prometheus metrics: the families, registered once, and each
//! resource's handles to them; the `/metrics` server.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use prometheus_client::registry::Unit;

use super::delivery::{delivery_histogram, DeliveryFamily, DeliveryLatency, ServePathLabel};
use super::http2::Http2Metrics;
use super::labels::{
    BehindLabels, CallLabel, CallLabels, DeniedLabels, EndLabels, EtcdLabels, OutcomeLabels,
    ReasonLabels, ResourceLabel, StateLabels,
};
pub use super::labels::{EndReason, EtcdRequest, ReflectorState, TlsOutcome};
use super::process::ProcessCollector;
use super::security::SecurityMetrics;

/// All metric families, registered once; [`Metrics::resource`] hands out
/// the per-resource series.
#[derive(Clone)]
pub struct Metrics {
    pub(super) registry: Arc<Registry>,
    pub(super) events_received: Family<ResourceLabel, Counter>,
    pub(super) deliveries: Family<ResourceLabel, Counter>,
    pub(super) encodings: Family<ResourceLabel, Counter>,
    pub(super) initial_snapshots: Family<ResourceLabel, Counter>,
    pub(super) initial_snapshots_shared: Family<ResourceLabel, Counter>,
    pub(super) initial_snapshot_bytes: Family<ResourceLabel, Counter>,
    pub(super) initial_snapshot_compressed_bytes: Family<ResourceLabel, Counter>,
    pub(super) fell_behind: Family<ResourceLabel, Counter>,
    pub(super) behind: Family<ResourceLabel, Gauge>,
    pub(super) behind_ended: Family<BehindLabels, Counter>,
    pub(super) replayed: Family<ResourceLabel, Counter>,
    pub(super) undecodable: Family<ResourceLabel, Counter>,
    pub(super) encrypted: Family<ResourceLabel, Counter>,
    pub(super) relists: Family<ResourceLabel, Counter>,
    pub(super) watchers: Family<ResourceLabel, Gauge>,
    pub(super) watchers_ended: Family<EndLabels, Counter>,
    pub(super) etcd_requests: Family<EtcdLabels, Counter>,
    pub(super) cache_objects: Family<ResourceLabel, Gauge>,
    pub(super) cache_revision: Family<ResourceLabel, Gauge>,
    pub(super) window_events: Family<ResourceLabel, Gauge>,
    pub(super) window_capacity: Family<ResourceLabel, Gauge>,
    pub(super) cache_bytes: Family<ResourceLabel, Gauge>,
    pub(super) cache_max_bytes: Family<ResourceLabel, Gauge>,
    pub(super) window_bytes: Family<ResourceLabel, Gauge>,
    pub(super) snapshot_bytes: Family<ResourceLabel, Gauge>,
    pub(super) over_budget: Family<ResourceLabel, Gauge>,
    pub(super) window_shed: Family<ResourceLabel, Counter>,
    pub(super) consistent_read_fallbacks: Family<ResourceLabel, Counter>,
    pub(super) freshness_checks: Family<ResourceLabel, Counter>,
    pub(super) state_mismatch: Family<ResourceLabel, Counter>,
    pub(super) cache_lag: Family<ResourceLabel, Gauge>,
    pub(super) reflector_state: Family<StateLabels, Gauge>,
    pub(super) calls: Family<CallLabels, Histogram, fn() -> Histogram>,
    pub(super) delivery: DeliveryFamily,
    pub(super) tls_reloads: Family<OutcomeLabels, Counter>,
    pub(super) tls_handshakes: Family<OutcomeLabels, Counter>,
    pub(super) auth_failures: Family<ReasonLabels, Counter>,
    pub(super) authz_denied: Family<DeniedLabels, Counter>,
    pub(super) etcd_api_forwarded: Family<CallLabel, Counter>,
    /// The HTTP/2 server's.
    pub http2: Http2Metrics,
    /// The configuration's, and the listener's exposure.
    pub security: SecurityMetrics,
}

fn call_histogram() -> Histogram {
    // 0.25 ms to about 16 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        (root.sub_registry_with_prefix("process")).register_collector(Box::new(ProcessCollector));
        let r = root.sub_registry_with_prefix("watchproxy");
        r.register(
            "build",
            "The running build: its version and git commit",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("git", env!("WATCHPROXY_GIT")),
            ]),
        );
        let m = Self {
            registry: Arc::default(),
            tls_reloads: Family::default(),
            tls_handshakes: Family::default(),
            auth_failures: Family::default(),
            authz_denied: Family::default(),
            etcd_api_forwarded: Family::default(),
            events_received: Family::default(),
            deliveries: Family::default(),
            encodings: Family::default(),
            initial_snapshots: Family::default(),
            initial_snapshots_shared: Family::default(),
            initial_snapshot_bytes: Family::default(),
            initial_snapshot_compressed_bytes: Family::default(),
            fell_behind: Family::default(),
            behind: Family::default(),
            behind_ended: Family::default(),
            replayed: Family::default(),
            undecodable: Family::default(),
            encrypted: Family::default(),
            relists: Family::default(),
            watchers: Family::default(),
            watchers_ended: Family::default(),
            etcd_requests: Family::default(),
            cache_objects: Family::default(),
            cache_revision: Family::default(),
            window_events: Family::default(),
            window_capacity: Family::default(),
            cache_bytes: Family::default(),
            cache_max_bytes: Family::default(),
            window_bytes: Family::default(),
            snapshot_bytes: Family::default(),
            over_budget: Family::default(),
            window_shed: Family::default(),
            consistent_read_fallbacks: Family::default(),
            freshness_checks: Family::default(),
            state_mismatch: Family::default(),
            cache_lag: Family::default(),
            reflector_state: Family::default(),
            calls: Family::new_with_constructor(call_histogram as fn() -> Histogram),
            delivery: Family::new_with_constructor(delivery_histogram as fn() -> Histogram),
            http2: Http2Metrics::default(),
            security: SecurityMetrics::default(),
        };
        m.http2.register(r);
        m.security.register(r);
        r.register(
            "events_received",
            "Events received from etcd watches",
            m.events_received.clone(),
        );
        r.register(
            "deliveries",
            "Events and bookmarks queued to watchers",
            m.deliveries.clone(),
        );
        r.register(
            "encodings",
            "Live events encoded for the wire; each is shared by every watcher it is delivered to",
            m.encodings.clone(),
        );
        r.register(
            "initial_snapshots",
            "Initial states made for watches that start with the state (each encoded once, for every watch that shares it)",
            m.initial_snapshots.clone(),
        );
        r.register(
            "initial_snapshots_shared",
            "Watches that started with an initial state another watch was already reading",
            m.initial_snapshots_shared.clone(),
        );
        r.register(
            "initial_snapshot_bytes",
            "Bytes of initial-state messages encoded (once per initial state, however many watches read it)",
            m.initial_snapshot_bytes.clone(),
        );
        r.register(
            "initial_snapshot_compressed_bytes",
            "Bytes of initial-state messages compressed for the wire (once per message and codec, however many watches send it)",
            m.initial_snapshot_compressed_bytes.clone(),
        );
        r.register(
            "watchers_fell_behind",
            "Times a watcher's queue filled: it went on from the event window by itself",
            m.fell_behind.clone(),
        );
        r.register(
            "watchers_behind",
            "Watchers whose queue filled and that read the event window now, by themselves",
            m.behind.clone(),
        );
        r.register(
            "watchers_behind_ended",
            "How each watcher's time behind ended: caught_up (it read the window through and rejoined live delivery) or ended (its watch ended first: expired or gone)",
            m.behind_ended.clone(),
        );
        r.register(
            "replayed_events",
            "Events watchers that fell behind read from the event window",
            m.replayed.clone(),
        );
        r.register(
            "undecodable_values",
            "etcd key/value pairs skipped because the key or value could not be decoded",
            m.undecodable.clone(),
        );
        r.register(
            "encrypted_values",
            "etcd values skipped because the apiserver encrypted them at rest (format kubernetes)",
            m.encrypted.clone(),
        );
        r.register(
            "relists",
            "Full re-lists of a resource after the first list",
            m.relists.clone(),
        );
        r.register("watchers", "Open watches", m.watchers.clone());
        r.register(
            "watchers_ended",
            "Watches ended by the server, by reason",
            m.watchers_ended.clone(),
        );
        r.register(
            "etcd_requests",
            "Requests sent to etcd, by kind",
            m.etcd_requests.clone(),
        );
        r.register(
            "cache_objects",
            "Objects in the watch cache",
            m.cache_objects.clone(),
        );
        r.register(
            "cache_resource_version",
            "The etcd revision the cache has caught up to",
            m.cache_revision.clone(),
        );
        r.register(
            "window_events",
            "Events held in the resume window",
            m.window_events.clone(),
        );
        r.register(
            "window_capacity",
            "Current capacity of the resume window",
            m.window_capacity.clone(),
        );
        r.register(
            "cache_bytes",
            "Memory the cache's objects take, as its max_bytes counts it",
            m.cache_bytes.clone(),
        );
        r.register(
            "cache_max_bytes",
            "The resource's max_bytes; 0 when it has none",
            m.cache_max_bytes.clone(),
        );
        r.register(
            "window_bytes",
            "Memory of the states the resume window's events carry (the current ones are in cache_bytes too)",
            m.window_bytes.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Memory of the encoded initial states joining watches are reading now, raw and compressed",
            m.snapshot_bytes.clone(),
        );
        r.register(
            "over_budget",
            "1 while the resource's objects alone need more than its max_bytes and it serves nothing",
            m.over_budget.clone(),
        );
        r.register(
            "window_shed_events",
            "Events evicted from the resume window, below its lower bound, to keep the cache within max_bytes",
            m.window_shed.clone(),
        );
        r.register(
            "consistent_read_fallbacks",
            "Consistent reads answered from etcd because the cache did not catch up in time",
            m.consistent_read_fallbacks.clone(),
        );
        r.register(
            "freshness_checks",
            "Checks of etcd's revision for consistent reads, each shared by the reads that arrived before it started",
            m.freshness_checks.clone(),
        );
        r.register(
            "state_mismatch",
            "Differences found between a cache and etcd at the cache's revision by the sampled state check: a defect to report",
            m.state_mismatch.clone(),
        );
        r.register(
            "cache_lag_revisions",
            "How far the cache's revision was behind etcd's at the last revision check",
            m.cache_lag.clone(),
        );
        r.register(
            "reflector_state",
            "1 for the state each resource's reflector is in",
            m.reflector_state.clone(),
        );
        r.register_with_unit(
            "call_duration",
            "Time to answer List and Get, and to start a Watch, by resource, method and status code",
            Unit::Seconds,
            m.calls.clone(),
        );
        r.register_with_unit(
            "event_delivery",
            "Time from etcd's event reaching its cache to the bytes carrying it written to a watcher's connection, by serve path and API (once per write, for the oldest change in it; replayed changes are not counted)",
            Unit::Seconds,
            m.delivery.clone(),
        );
        r.register(
            "etcd_api_forwarded",
            "Reads of etcd's API outside the served prefixes passed to etcd (etcd_api.outside: forward), by call (range, watch)",
            m.etcd_api_forwarded.clone(),
        );
        r.register(
            "tls_reloads",
            "Reloads of the TLS certificate, key and client CA files, by result (a failed one keeps the files in use)",
            m.tls_reloads.clone(),
        );
        r.register(
            "tls_handshakes",
            "TLS handshakes with clients, by result",
            m.tls_handshakes.clone(),
        );
        r.register(
            "auth_failures",
            "Calls refused as unauthenticated, by reason",
            m.auth_failures.clone(),
        );
        r.register(
            "authz_denied",
            "Calls the authorization rules denied, by resource and verb",
            m.authz_denied.clone(),
        );
        Self {
            registry: Arc::new(root),
            ..m
        }
    }
}

impl Metrics {
    /// The delivery histograms of one serve path.
    pub fn delivery_latency(&self, serve_path: ServePathLabel) -> DeliveryLatency {
        DeliveryLatency::of(&self.delivery, serve_path)
    }

    pub fn tls_reload(&self, result: TlsOutcome) {
        self.tls_reloads
            .get_or_create(&OutcomeLabels { result })
            .inc();
    }

    /// A read of etcd's API passed to etcd: `range` or `watch`.
    pub fn etcd_api_forwarded(&self, call: &'static str) {
        self.etcd_api_forwarded
            .get_or_create(&CallLabel { call })
            .inc();
    }

    pub fn auth_failure(&self, reason: &'static str) {
        self.auth_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn authz_denied(&self, resource: &str, verb: &'static str) {
        let labels = DeniedLabels {
            resource: resource.to_owned(),
            verb,
        };
        self.authz_denied.get_or_create(&labels).inc();
    }

    pub fn tls_handshake(&self, result: TlsOutcome) {
        self.tls_handshakes
            .get_or_create(&OutcomeLabels { result })
            .inc();
    }

    /// Records one call: `resource` is the requested one if configured,
    /// else "unknown" (so clients cannot grow the label set).
    pub fn call(&self, resource: &str, method: &'static str, code: tonic::Code, seconds: f64) {
        let labels = CallLabels {
            resource: resource.to_owned(),
            method,
            code: format!("{code:?}"),
        };
        self.calls.get_or_create(&labels).observe(seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
