//! Every failure a client can see, and the one place they become gRPC
//! statuses: those of the handlers and those of the transport alike.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::access::{AccessError, Lapse, Revoke};
use crate::object::{BadVersion, Revision};
use crate::selector::SelectorError;
use crate::source::EtcdError;

mod etcd;
mod kubernetes;
pub use etcd::etcd_status;
pub use kubernetes::{kubernetes_status, Cause, KubeStatus, Subject};

/// Metadata key carrying the version a client should resume or re-list from.
pub const RESUME_VERSION_KEY: &str = "watchproxy-resume-resource-version";
/// Metadata key carrying the cache's current version.
pub const CURRENT_VERSION_KEY: &str = "watchproxy-current-resource-version";

/// The `ErrorInfo` domain of every status.
pub const DOMAIN: &str = "watchproxy.v1";

/// Every `ErrorInfo` reason, with the code it comes with: the proto's
/// comments and the status table of docs/api.md name the same (a test reads
/// them against this list).
pub const REASONS: &[(&str, Code)] = &[
    ("UNKNOWN_RESOURCE", Code::NotFound),
    ("NOT_FOUND", Code::NotFound),
    ("BAD_SELECTOR", Code::InvalidArgument),
    ("BAD_REQUEST", Code::InvalidArgument),
    ("TOO_OLD_RESOURCE_VERSION", Code::OutOfRange),
    ("FELL_OUT_OF_WINDOW", Code::OutOfRange),
    ("COMPACTED", Code::OutOfRange),
    ("CONTINUE_EXPIRED", Code::OutOfRange),
    ("NOT_READY", Code::Unavailable),
    ("OVER_BUDGET", Code::Unavailable),
    ("NOT_FRESH", Code::Unavailable),
    ("TOO_LARGE_RESOURCE_VERSION", Code::Unavailable),
    ("ETCD_UNAVAILABLE", Code::Unavailable),
    ("SHUTTING_DOWN", Code::Unavailable),
    ("CONNECTION_AGED", Code::Unavailable),
    ("LIMIT", Code::ResourceExhausted),
    ("OVERLOADED", Code::ResourceExhausted),
    ("REQUEST_TOO_LARGE", Code::ResourceExhausted),
    ("UNAUTHENTICATED", Code::Unauthenticated),
    ("CREDENTIAL_EXPIRED", Code::Unauthenticated),
    ("CREDENTIAL_REVOKED", Code::Unauthenticated),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("ACCESS_CHANGED", Code::PermissionDenied),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("UNKNOWN_METHOD", Code::Unimplemented),
    ("READ_ONLY", Code::Unimplemented),
    ("OUTSIDE_SERVED_KEYS", Code::FailedPrecondition),
    ("MALFORMED_REQUEST", Code::Internal),
    ("REQUEST_ABORTED", Code::Cancelled),
];

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unknown resource {name:?}; configured resources: {known}")]
    UnknownResource { name: String, known: String },
    /// A request field that does not hold what it must; the status names
    /// the field in its message and in a `BadRequest` detail.
    #[error("{problem}")]
    InvalidArgument {
        field: &'static str,
        problem: String,
    },
    #[error("{key} not found")]
    NotFound { key: String },
    #[error("the cache of {resource} is not ready yet; retry shortly")]
    NotReady { resource: String },
    #[error("the cache of {resource} serves nothing: its objects need at least {bytes} bytes, over its max_bytes of {budget}; it lists again until they fit")]
    OverBudget {
        resource: String,
        bytes: u64,
        budget: u64,
    },
    #[error("the cache of {resource} could not confirm it has caught up with etcd in time; retry shortly")]
    NotFresh { resource: String },
    #[error("too large resource version: {requested}, current: {current}; retry shortly")]
    TooLarge {
        requested: Revision,
        current: Revision,
    },
    #[error("too old resource version: {requested} (oldest available: {oldest}, current: {current}); list again and watch from the list's resource version")]
    TooOld {
        requested: Revision,
        oldest: Revision,
        current: Revision,
    },
    /// A watch that fell so far behind that its position left the window.
    #[error("the watch fell behind past the event window: its events after {after} are gone (oldest available: {oldest}, current: {current}); list again and watch from the list's resource version")]
    FellBehind {
        after: Revision,
        oldest: Revision,
        current: Revision,
    },
    #[error("resource version {revision} has been compacted in etcd; start the list again")]
    Compacted { revision: Revision },
    #[error("etcd is unavailable: {0}")]
    Etcd(Arc<EtcdError>),
    #[error("continue token expired: resource version {revision} is no longer in the cache; start the list again")]
    ContinueExpired { revision: Revision },
    #[error("too many watches {scope}; retry later or on another replica")]
    TooManyWatchers { scope: String },
    #[error("{user} is over its limit of {what}; {}", match .retry_after {
        Some(d) => format!("retry in {} ms", d.as_millis().max(1)),
        None => "close a watch or retry later".to_owned(),
    })]
    UserLimit {
        user: String,
        what: String,
        retry_after: Option<std::time::Duration>,
    },
    #[error("{reason}: too many List/Get calls in progress; retry with backoff")]
    Overloaded { reason: String },
    #[error("server is shutting down; {}", match .last { Some(r) => format!("resume from resource version {r} on another replica"), None => "retry on another replica".to_owned() })]
    ShuttingDown { last: Option<Revision> },
    /// The connection reached `limits.max_connection_age`.
    #[error("the connection reached its maximum age; {}", match .last { Some(r) => format!("resume from resource version {r} on a new connection"), None => "watch again on a new connection".to_owned() })]
    ConnectionAged { last: Option<Revision> },
    #[error("the call's deadline passed")]
    DeadlineExceeded,
    /// `limits.request_body_timeout` passed before the request was whole.
    #[error("the request did not arrive whole within {} ms", .after.as_millis())]
    RequestTooSlow { after: Duration },
    #[error("no method {path}")]
    UnknownMethod { path: String },
    /// A call of etcd's API other than its reads.
    #[error("watchproxy serves etcd's reads (KV.Range and Watch) from its caches, not {method}: send writes and etcd's other calls to etcd itself")]
    ReadOnly { method: String },
    /// A key range of etcd's API that reaches outside the served
    /// resources' prefixes, with `etcd_api.outside: refuse`.
    #[error("the key range {range} reaches outside the served resources' prefixes; watchproxy serves etcd's API for keys under {served} (etcd_api.outside: refuse)")]
    OutsideServedKeys { range: String, served: String },
    /// The reason never holds a credential.
    #[error("authentication required: {reason}")]
    Unauthenticated { reason: &'static str },
    /// A credential that expired or was revoked: at a call's start, or
    /// ending an open watch, which names where to resume.
    #[error("{detail}; {}", match .last {
        Some(r) => format!("watch again with a fresh credential from resource version {r}"),
        None => "call again with a fresh credential".to_owned(),
    })]
    CredentialEnded {
        lapse: Lapse,
        detail: &'static str,
        last: Option<Revision>,
    },
    /// The rules in use changed and no longer allow an open watch as it
    /// was opened, or force other selectors on it.
    #[error("the authorization rules changed and no longer allow this watch as it was opened; {}", match .last {
        Some(r) => format!("a watch the rules allow may resume from resource version {r}"),
        None => "watch again as the rules allow".to_owned(),
    })]
    AccessChanged { last: Option<Revision> },
    #[error("{user} may not {verb} {resource}{}", match (.too_wide, .namespace.as_str()) {
        (true, _) => " across namespaces; name a namespace you may read".to_owned(),
        (false, "") => String::new(),
        (false, ns) => format!(" in namespace {ns}"),
    })]
    PermissionDenied {
        user: String,
        verb: &'static str,
        resource: String,
        namespace: String,
        /// A rule allows it in a narrower namespace scope.
        too_wide: bool,
    },
    #[error("the request is {len} bytes; the limit is {max}")]
    RequestTooLarge { len: usize, max: usize },
    /// RequestProgress's `bookmark_watches` from a caller whose rules do
    /// not cover the whole resource.
    #[error("{user} may not bookmark every watch of {resource}: bookmark_watches needs a rule over the whole resource (every namespace, no selector); ask without it")]
    BookmarksNotAllowed { user: String, resource: String },
    #[error("the request's headers are larger than {max} bytes")]
    HeadersTooLarge { max: usize },
    /// etcd's Authenticate with a name and password it does not accept.
    #[error("authentication failed: invalid user name or password")]
    LoginFailed,
    /// The request's bytes are not a request (gRPC framing or protobuf).
    #[error("{0}")]
    MalformedRequest(String),
    /// The client went away or reset the call while it was read.
    #[error("reading the request: {0}")]
    RequestAborted(String),
}

