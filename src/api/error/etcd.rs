//! Failures as etcd's own API shows them, for its face: etcd's messages
//! where its clients match a status by them.

use tonic::{Code, Status};

use super::ApiError;
use crate::source::EtcdError;

/// etcd's answers to a forwarded read that its clients act on by their
/// message, and that say nothing of watchproxy's own standing with etcd.
const FORWARDED_MESSAGES: &[&str] = &[
    "etcdserver: request is too large",
    "etcdserver: too many requests",
    "etcdserver: request timed out",
    "etcdserver: key is not provided",
    "etcdserver: mvcc: required revision has been compacted",
    "etcdserver: mvcc: required revision is a future revision",
];

/// A failure as etcd's own API shows it: where etcd's clients match a
/// status by its message (a compacted or future revision, a missing key),
/// etcd's message; otherwise the status every call gets.
pub fn etcd_status(e: ApiError) -> Status {
    const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
    const FUTURE: &str = "etcdserver: mvcc: required revision is a future revision";
    /// What etcd answers a name and password it does not accept, which
    /// its clients know by this message.
    const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
    let etcd = |code, message: &str| Status::new(code, message);
    match e {
        ApiError::Compacted { .. } | ApiError::TooOld { .. } => etcd(Code::OutOfRange, COMPACTED),
        ApiError::TooLarge { .. } => etcd(Code::OutOfRange, FUTURE),
        ApiError::LoginFailed => etcd(Code::InvalidArgument, AUTH_FAILED),
        ApiError::InvalidArgument { field: "key", .. } => {
            etcd(Code::InvalidArgument, "etcdserver: key is not provided")
        }
        // etcd's own answer to a forwarded read: its code, and its message
        // only where etcd's clients act on it. The rest speaks of
        // watchproxy's own standing with etcd (its user, its quota):
        // logged, not told.
        ApiError::Etcd(e) => match &*e {
            EtcdError::Compacted { .. } => etcd(Code::OutOfRange, COMPACTED),
            EtcdError::FutureRevision => etcd(Code::OutOfRange, FUTURE),
            EtcdError::Client(etcd_client::Error::GRpcStatus(s))
                if s.code() != Code::Unavailable =>
            {
                match FORWARDED_MESSAGES.contains(&s.message()) {
                    true => etcd(s.code(), s.message()),
                    false => {
                        tracing::info!(code = ?s.code(), message = s.message(), "etcd refused a forwarded read");
                        etcd(
                            s.code(),
                            "etcd refused the read watchproxy forwarded for this call",
                        )
                    }
                }
            }
            _ => ApiError::Etcd(e).into(),
        },
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// etcd's clients tell these failures apart by etcd's own messages.
    #[test]
    fn etcd_api_failures_carry_etcds_messages() {
        let compacted = etcd_status(ApiError::Compacted { revision: 1 });
        assert_eq!(
            (compacted.code(), compacted.message()),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted"
            )
        );
        let future = etcd_status(ApiError::TooLarge {
            requested: 9,
            current: 3,
        });
        assert_eq!(
            future.message(),
            "etcdserver: mvcc: required revision is a future revision"
        );
        let other = etcd_status(ApiError::ReadOnly {
            method: "Put".into(),
        });
        assert_eq!(other.code(), Code::Unimplemented);
        assert!(
            other.message().contains("etcd itself"),
            "{}",
            other.message()
        );
    }

    /// A refusal of etcd's to a forwarded read keeps its code; its message
    /// only where etcd's clients act on it.
    #[test]
    fn etcds_refusals_of_a_forwarded_read_tell_nothing_of_watchproxys_standing() {
        let refused = |code, message: &str| {
            let status = tonic::Status::new(code, message);
            etcd_status(ApiError::Etcd(Arc::new(EtcdError::Client(
                etcd_client::Error::GRpcStatus(status),
            ))))
        };
        let denied = refused(Code::PermissionDenied, "etcdserver: permission denied");
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert!(!denied.message().contains("etcdserver"), "{denied:?}");
        let quota = refused(
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
        );
        assert!(!quota.message().contains("database"), "{quota:?}");
        let large = refused(Code::InvalidArgument, "etcdserver: request is too large");
        assert_eq!(large.message(), "etcdserver: request is too large");
    }
}
