//! One resource's handles to the metric families: what its reflector,
//! cache and dispatcher count, without a label lookup per event.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::labels::{
    BehindLabels, BehindOutcome, EndLabels, EndReason, EtcdLabels, EtcdRequest, ReflectorState,
    ResourceLabel, StateLabels,
};
use super::metrics::Metrics;

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

/// Each resource's handles, made once when its cache starts.
impl Metrics {
    pub fn resource(&self, name: &str) -> ResourceMetrics {
        let l = ResourceLabel {
            resource: name.to_owned(),
        };
        // The series alerts read start at 0, so that the first end is an
        // increase.
        for reason in EndReason::ALL {
            let labels = EndLabels {
                resource: name.to_owned(),
                reason,
            };
            drop(self.watchers_ended.get_or_create(&labels));
        }
        ResourceMetrics {
            name: name.to_owned(),
            events_received: self.events_received.get_or_create(&l).clone(),
            deliveries: self.deliveries.get_or_create(&l).clone(),
            encodings: self.encodings.get_or_create(&l).clone(),
            initial_snapshots: self.initial_snapshots.get_or_create(&l).clone(),
            initial_snapshots_shared: self.initial_snapshots_shared.get_or_create(&l).clone(),
            initial_snapshot_bytes: self.initial_snapshot_bytes.get_or_create(&l).clone(),
            initial_snapshot_compressed_bytes: (self.initial_snapshot_compressed_bytes)
                .get_or_create(&l)
                .clone(),
            fell_behind: self.fell_behind.get_or_create(&l).clone(),
            behind: self.behind.get_or_create(&l).clone(),
            behind_caught_up: self.behind_ended_as(name, BehindOutcome::caught_up),
            behind_ended: self.behind_ended_as(name, BehindOutcome::ended),
            replayed: self.replayed.get_or_create(&l).clone(),
            undecodable: self.undecodable.get_or_create(&l).clone(),
            encrypted: self.encrypted.get_or_create(&l).clone(),
            relists: self.relists.get_or_create(&l).clone(),
            watchers: self.watchers.get_or_create(&l).clone(),
            cache_objects: self.cache_objects.get_or_create(&l).clone(),
            cache_revision: self.cache_revision.get_or_create(&l).clone(),
            window_events: self.window_events.get_or_create(&l).clone(),
            window_capacity: self.window_capacity.get_or_create(&l).clone(),
            cache_bytes: self.cache_bytes.get_or_create(&l).clone(),
            cache_max_bytes: self.cache_max_bytes.get_or_create(&l).clone(),
            window_bytes: self.window_bytes.get_or_create(&l).clone(),
            snapshot_bytes: self.snapshot_bytes.get_or_create(&l).clone(),
            over_budget: self.over_budget.get_or_create(&l).clone(),
            window_shed: self.window_shed.get_or_create(&l).clone(),
            consistent_read_fallbacks: self.consistent_read_fallbacks.get_or_create(&l).clone(),
            freshness_checks: self.freshness_checks.get_or_create(&l).clone(),
            state_mismatch: self.state_mismatch.get_or_create(&l).clone(),
            cache_lag: self.cache_lag.get_or_create(&l).clone(),
            reflector_state: self.reflector_state.clone(),
            watchers_ended: self.watchers_ended.clone(),
            etcd_requests: self.etcd_requests.clone(),
        }
    }

    fn behind_ended_as(&self, resource: &str, outcome: BehindOutcome) -> Counter {
        let labels = BehindLabels {
            resource: resource.to_owned(),
            outcome,
        };
        self.behind_ended.get_or_create(&labels).clone()
    }
}
