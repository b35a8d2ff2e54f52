//! Requests checked at the edge: each becomes a typed query, or an error
//! that names the field at fault. The handlers read only these.

use std::sync::Arc;
use std::time::Duration;

use super::continue_token::ContinueToken;
use super::error::ApiError;
use crate::access::Scope;
use crate::config::ValueFormat;
use crate::object::{Projection, RequestedVersion, Resource, Revision};
use crate::pb;
use crate::selector::{Predicate, Shard};

/// Which state a List reads.
#[derive(Debug)]
pub enum ListAt {
    /// A state not older than the version asked for (Kubernetes'
    /// `NotOlderThan`; unset: the latest, consistent with etcd).
    NotOlderThan(RequestedVersion),
    /// The state exactly at this revision.
    Exact(Revision),
    /// The next page of a list, cut from the revision of its first page.
    Continue(ContinueToken),
}

/// The shard a request asks for; none for the whole resource.
fn shard(
    resource: &Resource,
    shard: Option<&pb::ShardSelector>,
) -> Result<Option<Shard>, ApiError> {
    let Some(s) = shard else { return Ok(None) };
    let ranges = s.ranges.iter().map(|r| (r.start, r.end));
    Shard::new(resource, &s.field, ranges)
        .map(Some)
        .map_err(|e| ApiError::invalid("shard", e.to_string()))
}

/// The projection a request asks for; none for the whole value.
fn projection(
    resource: &Resource,
    fields: &[String],
    metadata_only: bool,
) -> Result<Option<Arc<Projection>>, ApiError> {
    let projection = Projection::new(fields, metadata_only)
        .map_err(|e| ApiError::invalid("fields", e.to_string()))?;
    if projection.is_some() && resource.format != ValueFormat::Json {
        return Err(ApiError::invalid(
            "fields",
            format!(
                "{} holds values of format {:?}; only JSON values can be projected",
                resource.name, resource.format
            ),
        ));
    }
    Ok(projection.map(Arc::new))
}

#[derive(Debug)]
pub struct ListQuery {
    pub predicate: Predicate,
    /// What of each value is sent; none: all of it.
    pub projection: Option<Arc<Projection>>,
    pub at: ListAt,
    /// Objects per page; `usize::MAX` for all of them.
    pub limit: usize,
    /// What the list's continue tokens are bound to.
    pub token_scope: u64,
}

