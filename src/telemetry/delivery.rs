//! The time from etcd's event reaching its cache (taken off the cache's
//! etcd watch) to the bytes that carry it being written to a watcher's
//! connection, for each serve path and API: what a watcher waits for a
//! change beyond etcd's own latency.

use std::time::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// Which server wrote the bytes.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum ServePathLabel {
    fast,
    tonic,
    /// hyper's HTTP/1.1 and HTTP/2, under Kubernetes' API.
    hyper,
}

/// Which API's watch the change went out on.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum WatchApi {
    watchproxy,
    etcd,
    kubernetes,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeliveryLabels {
    serve_path: ServePathLabel,
    api: WatchApi,
}

pub(super) type DeliveryFamily = Family<DeliveryLabels, Histogram, fn() -> Histogram>;

pub(super) fn delivery_histogram() -> Histogram {
    // 50 µs to about 3.3 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

/// One serve path's histograms, by API.
#[derive(Clone, Debug)]
pub struct DeliveryLatency([Histogram; 3]);

impl DeliveryLatency {
    pub(super) fn of(family: &DeliveryFamily, serve_path: ServePathLabel) -> Self {
        let by = |api| (family.get_or_create(&DeliveryLabels { serve_path, api })).clone();
        Self([
            by(WatchApi::watchproxy),
            by(WatchApi::etcd),
            by(WatchApi::kubernetes),
        ])
    }

    /// A change received at `received` is written now.
    pub fn observe(&self, api: WatchApi, received: Instant) {
        self.0[api as usize].observe(received.elapsed().as_secs_f64());
    }
}

/// A connection's account of the oldest change, per API, in the bytes it
/// has not written yet: observed once per write that empties its buffer,
/// which bounds the latency of every change in it. Only gRPC watches
/// (`watchproxy` and `etcd`) go through a connection that keeps one.
#[derive(Debug, Default)]
pub struct WriteClock {
    latency: Option<DeliveryLatency>,
    oldest: [Option<Instant>; 2],
}

impl WriteClock {
    pub fn new(latency: DeliveryLatency) -> Self {
        Self {
            latency: Some(latency),
            oldest: [None; 2],
        }
    }

    /// A change received at `received` (none for a replayed one) went
    /// into the buffer.
    #[inline]
    pub fn note(&mut self, api: WatchApi, received: Option<Instant>) {
        if let Some(received) = received {
            let oldest = &mut self.oldest[api as usize];
            if oldest.is_none_or(|o| received < o) {
                *oldest = Some(received);
            }
        }
    }

    /// The buffer was written out.
    pub fn written(&mut self) {
        let Some(latency) = &self.latency else { return };
        for api in [WatchApi::watchproxy, WatchApi::etcd] {
            if let Some(received) = self.oldest[api as usize].take() {
                latency.observe(api, received);
            }
        }
    }
}
