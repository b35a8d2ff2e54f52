//! Why a caller was refused: by its credentials, the rules or its limits.

use std::time::Duration;

use super::Lapse;

/// A refusal of access. Each face maps it to its statuses (watchproxy.v1's
/// and etcd's in `api::error`); no message holds a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No credential names a caller here.
    #[error("authentication required: {reason}")]
    Unauthenticated { reason: &'static str },
    /// The call's credential expired or was revoked before it started.
    #[error("{detail}")]
    CredentialEnded { lapse: Lapse, detail: &'static str },
    /// No rule lets the caller do this.
    #[error("{user} may not {verb} {resource}")]
    PermissionDenied {
        user: String,
        verb: &'static str,
        resource: String,
        namespace: String,
        /// A rule allows it in a narrower namespace scope.
        too_wide: bool,
    },
    /// The caller is over one of its per-identity limits.
    #[error("{user} is over its limit of {what}")]
    UserLimit {
        user: String,
        what: String,
        retry_after: Option<Duration>,
    },
}