/// A grant or an identity that ended, as every face reports it: `last` is
/// where an open watch may resume.
pub fn revoked(why: Revoke, last: Option<Revision>) -> ApiError {
    match why {
        Revoke::Credential(lapse @ Lapse::Expired) => ApiError::CredentialEnded {
            lapse,
            detail: "the credential has expired",
            last,
        },
        Revoke::Credential(lapse @ Lapse::Revoked) => ApiError::CredentialEnded {
            lapse,
            detail: "the credential was revoked",
            last,
        },
        Revoke::AccessChanged => ApiError::AccessChanged { last },
    }
}

/// A refusal of access as every face reports it.
impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::Unauthenticated { reason } => ApiError::Unauthenticated { reason },
            AccessError::CredentialEnded { lapse, detail } => ApiError::CredentialEnded {
                lapse,
                detail,
                last: None,
            },
            AccessError::PermissionDenied {
                user,
                verb,
                resource,
                namespace,
                too_wide,
            } => ApiError::PermissionDenied {
                user,
                verb,
                resource,
                namespace,
                too_wide,
            },
            AccessError::UserLimit {
                user,
                what,
                retry_after,
            } => ApiError::UserLimit {
                user,
                what,
                retry_after,
            },
        }
    }
}

impl ApiError {
    pub fn invalid(field: &'static str, problem: impl Into<String>) -> Self {
        ApiError::InvalidArgument {
            field,
            problem: problem.into(),
        }
    }

