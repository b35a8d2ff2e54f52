//! List and Get: pages cut from a cache snapshot, or read from the
//! resource's origin (etcd, or the upstream watchproxy) at a revision the
//! cache cannot show. Every page of a list comes from the revision of its
//! first.

use std::sync::Arc;

use super::consistency::ReadFrom;
use super::continue_token::ContinueToken;
use super::error::ApiError;
use super::query::{GetQuery, ListAt, ListQuery};
use super::wire::object_pb;
use super::{Api, Served};
use crate::access::Identity;
use crate::cache::{Digest, NotInWindow, Snapshot};
use crate::object::{Object, Projection, Resource, Revision};
use crate::pb;
use crate::selector::{Predicate, Shard};
use crate::source::{EtcdError, ObjectsPage, PageStart};

/// What a page says about the list it belongs to.
struct Page {
    revision: Revision,
    /// What its continue token is bound to.
    scope: u64,
    more: bool,
    remaining: Option<usize>,
    /// The newest change in the objects (0: not known).
    changed: Revision,
    /// The digest of the resource's objects, where they are the current ones.
    digest: Option<Digest>,
    from_origin: bool,
    /// Where the upstream watchproxy's list goes on.
    upstream: Option<String>,
}

impl Api {
    /// One page of a List by `reader`.
    pub async fn list_page(
        &self,
        s: &Served,
        q: ListQuery,
        reader: &Identity,
    ) -> Result<pb::ListResponse, ApiError> {
        let projection = q.projection.clone();
        let shard = (q.predicate.shard()).map(|shard| shard_pb(&s.cache.resource, shard));
        let mut page = self.read_page(s, q, reader).await?;
        page.shard = shard;
        if let Some(projection) = projection {
            page.items.iter_mut().for_each(|o| project(&projection, o));
        }
        Ok(page)
    }

    /// `reader` is charged for what the cache cannot answer as it is: a
    /// read from the origin, a snapshot rebuilt at an old revision.
    async fn read_page(
        &self,
        s: &Served,
        q: ListQuery,
        reader: &Identity,
    ) -> Result<pb::ListResponse, ApiError> {
        let (predicate, limit, scope) = (&q.predicate, q.limit, q.token_scope);
        let costly = || self.user_limits.costly_read(reader);
        match q.at {
            ListAt::Continue(token) => {
                let after = Some(token.after.as_str());
                if token.from_origin || !s.cache.has_snapshot(token.revision) {
                    costly()?;
                }
                if token.from_origin {
                    let start = PageStart {
                        after,
                        upstream: token.upstream.as_deref(),
                    };
                    return (self.origin_page(s, predicate, token.revision, start, limit, scope))
                        .await;
                }
                match s.cache.snapshot_at(token.revision) {
                    Ok(snapshot) => Ok(snapshot_page(s, &snapshot, predicate, after, limit, scope)),
                    Err(NotInWindow::TooOld(_)) | Err(NotInWindow::Future { .. }) => {
                        Err(ApiError::ContinueExpired {
                            revision: token.revision,
                        })
                    }
                }
            }
            ListAt::Exact(n) => {
                if let ReadFrom::Origin(_) = self.catch_up(s, Some(n)).await? {
                    costly()?;
                    let start = PageStart::default();
                    return (self.origin_page(s, predicate, n, start, limit, scope)).await;
                }
                // Caught up to n: what is not at hand is rebuilt or read.
                if !s.cache.has_snapshot(n) {
                    costly()?;
                }
                match s.cache.snapshot_at(n) {
                    Ok(snapshot) => Ok(snapshot_page(s, &snapshot, predicate, None, limit, scope)),
                    Err(_) => {
                        let start = PageStart::default();
                        (self.origin_page(s, predicate, n, start, limit, scope)).await
                    }
                }
            }
            ListAt::NotOlderThan(version) => match self.source_for(s, version).await? {
                ReadFrom::Cache(snapshot) => {
                    Ok(snapshot_page(s, &snapshot, predicate, None, limit, scope))
                }
                ReadFrom::Origin(revision) => {
                    costly()?;
                    let start = PageStart::default();
                    (self.origin_page(s, predicate, revision, start, limit, scope)).await
                }
            },
        }
    }

