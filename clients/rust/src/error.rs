//! A watchproxy status, decoded: the stable reason of its `ErrorInfo`,
//! the versions in its metadata, the server's retry advice and the fields
//! a bad request named.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt;

/// The `ErrorInfo` domain of watchproxy's statuses.
pub const DOMAIN: &str = "watchproxy.v1";

/// Trailer the server names the resume version in (older servers, and
/// clients that read metadata rather than details).
const RESUME_VERSION_KEY: &str = "watchproxy-resume-resource-version";

macro_rules! reasons {
    ($($variant:ident = $name:literal,)*) => {
        /// Why a call failed, as the server's `ErrorInfo` names it.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Reason {
            $(
                #[allow(missing_docs)] // named by the proto, which says when each is sent
                $variant,
            )*
            /// A reason this client does not know yet.
            Other(String),
        }

        impl Reason {
            /// Every reason this client knows.
            pub const KNOWN: &[Reason] = &[$(Reason::$variant,)*];

            /// The reason as the server spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Reason::$variant => $name,)*
                    Reason::Other(s) => s,
                }
            }

            /// A reason as the server spells it; [`Reason::Other`] when
            /// this client does not know it.
            pub fn parse(s: &str) -> Reason {
                match s {
                    $($name => Reason::$variant,)*
                    other => Reason::Other(other.to_owned()),
                }
            }
        }
    };
}

reasons! {
    UnknownResource = "UNKNOWN_RESOURCE",
    NotFound = "NOT_FOUND",
    BadSelector = "BAD_SELECTOR",
    BadRequest = "BAD_REQUEST",
    TooOldResourceVersion = "TOO_OLD_RESOURCE_VERSION",
    FellOutOfWindow = "FELL_OUT_OF_WINDOW",
    Compacted = "COMPACTED",
    ContinueExpired = "CONTINUE_EXPIRED",
    NotReady = "NOT_READY",
    OverBudget = "OVER_BUDGET",
    NotFresh = "NOT_FRESH",
    TooLargeResourceVersion = "TOO_LARGE_RESOURCE_VERSION",
    EtcdUnavailable = "ETCD_UNAVAILABLE",
    ShuttingDown = "SHUTTING_DOWN",
    ConnectionAged = "CONNECTION_AGED",
    Limit = "LIMIT",
    Overloaded = "OVERLOADED",
    RequestTooLarge = "REQUEST_TOO_LARGE",
    Unauthenticated = "UNAUTHENTICATED",
    CredentialExpired = "CREDENTIAL_EXPIRED",
    CredentialRevoked = "CREDENTIAL_REVOKED",
    PermissionDenied = "PERMISSION_DENIED",
    AccessChanged = "ACCESS_CHANGED",
    DeadlineExceeded = "DEADLINE_EXCEEDED",
    UnknownMethod = "UNKNOWN_METHOD",
    ReadOnly = "READ_ONLY",
    OutsideServedKeys = "OUTSIDE_SERVED_KEYS",
    MalformedRequest = "MALFORMED_REQUEST",
    RequestAborted = "REQUEST_ABORTED",
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request field the server refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The request's field, e.g. `label_selector`.
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

/// A failed call: its status and everything its details say.
#[derive(Debug, Clone)]
pub struct Error {
    code: Code,
    message: String,
    reason: Option<Reason>,
    metadata: BTreeMap<String, String>,
    retry_delay: Option<Duration>,
    violations: Vec<FieldViolation>,
    /// Made here: an object whose value is not the type asked for.
    undecodable: bool,
}

impl Error {
    /// The gRPC status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The status message, for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The `ErrorInfo` reason, when the status came from watchproxy (a
    /// transport failure has none).
    pub fn reason(&self) -> Option<&Reason> {
        self.reason.as_ref()
    }

    /// The `ErrorInfo` metadata (`current_resource_version`,
    /// `oldest_resource_version`, `resume_resource_version`, …).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The server's current version, on a version too new or too old.
    pub fn current_resource_version(&self) -> Option<&str> {
        self.metadata
            .get("current_resource_version")
            .map(String::as_str)
    }

    /// The oldest version the server can still resume from.
    pub fn oldest_resource_version(&self) -> Option<&str> {
        self.metadata
            .get("oldest_resource_version")
            .map(String::as_str)
    }

    /// Where a watch ended by the server resumes without loss.
    pub fn resume_resource_version(&self) -> Option<&str> {
        self.metadata
            .get("resume_resource_version")
            .map(String::as_str)
    }

    /// How long the server asks to wait before the same call again
    /// (`RetryInfo`); none when retrying it does not help.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_delay
    }

    /// The request fields of an INVALID_ARGUMENT (`BadRequest`).
    pub fn field_violations(&self) -> &[FieldViolation] {
        &self.violations
    }

    /// The version asked for is gone (or the watcher fell behind it): list
    /// again and watch from the list's version.
    pub fn is_gone(&self) -> bool {
        self.code == Code::OutOfRange
    }

    /// No retry of the same request can succeed: the request, the
    /// resource or the caller's rights must change first.
    pub fn is_permanent(&self) -> bool {
        !self.is_credential_end()
            && matches!(
                self.code,
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::Unimplemented
                    | Code::FailedPrecondition
            )
    }

    /// A credential that expired or was revoked, or rules that changed
    /// under an open watch: with a fresh credential (or as the rules now
    /// allow), the watch resumes from [`Error::resume_resource_version`].
    pub fn is_credential_end(&self) -> bool {
        matches!(
            self.reason,
            Some(Reason::CredentialExpired | Reason::CredentialRevoked | Reason::AccessChanged)
        )
    }

    pub(crate) fn local(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            reason: None,
            metadata: BTreeMap::new(),
            retry_delay: None,
            violations: Vec::new(),
            undecodable: false,
        }
    }

    pub(crate) fn undecodable(message: impl Into<String>) -> Error {
        Error {
            undecodable: true,
            ..Error::local(Code::DataLoss, message)
        }
    }

    /// An object whose value could not be decoded into the type asked
    /// for (DATA_LOSS, made by this client): a watcher leaves it out and
    /// goes on.
    pub fn is_undecodable(&self) -> bool {
        self.undecodable
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Error {
        let details = status.get_error_details();
        let mut error = Error::local(status.code(), status.message());
        if let Some(info) = details.error_info().filter(|i| i.domain == DOMAIN) {
            error.reason = Some(Reason::parse(&info.reason));
            error.metadata = info
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        }
        if !error.metadata.contains_key("resume_resource_version") {
            let named = status.metadata().get(RESUME_VERSION_KEY);
            if let Some(v) = named.and_then(|v| v.to_str().ok()) {
                error
                    .metadata
                    .insert("resume_resource_version".into(), v.to_owned());
            }
        }
        error.retry_delay = details.retry_info().and_then(|r| r.retry_delay);
        if let Some(bad) = details.bad_request() {
            error.violations = bad
                .field_violations
                .iter()
                .map(|v| FieldViolation {
                    field: v.field.clone(),
                    description: v.description.clone(),
                })
                .collect();
        }
        error
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Error {
        Error::local(Code::Unavailable, format!("cannot connect: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.code)?;
        if let Some(reason) = &self.reason {
            write!(f, " ({reason})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {}
