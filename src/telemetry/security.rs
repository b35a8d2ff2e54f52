//! What the security of the service looks like from outside: the
//! configuration read again and what came of it, and whether a listener
//! serves without TLS or identities where others can reach it.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What came of reading the configuration file again.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum ReloadResult {
    /// A new `auth`, `authorization` or per-user limit is in use.
    applied,
    /// Nothing that applies live changed.
    unchanged,
    /// A section that applies only at start changed.
    restart_needed,
    /// The file does not validate; the configuration in use stays.
    invalid,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: ReloadResult,
}

/// A credential file watchproxy reads again when it changes.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are Prometheus-style lowercase
pub enum CredentialFile {
    tokens,
    jwks,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabels {
    file: CredentialFile,
}

#[derive(Clone, Debug, Default)]
pub struct SecurityMetrics {
    config_reloads: Family<ResultLabels, Counter>,
    credential_files_unusable: Family<FileLabels, Counter>,
    insecure_listener: Gauge,
}

impl SecurityMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "config_reloads",
            "Readings of the configuration file after start (on a change or SIGHUP), by result",
            self.config_reloads.clone(),
        );
        r.register(
            "credential_files_unusable",
            "Readings of a token or JWKS file that could not be used (missing, unreadable, or not parsing): every credential it held ended, by file",
            self.credential_files_unusable.clone(),
        );
        r.register(
            "insecure_listener",
            "1 when the gRPC listener serves plain text without identities on an address other than loopback",
            self.insecure_listener.clone(),
        );
    }

    pub fn config_reload(&self, result: ReloadResult) {
        self.config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn credential_file_unusable(&self, file: CredentialFile) {
        self.credential_files_unusable
            .get_or_create(&FileLabels { file })
            .inc();
    }

    pub fn insecure_listener(&self, insecure: bool) {
        self.insecure_listener.set(i64::from(insecure));
    }
}