    pub fn code(&self) -> Code {
        match self {
            ApiError::UnknownResource { .. } | ApiError::NotFound { .. } => Code::NotFound,
            ApiError::InvalidArgument { .. } | ApiError::LoginFailed => Code::InvalidArgument,
            ApiError::TooOld { .. }
            | ApiError::FellBehind { .. }
            | ApiError::Compacted { .. }
            | ApiError::ContinueExpired { .. } => Code::OutOfRange,
            ApiError::TooManyWatchers { .. }
            | ApiError::UserLimit { .. }
            | ApiError::Overloaded { .. }
            | ApiError::RequestTooLarge { .. }
            | ApiError::HeadersTooLarge { .. } => Code::ResourceExhausted,
            ApiError::NotReady { .. }
            | ApiError::OverBudget { .. }
            | ApiError::NotFresh { .. }
            | ApiError::TooLarge { .. }
            | ApiError::Etcd(_)
            | ApiError::ShuttingDown { .. }
            | ApiError::ConnectionAged { .. } => Code::Unavailable,
            ApiError::DeadlineExceeded | ApiError::RequestTooSlow { .. } => Code::DeadlineExceeded,
            ApiError::UnknownMethod { .. } | ApiError::ReadOnly { .. } => Code::Unimplemented,
            ApiError::OutsideServedKeys { .. } => Code::FailedPrecondition,
            ApiError::Unauthenticated { .. } | ApiError::CredentialEnded { .. } => {
                Code::Unauthenticated
            }
            ApiError::PermissionDenied { .. }
            | ApiError::AccessChanged { .. }
            | ApiError::BookmarksNotAllowed { .. } => Code::PermissionDenied,
            ApiError::MalformedRequest(_) => Code::Internal,
            ApiError::RequestAborted(_) => Code::Cancelled,
        }
    }

