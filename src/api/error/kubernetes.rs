//! Failures as Kubernetes' API shows them, for its face: a `metav1.Status`
//! with the apiserver's HTTP code, reason and wording, so that informers
//! act on them as on the apiserver's (410 Expired: list again; 504 with a
//! `ResourceVersionTooLarge` cause: wait and retry; 429 and 503 with a
//! delay: back off).

use serde::Serialize;

use super::ApiError;

/// What a failed request was about: the Status names it as the apiserver
/// does.
#[derive(Debug, Clone, Copy, Default)]
pub struct Subject<'a> {
    /// The API group; "" for the core group.
    pub group: &'a str,
    /// The resource's plural name.
    pub plural: &'a str,
    /// The object's name, for a request of one object.
    pub name: Option<&'a str>,
    /// `get`, `list` or `watch`.
    pub verb: &'a str,
}

/// A `metav1.Status` of a failure, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeStatus {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    pub message: String,
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Details::is_empty")]
    pub details: Details,
    pub code: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
struct Empty {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The resource's plural, as the apiserver fills it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u64,
}

impl Details {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One cause of a failure (`metav1.StatusCause`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cause {
    /// The cause's type, which the JSON names `reason`.
    pub reason: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl KubeStatus {
    fn failure(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message: message.into(),
            reason,
            details: Details::default(),
            code,
        }
    }

    /// 400 BadRequest: a request the apiserver could not read.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::failure(400, "BadRequest", message)
    }

    /// 422 Invalid: request options that do not go together, each cause
    /// naming its field.
    pub fn invalid(kind: &str, message: impl Into<String>, causes: Vec<Cause>) -> Self {
        let mut status = Self::failure(422, "Invalid", message);
        status.details.group = "meta.k8s.io".to_owned();
        status.details.kind = kind.to_owned();
        status.details.causes = causes;
        status
    }

    /// 406 NotAcceptable: no media type the client accepts is written;
    /// `what` says which are.
    pub fn not_acceptable(what: &str) -> Self {
        Self::failure(
            406,
            "NotAcceptable",
            format!("the server was unable to respond with a content type that the client supports: {what}"),
        )
    }

    /// 403 Forbidden for a built-in resource this server does not serve:
    /// the apiserver has it, so it is not missing (kubectl, finding no
    /// object, asks whether its namespace exists, and takes a 404 as no).
    pub fn not_served(subject: &Subject<'_>) -> Self {
        let mut status = Self::failure(
            403,
            "Forbidden",
            format!(
                "watchproxy does not serve {}: configure a resource with its prefix to serve it, or ask the Kubernetes API server",
                qualified(subject)
            ),
        );
        status.details = named(subject);
        status
    }

    /// 500 InternalError: what the server holds cannot be shown.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::failure(500, "InternalError", message)
    }

