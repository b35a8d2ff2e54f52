//! The HTTP/2 server's metrics: GOAWAY and RST_STREAM by direction and
//! code, connections sent away for each of its bounds, and the response
//! bytes its connections hold for clients that have not read them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which way a frame went.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum Direction {
    sent,
    received,
}

/// The bound a connection was sent away for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum Bound {
    /// Too many streams reset, by the client or for its errors.
    resets,
    /// A header block past its CONTINUATION bound.
    header_block,
    /// A keepalive PING left unanswered.
    keepalive,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrameLabels {
    direction: Direction,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    bound: Bound,
}

#[derive(Clone, Debug, Default)]
pub struct Http2Metrics {
    goaways: Family<FrameLabels, Counter>,
    resets: Family<FrameLabels, Counter>,
    sent_away: Family<BoundLabels, Counter>,
    held_response_bytes: Gauge<u64, AtomicU64>,
}

impl Http2Metrics {
    pub(super) fn register(&self, r: &mut Registry) {
        // The series alerts and dashboards read start at 0, so that the
        // first frame is an increase.
        for code in [0x0, 0x1, 0xb] {
            let labels = FrameLabels {
                direction: Direction::sent,
                code: code_name(code),
            };
            drop(self.goaways.get_or_create(&labels));
            drop(self.resets.get_or_create(&labels));
        }
        r.register(
            "http2_goaways",
            "GOAWAY frames of the service's own HTTP/2 server, by direction and error code",
            self.goaways.clone(),
        );
        r.register(
            "http2_resets",
            "RST_STREAM frames of the service's own HTTP/2 server, by direction and error code",
            self.resets.clone(),
        );
        r.register(
            "http2_connections_sent_away",
            "Connections the service's own HTTP/2 server closed for passing one of its bounds",
            self.sent_away.clone(),
        );
        r.register(
            "http2_held_response_bytes",
            "Response bytes of List and Get calls held for clients that have not read them",
            self.held_response_bytes.clone(),
        );
    }

    pub fn goaway(&self, direction: Direction, code: u32) {
        let labels = FrameLabels {
            direction,
            code: code_name(code),
        };
        self.goaways.get_or_create(&labels).inc();
    }

    pub fn reset(&self, direction: Direction, code: u32) {
        let labels = FrameLabels {
            direction,
            code: code_name(code),
        };
        self.resets.get_or_create(&labels).inc();
    }

    pub fn sent_away(&self, bound: Bound) {
        self.sent_away.get_or_create(&BoundLabels { bound }).inc();
    }

    pub fn held_response_bytes(&self) -> &Gauge<u64, AtomicU64> {
        &self.held_response_bytes
    }
}

/// An HTTP/2 error code's name (RFC 9113 §7); codes it does not define
/// are one label, so a client cannot grow the label set.
fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_and_unknown_ones_share_a_label() {
        assert_eq!(code_name(0xb), "ENHANCE_YOUR_CALM");
        assert_eq!(code_name(0x1), "PROTOCOL_ERROR");
        assert_eq!(code_name(0x1234), "UNKNOWN");
    }
}
