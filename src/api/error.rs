//! Every failure a client can see, and the one place they become gRPC
//! statuses.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::object::{BadVersion, Revision};
use crate::selector::SelectorError;
use crate::source::EtcdError;

/// Metadata key carrying the version a client should resume or re-list from.
pub const RESUME_VERSION_KEY: &str = "watchproxy-resume-resource-version";
/// Metadata key carrying the cache's current version.
pub const CURRENT_VERSION_KEY: &str = "watchproxy-current-resource-version";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unknown resource {name:?}; configured resources: {known}")]
    UnknownResource { name: String, known: String },
    #[error(transparent)]
    Selector(#[from] SelectorError),
    #[error(transparent)]
    BadVersion(#[from] BadVersion),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("invalid continue token: {0}")]
    BadContinue(String),
    #[error("{key} not found")]
    NotFound { key: String },
    #[error("the cache of {resource} is not ready yet; retry shortly")]
    NotReady { resource: String },
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
    #[error("resource version {revision} has been compacted in etcd; start the list again")]
    Compacted { revision: Revision },
    #[error("etcd is unavailable: {0}")]
    Etcd(#[from] EtcdError),
    #[error("etcd is unavailable: {0}")]
    EtcdShared(std::sync::Arc<EtcdError>),
    #[error("continue token expired: resource version {revision} is no longer in the cache; start the list again")]
    ContinueExpired { revision: Revision },
    #[error("too many watches {scope}; retry later or on another replica")]
    TooManyWatchers { scope: String },
    #[error("server is shutting down; {}", match .last { Some(r) => format!("resume from resource version {r} on another replica"), None => "retry on another replica".to_owned() })]
    ShuttingDown { last: Option<Revision> },
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let code = match &e {
            ApiError::UnknownResource { .. } | ApiError::NotFound { .. } => Code::NotFound,
            ApiError::Selector(_)
            | ApiError::BadVersion(_)
            | ApiError::InvalidArgument(_)
            | ApiError::BadContinue(_) => Code::InvalidArgument,
            ApiError::TooOld { .. }
            | ApiError::Compacted { .. }
            | ApiError::ContinueExpired { .. } => Code::OutOfRange,
            ApiError::TooManyWatchers { .. } => Code::ResourceExhausted,
            ApiError::NotReady { .. }
            | ApiError::NotFresh { .. }
            | ApiError::TooLarge { .. }
            | ApiError::Etcd(_)
            | ApiError::EtcdShared(_)
            | ApiError::ShuttingDown { .. } => Code::Unavailable,
        };
        let mut status = Status::new(code, e.to_string());
        let (resume, current) = match e {
            ApiError::TooOld { current, .. } => (None, Some(current)),
            ApiError::TooLarge { current, .. } => (None, Some(current)),
            ApiError::ShuttingDown { last } => (last, None),
            _ => (None, None),
        };
        let md = status.metadata_mut();
        if let Some(r) = resume {
            md.insert(RESUME_VERSION_KEY, MetadataValue::from(r));
        }
        if let Some(c) = current {
            md.insert(CURRENT_VERSION_KEY, MetadataValue::from(c));
        }
        status
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
            (ApiError::BadContinue("x".into()), Code::InvalidArgument),
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
}