    /// The stable `ErrorInfo` reason a client branches on.
    fn reason(&self) -> &'static str {
        match self {
            ApiError::UnknownResource { .. } => "UNKNOWN_RESOURCE",
            ApiError::InvalidArgument {
                field: "label_selector" | "field_selector",
                ..
            } => "BAD_SELECTOR",
            ApiError::InvalidArgument { .. } => "BAD_REQUEST",
            ApiError::NotFound { .. } => "NOT_FOUND",
            ApiError::NotReady { .. } => "NOT_READY",
            ApiError::OverBudget { .. } => "OVER_BUDGET",
            ApiError::NotFresh { .. } => "NOT_FRESH",
            ApiError::TooLarge { .. } => "TOO_LARGE_RESOURCE_VERSION",
            ApiError::TooOld { .. } => "TOO_OLD_RESOURCE_VERSION",
            ApiError::FellBehind { .. } => "FELL_OUT_OF_WINDOW",
            ApiError::Compacted { .. } => "COMPACTED",
            ApiError::Etcd(_) => "ETCD_UNAVAILABLE",
            ApiError::ContinueExpired { .. } => "CONTINUE_EXPIRED",
            ApiError::TooManyWatchers { .. } | ApiError::UserLimit { .. } => "LIMIT",
            ApiError::Overloaded { .. } => "OVERLOADED",
            ApiError::ShuttingDown { .. } => "SHUTTING_DOWN",
            ApiError::ConnectionAged { .. } => "CONNECTION_AGED",
            ApiError::DeadlineExceeded | ApiError::RequestTooSlow { .. } => "DEADLINE_EXCEEDED",
            ApiError::UnknownMethod { .. } => "UNKNOWN_METHOD",
            ApiError::ReadOnly { .. } => "READ_ONLY",
            ApiError::OutsideServedKeys { .. } => "OUTSIDE_SERVED_KEYS",
            ApiError::Unauthenticated { .. } => "UNAUTHENTICATED",
            ApiError::CredentialEnded {
                lapse: Lapse::Expired,
                ..
            } => "CREDENTIAL_EXPIRED",
            ApiError::CredentialEnded {
                lapse: Lapse::Revoked,
                ..
            } => "CREDENTIAL_REVOKED",
            ApiError::PermissionDenied { .. } | ApiError::BookmarksNotAllowed { .. } => {
                "PERMISSION_DENIED"
            }
            ApiError::AccessChanged { .. } => "ACCESS_CHANGED",
            ApiError::RequestTooLarge { .. } | ApiError::HeadersTooLarge { .. } => {
                "REQUEST_TOO_LARGE"
            }
            ApiError::LoginFailed => "BAD_REQUEST",
            ApiError::MalformedRequest(_) => "MALFORMED_REQUEST",
            ApiError::RequestAborted(_) => "REQUEST_ABORTED",
        }
    }

    /// How long to wait before the same call again, where that helps.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::NotReady { .. }
            | ApiError::NotFresh { .. }
            | ApiError::TooLarge { .. }
            | ApiError::Etcd(_) => Some(Duration::from_secs(1)),
            ApiError::Overloaded { .. } => Some(Duration::from_millis(100)),
            ApiError::OverBudget { .. } => Some(Duration::from_secs(30)),
            ApiError::TooManyWatchers { .. } => Some(Duration::from_secs(5)),
            ApiError::UserLimit { retry_after, .. } => *retry_after,
            ApiError::ShuttingDown { .. } | ApiError::ConnectionAged { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }
}

impl From<EtcdError> for ApiError {
    fn from(e: EtcdError) -> Self {
        ApiError::Etcd(Arc::new(e))
    }
}

impl From<Arc<EtcdError>> for ApiError {
    fn from(e: Arc<EtcdError>) -> Self {
        ApiError::Etcd(e)
    }
}

impl From<BadVersion> for ApiError {
    fn from(e: BadVersion) -> Self {
        ApiError::invalid("resource_version", e.to_string())
    }
}