    pub async fn get_object(
        &self,
        s: &Served,
        q: GetQuery,
        reader: &Identity,
    ) -> Result<pb::Object, ApiError> {
        let found = match self.source_for(s, q.version).await? {
            ReadFrom::Cache(snapshot) => snapshot
                .store
                .get(q.key.as_bytes())
                // What the caller may not see is not there.
                .filter(|o| q.predicate.matches(o))
                .map(|o| object_pb(o, o.revision)),
            ReadFrom::Origin(revision) => {
                self.user_limits.costly_read(reader)?;
                let start = PageStart::default();
                let page = (self.origin_page(s, &q.predicate, revision, start, 1, 0)).await?;
                page.items.into_iter().next()
            }
        };
        let mut found = found.ok_or(ApiError::NotFound { key: q.key })?;
        if let Some(projection) = &q.projection {
            project(projection, &mut found);
        }
        Ok(found)
    }

    /// A page of the state at `revision` read from the origin, for
    /// revisions the cache cannot show.
    async fn origin_page(
        &self,
        s: &Served,
        predicate: &Predicate,
        revision: Revision,
        start: PageStart<'_>,
        limit: usize,
        scope: u64,
    ) -> Result<pb::ListResponse, ApiError> {
        let resource = &s.cache.resource;
        let read = (s.origin)
            .objects_at(&s.metrics, resource, predicate, revision, start, limit)
            .await;
        let ObjectsPage {
            items,
            more,
            remaining,
            upstream,
        } = read.map_err(|e| origin_failed(s, revision, e))?;
        let page = Page {
            revision,
            scope,
            more,
            remaining,
            changed: 0,
            digest: None,
            from_origin: true,
            upstream,
        };
        Ok(page_response(resource, items.iter(), page))
    }
}

/// A read of the origin at `revision` that failed, as the caller is told:
/// a revision etcd compacted or has not reached gets its own status.
pub fn origin_failed(s: &Served, revision: Revision, e: EtcdError) -> ApiError {
    match e {
        EtcdError::Compacted { .. } => ApiError::Compacted { revision },
        EtcdError::FutureRevision => ApiError::TooLarge {
            requested: revision,
            current: s.cache.progress().revision,
        },
        e => e.into(),
    }
}

/// Cuts an object's value to what `projection` keeps.
fn project(projection: &Projection, o: &mut pb::Object) {
    if let Some(value) = projection.cut(&o.value) {
        o.value = value.into();
    }
}

/// A page of a snapshot. When more pages follow, the snapshot is kept so
/// they are cut from the same revision.
fn snapshot_page(
    s: &Served,
    snapshot: &Snapshot,
    predicate: &Predicate,
    after: Option<&str>,
    limit: usize,
    scope: u64,
) -> pb::ListResponse {
    let resource = &s.cache.resource;
    let mut it = snapshot.select(resource, predicate, after);
    let items: Vec<&Arc<Object>> = it.by_ref().take(limit).collect();
    let remaining = if predicate.has_selectors() {
        None
    } else {
        Some(it.count())
    };
    let more = match remaining {
        Some(n) => n > 0,
        None => snapshot
            .select(resource, predicate, items.last().map(|o| o.key()))
            .next()
            .is_some(),
    };
    if more {
        s.cache.remember(snapshot.clone());
    }
    let page = Page {
        revision: snapshot.revision,
        scope,
        more,
        remaining,
        changed: snapshot.changed,
        digest: snapshot.digest,
        from_origin: false,
        upstream: None,
    };
    page_response(resource, items.into_iter(), page)
}

fn page_response<'a>(
    resource: &Resource,
    items: impl Iterator<Item = &'a Arc<Object>>,
    page: Page,
) -> pb::ListResponse {
    let items: Vec<pb::Object> = items.map(|o| object_pb(o, o.revision)).collect();
    let continue_token = match items.last() {
        Some(last) if page.more => {
            let (after, revision) = (last.key.clone(), page.revision);
            let mut token = ContinueToken::new(resource, revision, after, page.scope);
            if page.from_origin {
                token = token.read_from_origin(page.upstream);
            }
            token.encode()
        }
        _ => String::new(),
    };
    pb::ListResponse {
        items,
        resource_version: page.revision.to_string(),
        continue_token,
        remaining_item_count: page.remaining.filter(|_| page.more).map(|n| n as i64),
        shard: None,
        changed_resource_version: match page.changed {
            0 => String::new(),
            n => n.to_string(),
        },
        state_digest: (page.digest)
            .filter(|_| page.changed != 0)
            .map(|d| d.to_string())
            .unwrap_or_default(),
    }
}

/// The shard a list covers, as the request would name it.
fn shard_pb(resource: &Resource, shard: &Shard) -> pb::ShardSelector {
    let field = resource
        .shard_fields()
        .nth(shard.field())
        .unwrap_or_default();
    pb::ShardSelector {
        field: field.to_owned(),
        ranges: (shard.half_open())
            .map(|(start, end)| pb::HashRange { start, end })
            .collect(),
    }
}