impl ListQuery {
    pub fn parse(
        req: &pb::ListRequest,
        resource: &Resource,
        scope: &Scope,
        token_scope: u64,
    ) -> Result<Self, ApiError> {
        let predicate = scope
            .predicate(
                resource,
                &req.namespace,
                "",
                &req.label_selector,
                &req.field_selector,
            )?
            .in_shard(shard(resource, req.shard.as_ref())?);
        let version = RequestedVersion::parse(&req.resource_version)?;
        let exact = match pb::ResourceVersionMatch::try_from(req.resource_version_match) {
            Ok(m) => m == pb::ResourceVersionMatch::Exact,
            Err(_) => {
                return Err(ApiError::invalid(
                    "resource_version_match",
                    format!(
                        "unknown resource_version_match {}",
                        req.resource_version_match
                    ),
                ))
            }
        };
        let limit = match req.limit {
            n if n < 0 => return Err(ApiError::invalid("limit", "limit must not be negative")),
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let at = if !req.continue_token.is_empty() {
            if version != RequestedVersion::Latest || exact {
                return Err(ApiError::invalid(
                    "resource_version",
                    "resource_version must be unset when continue_token is set",
                ));
            }
            ListAt::Continue(ContinueToken::decode(
                &req.continue_token,
                resource,
                token_scope,
            )?)
        } else if exact {
            let RequestedVersion::At(n) = version else {
                return Err(ApiError::invalid(
                    "resource_version",
                    "EXACT needs a resource_version other than \"\" and \"0\"",
                ));
            };
            ListAt::Exact(n)
        } else {
            ListAt::NotOlderThan(version)
        };
        Ok(Self {
            predicate,
            projection: projection(resource, &req.fields, req.metadata_only)?,
            at,
            limit,
            token_scope,
        })
    }
}

#[derive(Debug)]
pub struct GetQuery {
    pub key: String,
    /// Selects the one object, as the caller may see it.
    pub predicate: Predicate,
    pub version: RequestedVersion,
    pub projection: Option<Arc<Projection>>,
}

impl GetQuery {
    pub fn parse(
        req: &pb::GetRequest,
        resource: &Resource,
        scope: &Scope,
    ) -> Result<Self, ApiError> {
        if req.name.is_empty() {
            return Err(ApiError::invalid(
                "name",
                format!("name is required for {}", resource.name),
            ));
        }
        if resource.namespaced && req.namespace.is_empty() {
            return Err(ApiError::invalid(
                "namespace",
                format!(
                    "namespace is required for {}, a namespaced resource",
                    resource.name
                ),
            ));
        }
        Ok(Self {
            key: resource.key(&req.namespace, &req.name),
            predicate: scope.predicate(resource, &req.namespace, &req.name, "", "")?,
            version: RequestedVersion::parse(&req.resource_version)?,
            projection: projection(resource, &req.fields, req.metadata_only)?,
        })
    }
}

#[derive(Debug)]
pub struct WatchQuery {
    pub predicate: Predicate,
    pub projection: Option<Arc<Projection>>,
    pub version: RequestedVersion,
    /// The current state first, as ADDED events; implied by a start at the
    /// latest or any version.
    pub send_initial_events: bool,
    /// The initial state in messages of many objects each.
    pub batch_initial_events: bool,
    pub allow_bookmarks: bool,
    /// When the server ends the watch (with OK); none: never.
    pub timeout: Option<Duration>,
}

impl WatchQuery {
    pub fn parse(
        req: &pb::WatchRequest,
        resource: &Resource,
        scope: &Scope,
    ) -> Result<Self, ApiError> {
        let predicate = scope
            .predicate(
                resource,
                &req.namespace,
                &req.name,
                &req.label_selector,
                &req.field_selector,
            )?
            .in_shard(shard(resource, req.shard.as_ref())?);
        let timeout = match req.timeout_seconds {
            t if t < 0 => {
                return Err(ApiError::invalid(
                    "timeout_seconds",
                    "timeout_seconds must not be negative",
                ))
            }
            0 => None,
            t => Some(Duration::from_secs(t as u64)),
        };
        Ok(Self {
            predicate,
            projection: projection(resource, &req.fields, req.metadata_only)?,
            version: RequestedVersion::parse(&req.resource_version)?,
            send_initial_events: req.send_initial_events,
            batch_initial_events: req.batch_initial_events,
            allow_bookmarks: req.allow_bookmarks,
            timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: ApiError) -> &'static str {
        match e {
            ApiError::InvalidArgument { field, .. } => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_bad_list_request_names_its_field() {
        let r = Resource::for_tests(&["spec.nodeName"]);
        let list = |f: fn(&mut pb::ListRequest)| {
            let mut req = pb::ListRequest {
                resource: "pods".into(),
                ..Default::default()
            };
            f(&mut req);
            ListQuery::parse(&req, &r, &Scope::unrestricted(), 0)
        };
        type Spoil = fn(&mut pb::ListRequest);
        let cases: [(Spoil, &str); 8] = [
            (|r| r.limit = -1, "limit"),
            (|r| r.fields = vec!["spec..nodeName".into()], "fields"),
            (|r| r.resource_version = "x".into(), "resource_version"),
            (|r| r.resource_version_match = 9, "resource_version_match"),
            (|r| r.label_selector = "a in".into(), "label_selector"),
            (
                |r| r.field_selector = "spec.other=x".into(),
                "field_selector",
            ),
            (|r| r.continue_token = "garbage!".into(), "continue_token"),
            (
                |r| r.resource_version_match = pb::ResourceVersionMatch::Exact as i32,
                "resource_version",
            ),
        ];
        for (bad, field) in cases {
            assert_eq!(field_of(list(bad).unwrap_err()), field);
        }
        let q = list(|r| r.limit = 5).unwrap();
        assert_eq!(q.limit, 5);
        assert!(matches!(
            q.at,
            ListAt::NotOlderThan(RequestedVersion::Latest)
        ));
        let q = list(|r| {
            r.resource_version = "7".into();
            r.resource_version_match = pb::ResourceVersionMatch::Exact as i32;
        })
        .unwrap();
        assert!(matches!(q.at, ListAt::Exact(7)));
        assert_eq!(q.limit, usize::MAX);
    }

    #[test]
    fn get_and_watch_requests_are_checked_field_by_field() {
        let r = Resource::for_tests(&[]);
        let get = |ns: &str, name: &str| {
            GetQuery::parse(
                &pb::GetRequest {
                    resource: "pods".into(),
                    namespace: ns.into(),
                    name: name.into(),
                    resource_version: String::new(),
                    ..Default::default()
                },
                &r,
                &Scope::unrestricted(),
            )
        };
        assert_eq!(field_of(get("ns", "").unwrap_err()), "name");
        assert_eq!(field_of(get("", "a").unwrap_err()), "namespace");
        assert_eq!(get("ns", "a").unwrap().key, "/p/ns/a");

        let watch = pb::WatchRequest {
            timeout_seconds: -1,
            ..Default::default()
        };
        let err = WatchQuery::parse(&watch, &r, &Scope::unrestricted()).unwrap_err();
        assert_eq!(field_of(err), "timeout_seconds");
        let watch = pb::WatchRequest {
            timeout_seconds: 30,
            resource_version: "12".into(),
            ..Default::default()
        };
        let q = WatchQuery::parse(&watch, &r, &Scope::unrestricted()).unwrap();
        assert_eq!(q.timeout, Some(Duration::from_secs(30)));
        assert_eq!(q.version, RequestedVersion::At(12));
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        /// Whatever a List request holds, it is a query or INVALID_ARGUMENT
        /// naming one of its fields.
        #[test]
        fn fuzz_list_requests(
            labels in crate::fuzzing::text("label_selector"),
            fields in crate::fuzzing::text("field_selector"),
            version in crate::fuzzing::text("resource_version"),
            token in crate::fuzzing::text("continue_token"),
            limit in proptest::prelude::any::<i64>(),
            version_match in 0i32..4,
        ) {
            let r = Resource::for_tests(&["spec.nodeName"]);
            let req = pb::ListRequest {
                resource: "pods".into(),
                label_selector: labels,
                field_selector: fields,
                resource_version: version,
                continue_token: token,
                limit,
                resource_version_match: version_match,
                ..Default::default()
            };
            if let Err(e) = ListQuery::parse(&req, &r, &Scope::unrestricted(), 0) {
                let field = field_of(e);
                proptest::prop_assert!([
                    "label_selector", "field_selector", "resource_version",
                    "resource_version_match", "continue_token", "limit",
                ].contains(&field), "{}", field);
            }
        }
    }
}