impl From<SelectorError> for ApiError {
    fn from(e: SelectorError) -> Self {
        let field = match e {
            SelectorError::Label(_) => "label_selector",
            SelectorError::Field(_) => "field_selector",
        };
        ApiError::invalid(field, e.to_string())
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let code = e.code();
        let message = e.to_string();
        let mut metadata = MetadataMap::new();
        let (resume, current, oldest) = match &e {
            ApiError::TooOld {
                current, oldest, ..
            }
            | ApiError::FellBehind {
                current, oldest, ..
            } => (None, Some(*current), Some(*oldest)),
            ApiError::TooLarge { current, .. } => (None, Some(*current), None),
            ApiError::ShuttingDown { last } => (*last, None, None),
            ApiError::ConnectionAged { last }
            | ApiError::CredentialEnded { last, .. }
            | ApiError::AccessChanged { last } => (*last, None, None),
            _ => (None, None, None),
        };
        let mut info = HashMap::new();
        if let Some(r) = resume {
            metadata.insert(RESUME_VERSION_KEY, MetadataValue::from(r));
            info.insert("resume_resource_version".to_owned(), r.to_string());
        }
        if let Some(c) = current {
            metadata.insert(CURRENT_VERSION_KEY, MetadataValue::from(c));
            info.insert("current_resource_version".to_owned(), c.to_string());
        }
        if let Some(o) = oldest {
            info.insert("oldest_resource_version".to_owned(), o.to_string());
        }
        let mut details = ErrorDetails::new();
        details.set_error_info(e.reason(), DOMAIN, info);
        if let Some(after) = e.retry_after() {
            details.set_retry_info(Some(after));
        }
        if let ApiError::InvalidArgument { field, problem } = e {
            details.add_bad_request_violation(field, problem);
        }
        Status::with_error_details_and_metadata(code, message, details, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_the_code_a_client_acts_on() {
        let cases = [
            (
                ApiError::UnknownResource {
                    name: "x".into(),
                    known: "pods".into(),
                },
                Code::NotFound,
            ),
            (
                ApiError::invalid("continue_token", "x"),
                Code::InvalidArgument,
            ),
            (
                ApiError::TooOld {
                    requested: 1,
                    oldest: 5,
                    current: 9,
                },
                Code::OutOfRange,
            ),
            (
                ApiError::TooLarge {
                    requested: 99,
                    current: 9,
                },
                Code::Unavailable,
            ),
            (ApiError::ShuttingDown { last: Some(7) }, Code::Unavailable),
            (
                ApiError::NotReady {
                    resource: "pods".into(),
                },
                Code::Unavailable,
            ),
            (ApiError::DeadlineExceeded, Code::DeadlineExceeded),
            (
                ApiError::UnknownMethod {
                    path: "/watchproxy.v1.WatchProxy/Delete".into(),
                },
                Code::Unimplemented,
            ),
            (
                ApiError::RequestTooLarge { len: 9, max: 4 },
                Code::ResourceExhausted,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(Status::from(err).code(), code);
        }
        let s = Status::from(ApiError::TooOld {
            requested: 1,
            oldest: 5,
            current: 9,
        });
        assert!(
            s.message().contains("too old resource version") && s.message().contains("current: 9")
        );
        assert_eq!(s.metadata().get(CURRENT_VERSION_KEY).unwrap(), "9");
        let s = Status::from(ApiError::ShuttingDown { last: Some(7) });
        assert_eq!(s.metadata().get(RESUME_VERSION_KEY).unwrap(), "7");
    }

    #[test]
    fn a_bad_field_is_named_in_the_message_and_in_the_details() {
        let s = Status::from(ApiError::invalid("limit", "limit must not be negative"));
        assert_eq!(s.message(), "limit must not be negative");
        let details = s.get_error_details();
        let bad = details.bad_request().expect("a BadRequest detail");
        assert_eq!(bad.field_violations.len(), 1);
        assert_eq!(bad.field_violations[0].field, "limit");
        assert_eq!(
            bad.field_violations[0].description,
            "limit must not be negative"
        );
    }

    #[test]
    fn every_status_names_its_reason_and_when_to_retry() {
        let cases = [
            (
                ApiError::invalid("label_selector", "x"),
                "BAD_SELECTOR",
                None,
            ),
            (ApiError::invalid("limit", "x"), "BAD_REQUEST", None),
            (
                ApiError::TooOld {
                    requested: 1,
                    oldest: 5,
                    current: 9,
                },
                "TOO_OLD_RESOURCE_VERSION",
                None,
            ),
            (
                ApiError::FellBehind {
                    after: 1,
                    oldest: 5,
                    current: 9,
                },
                "FELL_OUT_OF_WINDOW",
                None,
            ),
            (
                ApiError::TooLarge {
                    requested: 99,
                    current: 9,
                },
                "TOO_LARGE_RESOURCE_VERSION",
                Some(Duration::from_secs(1)),
            ),
            (
                ApiError::NotReady {
                    resource: "pods".into(),
                },
                "NOT_READY",
                Some(Duration::from_secs(1)),
            ),
            (
                ApiError::ShuttingDown { last: Some(7) },
                "SHUTTING_DOWN",
                Some(Duration::ZERO),
            ),
            (
                ApiError::CredentialEnded {
                    lapse: Lapse::Revoked,
                    detail: "the credential was revoked",
                    last: Some(7),
                },
                "CREDENTIAL_REVOKED",
                None,
            ),
            (
                ApiError::AccessChanged { last: Some(7) },
                "ACCESS_CHANGED",
                None,
            ),
            (
                ApiError::TooManyWatchers {
                    scope: "in all".into(),
                },
                "LIMIT",
                Some(Duration::from_secs(5)),
            ),
        ];
        for (e, reason, retry) in cases {
            let status = Status::from(e);
            let details = status.get_error_details();
            let info = details.error_info().expect("an ErrorInfo");
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (reason, DOMAIN)
            );
            assert_eq!(
                details.retry_info().and_then(|r| r.retry_delay),
                retry,
                "{reason}"
            );
            match reason {
                "TOO_OLD_RESOURCE_VERSION" | "FELL_OUT_OF_WINDOW" => {
                    assert_eq!(info.metadata["current_resource_version"], "9");
                    assert_eq!(info.metadata["oldest_resource_version"], "5");
                }
                "SHUTTING_DOWN" | "CREDENTIAL_REVOKED" | "ACCESS_CHANGED" => {
                    assert_eq!(info.metadata["resume_resource_version"], "7")
                }
                "BAD_SELECTOR" | "BAD_REQUEST" => assert!(details.bad_request().is_some()),
                _ => {}
            }
        }
    }

    /// Each reason a status carries is listed in [`REASONS`] with its code.
    #[test]
    fn the_reasons_listed_are_those_sent() {
        let errors = [
            ApiError::UnknownResource {
                name: "x".into(),
                known: "pods".into(),
            },
            ApiError::NotFound { key: "k".into() },
            ApiError::invalid("label_selector", "x"),
            ApiError::invalid("limit", "x"),
            ApiError::TooOld {
                requested: 1,
                oldest: 2,
                current: 3,
            },
            ApiError::FellBehind {
                after: 1,
                oldest: 2,
                current: 3,
            },
            ApiError::Compacted { revision: 1 },
            ApiError::ContinueExpired { revision: 1 },
            ApiError::NotReady {
                resource: "pods".into(),
            },
            ApiError::OverBudget {
                resource: "pods".into(),
                bytes: 2,
                budget: 1,
            },
            ApiError::NotFresh {
                resource: "pods".into(),
            },
            ApiError::TooLarge {
                requested: 9,
                current: 3,
            },
            ApiError::Etcd(Arc::new(EtcdError::Timeout)),
            ApiError::ShuttingDown { last: None },
            ApiError::ConnectionAged { last: Some(1) },
            ApiError::TooManyWatchers {
                scope: "in all".into(),
            },
            ApiError::UserLimit {
                user: "u".into(),
                what: "w".into(),
                retry_after: None,
            },
            ApiError::Overloaded { reason: "r".into() },
            ApiError::RequestTooLarge { len: 2, max: 1 },
            ApiError::HeadersTooLarge { max: 1 },
            ApiError::LoginFailed,
            ApiError::Unauthenticated { reason: "r" },
            ApiError::CredentialEnded {
                lapse: Lapse::Expired,
                detail: "d",
                last: None,
            },
            ApiError::CredentialEnded {
                lapse: Lapse::Revoked,
                detail: "d",
                last: Some(1),
            },
            ApiError::PermissionDenied {
                user: "u".into(),
                verb: "list",
                resource: "pods".into(),
                namespace: String::new(),
                too_wide: false,
            },
            ApiError::AccessChanged { last: Some(1) },
            ApiError::BookmarksNotAllowed {
                user: "u".into(),
                resource: "pods".into(),
            },
            ApiError::DeadlineExceeded,
            ApiError::UnknownMethod { path: "/x".into() },
            ApiError::ReadOnly {
                method: "Put".into(),
            },
            ApiError::OutsideServedKeys {
                range: "[/a, /b)".into(),
                served: "/p/".into(),
            },
            ApiError::MalformedRequest("m".into()),
            ApiError::RequestAborted("a".into()),
        ];
        let mut sent = std::collections::BTreeSet::new();
        for e in errors {
            let (reason, code) = (e.reason(), e.code());
            assert!(REASONS.contains(&(reason, code)), "{reason} with {code:?}");
            sent.insert(reason);
        }
        assert_eq!(sent.len(), REASONS.len(), "every listed reason is sent");
    }
}
