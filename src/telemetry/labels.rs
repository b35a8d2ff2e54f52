//! The label sets the metric families are keyed by, and the values
//! their labels take.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResourceLabel {
    pub(super) resource: String,
}

/// Why a watch ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum EndReason {
    /// Fell behind further than the event window reaches.
    expired,
    timeout,
    client_gone,
    shutdown,
    /// Its connection reached `limits.max_connection_age`.
    connection_aged,
    /// Its credential expired (a JWT's `exp`, a certificate's `notAfter`).
    credential_expired,
    /// Its token or signing key left its file.
    credential_revoked,
    /// The authorization rules, read again, no longer allow it as it was.
    access_changed,
}

/// How a watcher's time behind (reading the event window after its queue
/// filled) ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum BehindOutcome {
    /// It read the window through and rejoined live delivery.
    caught_up,
    /// Its watch ended first: it fell further behind than the window
    /// reaches, or its client left.
    ended,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BehindLabels {
    pub(super) resource: String,
    pub(super) outcome: BehindOutcome,
}

impl EndReason {
    pub const ALL: [EndReason; 8] = [
        EndReason::expired,
        EndReason::timeout,
        EndReason::client_gone,
        EndReason::shutdown,
        EndReason::connection_aged,
        EndReason::credential_expired,
        EndReason::credential_revoked,
        EndReason::access_changed,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndLabels {
    pub(super) resource: String,
    pub(super) reason: EndReason,
}

/// The kind of request made to etcd.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum EtcdRequest {
    list_page,
    watch,
    progress,
    current_revision,
    exact_list_page,
    state_check,
}

/// The state of a reflector.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum ReflectorState {
    listing,
    connecting,
    watching,
    backoff,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) resource: String,
    pub(super) state: ReflectorState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabels {
    pub(super) resource: String,
    pub(super) method: &'static str,
    pub(super) code: String,
}

/// How a reload of the TLS files, or a TLS handshake, ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum TlsOutcome {
    ok,
    failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) result: TlsOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabel {
    pub(super) call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeniedLabels {
    pub(super) resource: String,
    pub(super) verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EtcdLabels {
    pub(super) resource: String,
    pub(super) request: EtcdRequest,
}
