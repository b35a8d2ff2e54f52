//! One resource's handles to the metric families: what its reflector,
//! cache and dispatcher count, without a label lookup per event.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::labels::{EndLabels, EndReason, EtcdLabels, EtcdRequest, ReflectorState, StateLabels};

/// The series of one resource.
#[derive(Clone, Debug)]
pub struct ResourceMetrics {
    pub(super) name: String,
    pub events_received: Counter,
    pub deliveries: Counter,
    pub encodings: Counter,
    pub initial_snapshots: Counter,
    pub initial_snapshots_shared: Counter,
    pub initial_snapshot_bytes: Counter,
    pub initial_snapshot_compressed_bytes: Counter,
    pub fell_behind: Counter,
    /// Watchers behind now, and how their times behind ended.
    pub behind: Gauge,
    pub behind_caught_up: Counter,
    pub behind_ended: Counter,
    pub replayed: Counter,
    pub undecodable: Counter,
    pub encrypted: Counter,
    pub relists: Counter,
    pub watchers: Gauge,
    pub cache_objects: Gauge,
    pub cache_revision: Gauge,
    pub window_events: Gauge,
    pub window_capacity: Gauge,
    pub cache_bytes: Gauge,
    pub cache_max_bytes: Gauge,
    pub window_bytes: Gauge,
    pub snapshot_bytes: Gauge,
    pub over_budget: Gauge,
    pub window_shed: Counter,
    pub consistent_read_fallbacks: Counter,
    pub freshness_checks: Counter,
    pub state_mismatch: Counter,
    pub cache_lag: Gauge,
    pub(super) reflector_state: Family<StateLabels, Gauge>,
    pub(super) watchers_ended: Family<EndLabels, Counter>,
    pub(super) etcd_requests: Family<EtcdLabels, Counter>,
}

impl ResourceMetrics {
    pub fn watcher_ended(&self, reason: EndReason) {
        self.watchers_ended
            .get_or_create(&EndLabels {
                resource: self.name.clone(),
                reason,
            })
            .inc();
    }

    /// Marks `state` as the reflector's only current state.
    pub fn reflector_state(&self, state: ReflectorState) {
        use ReflectorState::*;
        for s in [listing, connecting, watching, backoff] {
            let labels = StateLabels {
                resource: self.name.clone(),
                state: s,
            };
            self.reflector_state
                .get_or_create(&labels)
                .set(i64::from(s == state));
        }
    }

    pub fn etcd_request(&self, request: EtcdRequest) {
        self.etcd_requests
            .get_or_create(&EtcdLabels {
                resource: self.name.clone(),
                request,
            })
            .inc();
    }
}