    /// 404 NotFound for a path the server does not serve.
    pub fn no_such_path() -> Self {
        Self::failure(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 MethodNotAllowed for a write: it goes to the apiserver.
    pub fn read_only(method: &str, subject: &Subject<'_>) -> Self {
        let mut status = Self::failure(
            405,
            "MethodNotAllowed",
            format!(
                "watchproxy serves get, list and watch of {} from its caches, not {method}: \
                 send writes to the Kubernetes API server",
                qualified(subject)
            ),
        );
        status.details = named(subject);
        status
    }

    /// The `Retry-After` header's seconds, when the client should wait.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        Some(self.details.retry_after_seconds).filter(|s| *s > 0)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Status is plain data")
    }
}

/// `pods` or `deployments.apps`: a resource as the apiserver's messages
/// name it.
fn qualified(subject: &Subject<'_>) -> String {
    match subject.group {
        "" => subject.plural.to_owned(),
        group => format!("{}.{group}", subject.plural),
    }
}

fn named(subject: &Subject<'_>) -> Details {
    Details {
        name: subject.name.unwrap_or_default().to_owned(),
        group: subject.group.to_owned(),
        kind: subject.plural.to_owned(),
        ..Details::default()
    }
}

/// A failure as Kubernetes' API shows it.
pub fn kubernetes_status(e: ApiError, subject: &Subject<'_>) -> KubeStatus {
    let retry = e
        .retry_after()
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        .max(1);
    let with_retry = |mut s: KubeStatus| {
        s.details.retry_after_seconds = retry;
        s
    };
    let message = e.to_string();
    match e {
        ApiError::UnknownResource { .. }
        | ApiError::UnknownMethod { .. }
        | ApiError::OutsideServedKeys { .. } => KubeStatus::no_such_path(),
        ApiError::NotFound { .. } => {
            let name = subject.name.unwrap_or_default();
            let mut s = KubeStatus::failure(
                404,
                "NotFound",
                format!("{} {name:?} not found", qualified(subject)),
            );
            s.details = named(subject);
            s
        }
        ApiError::InvalidArgument { .. }
        | ApiError::MalformedRequest(_)
        | ApiError::RequestAborted(_)
        | ApiError::HeadersTooLarge { .. } => KubeStatus::bad_request(message),
        ApiError::TooOld { .. }
        | ApiError::FellBehind { .. }
        | ApiError::Compacted { .. }
        | ApiError::ContinueExpired { .. } => KubeStatus::failure(410, "Expired", message),
        ApiError::TooLarge { .. } => {
            let mut s = with_retry(KubeStatus::failure(504, "Timeout", message));
            s.details.causes.push(Cause {
                reason: "ResourceVersionTooLarge",
                message: "Too large resource version".to_owned(),
                field: String::new(),
            });
            s
        }
        ApiError::NotReady { .. }
        | ApiError::NotFresh { .. }
        | ApiError::OverBudget { .. }
        | ApiError::Etcd(_)
        | ApiError::ShuttingDown { .. }
        | ApiError::ConnectionAged { .. } => {
            with_retry(KubeStatus::failure(503, "ServiceUnavailable", message))
        }
        ApiError::TooManyWatchers { .. }
        | ApiError::UserLimit { .. }
        | ApiError::Overloaded { .. } => {
            with_retry(KubeStatus::failure(429, "TooManyRequests", message))
        }
        ApiError::DeadlineExceeded | ApiError::RequestTooSlow { .. } => {
            KubeStatus::failure(504, "Timeout", message)
        }
        ApiError::ReadOnly { method } => KubeStatus::read_only(&method, subject),
        ApiError::RequestTooLarge { .. } => {
            KubeStatus::failure(413, "RequestEntityTooLarge", message)
        }
        ApiError::Unauthenticated { .. } | ApiError::LoginFailed => {
            KubeStatus::failure(401, "Unauthorized", "Unauthorized")
        }
        ApiError::CredentialEnded { .. } => KubeStatus::failure(401, "Unauthorized", message),
        ApiError::PermissionDenied {
            user, namespace, ..
        } => {
            let what = match subject.name {
                Some(name) => format!("{} {name:?}", qualified(subject)),
                None => qualified(subject),
            };
            let scope = match namespace.as_str() {
                "" => "at the cluster scope".to_owned(),
                ns => format!("in the namespace {ns:?}"),
            };
            let mut s = KubeStatus::failure(
                403,
                "Forbidden",
                format!(
                    "{what} is forbidden: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
                    subject.verb, subject.plural, subject.group
                ),
            );
            s.details = named(subject);
            s
        }
        ApiError::AccessChanged { .. } | ApiError::BookmarksNotAllowed { .. } => {
            KubeStatus::failure(403, "Forbidden", message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Lapse;

    fn pods<'a>(name: Option<&'a str>, verb: &'a str) -> Subject<'a> {
        Subject {
            group: "",
            plural: "pods",
            name,
            verb,
        }
    }

    fn json(s: &KubeStatus) -> serde_json::Value {
        serde_json::from_slice(&s.to_json()).unwrap()
    }

    #[test]
    fn not_found_is_worded_and_detailed_as_the_apiservers() {
        let s = kubernetes_status(
            ApiError::NotFound {
                key: "/registry/pods/ns/web-0".into(),
            },
            &pods(Some("web-0"), "get"),
        );
        assert_eq!(
            json(&s),
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "pods \"web-0\" not found",
                "reason": "NotFound",
                "details": {"name": "web-0", "kind": "pods"},
                "code": 404
            })
        );
        let apps = Subject {
            group: "apps",
            plural: "deployments",
            name: Some("d"),
            verb: "get",
        };
        let s = kubernetes_status(ApiError::NotFound { key: "k".into() }, &apps);
        assert_eq!(s.message, "deployments.apps \"d\" not found");
    }

    #[test]
    fn an_expired_version_is_410_and_a_future_one_a_retry_with_its_cause() {
        let s = kubernetes_status(
            ApiError::TooOld {
                requested: 5,
                oldest: 10,
                current: 20,
            },
            &pods(None, "watch"),
        );
        assert_eq!((s.code, s.reason), (410, "Expired"));
        let s = kubernetes_status(
            ApiError::TooLarge {
                requested: 50,
                current: 20,
            },
            &pods(None, "list"),
        );
        let v = json(&s);
        assert_eq!((s.code, s.reason), (504, "Timeout"));
        assert_eq!(
            v["details"]["causes"][0]["reason"],
            "ResourceVersionTooLarge"
        );
        assert_eq!(v["details"]["retryAfterSeconds"], 1);
        assert_eq!(s.retry_after_seconds(), Some(1));
    }

    #[test]
    fn limits_and_readiness_say_when_to_come_back() {
        let s = kubernetes_status(
            ApiError::UserLimit {
                user: "alice".into(),
                what: "watches".into(),
                retry_after: Some(std::time::Duration::from_millis(1500)),
            },
            &pods(None, "watch"),
        );
        assert_eq!(
            (s.code, s.reason, s.retry_after_seconds()),
            (429, "TooManyRequests", Some(2))
        );
        let s = kubernetes_status(
            ApiError::NotReady {
                resource: "pods".into(),
            },
            &pods(None, "list"),
        );
        assert_eq!((s.code, s.retry_after_seconds()), (503, Some(1)));
        let s = kubernetes_status(ApiError::NotFound { key: "k".into() }, &pods(None, "get"));
        assert_eq!(s.retry_after_seconds(), None);
        assert!(json(&s)["details"].get("retryAfterSeconds").is_none());
    }

    #[test]
    fn refusals_name_the_user_verb_resource_and_scope() {
        let denied = |namespace: &str| ApiError::PermissionDenied {
            user: "alice".into(),
            verb: "list",
            resource: "pods".into(),
            namespace: namespace.into(),
            too_wide: false,
        };
        let s = kubernetes_status(denied("ns"), &pods(None, "list"));
        assert_eq!((s.code, s.reason), (403, "Forbidden"));
        assert_eq!(
            s.message,
            "pods is forbidden: User \"alice\" cannot list resource \"pods\" in API group \"\" in the namespace \"ns\""
        );
        let s = kubernetes_status(denied(""), &pods(Some("web-0"), "get"));
        assert_eq!(
            s.message,
            "pods \"web-0\" is forbidden: User \"alice\" cannot get resource \"pods\" in API group \"\" at the cluster scope"
        );
        let s = kubernetes_status(
            ApiError::Unauthenticated { reason: "no token" },
            &pods(None, "list"),
        );
        assert_eq!((s.code, s.message.as_str()), (401, "Unauthorized"));
        let ended = ApiError::CredentialEnded {
            lapse: Lapse::Expired,
            detail: "the token expired",
            last: Some(7),
        };
        assert_eq!(kubernetes_status(ended, &pods(None, "watch")).code, 401);
    }

    #[test]
    fn a_write_is_sent_to_the_apiserver() {
        let s = kubernetes_status(
            ApiError::ReadOnly {
                method: "DELETE".into(),
            },
            &pods(Some("web-0"), "delete"),
        );
        assert_eq!((s.code, s.reason), (405, "MethodNotAllowed"));
        assert!(s
            .message
            .contains("not DELETE: send writes to the Kubernetes API server"));
    }
}
