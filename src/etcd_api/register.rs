//! What an etcd Watch stream asks of the caches: a watch registered as
//! its caller may have it, and the revision a progress request is
//! answered with.

use std::collections::HashSet;
use std::sync::Arc;

use super::keys::{KeyRange, Located};
use super::merge::{Merge, PartFeed, Watched};
use super::EtcdApi;
use crate::access::{Grant, Granted, Identity};
use crate::api::error::ApiError;
use crate::api::query::WatchQuery;
use crate::api::{Api, Entered, WatchStream, PROGRESS_WAIT};
use crate::config::Verb;
use crate::dispatch::{Inbox, Place};
use crate::object::{RequestedVersion, Resource, Revision};

/// The watch a creation asks for, registered as the caller may have it,
/// and the resources it reads.
pub(super) async fn start(
    etcd: EtcdApi,
    identity: Identity,
    start_revision: i64,
    range: KeyRange,
    prev_kv: bool,
    home: Home,
) -> Result<(Watched, Vec<String>), ApiError> {
    let api = &etcd.core;
    let readable = |r: &Resource| {
        let auth = &api.authority().current().auth;
        auth.reaches(&identity.caller, Verb::Watch, &r.name)
    };
    let placement = etcd.place(&range, readable)?;
    // The keys between the served prefixes are allowed as a cache part
    // is: judged now, held while the watch is open.
    let gaps_grant = match placement.gaps.is_empty() {
        true => None,
        false => {
            let Entered { judged, identity } = api.enter_as(&identity)?;
            (judged.auth).authorize_unserved(&identity.caller, Verb::Watch)?;
            let grant = Grant::of(identity, Verb::Watch, Granted::Unserved);
            Some(api.authority().hold(grant, &judged))
        }
    };
    let resources = placement.resources();
    if let Some(whole) = placement.whole() {
        let after = match start_revision {
            n if n > 0 => Some(n as Revision - 1),
            _ => None,
        };
        let stream = register(api, &identity, whole, after, &home).await?;
        return Ok((Watched::One(stream), resources));
    }
    // Every part from one revision: the one asked for, or etcd's now as
    // the first cache knows it.
    let after = match (start_revision, placement.parts.first()) {
        (n, _) if n > 0 => n as Revision - 1,
        (_, Some(first)) => now(api, first).await?,
        (_, None) => 0,
    };
    let mut sources = Vec::with_capacity(placement.parts.len() + placement.gaps.len());
    for part in &placement.parts {
        let stream = register(api, &identity, part, Some(after), &home).await?;
        sources.push((part.range.start.clone(), PartFeed::Cache(Box::new(stream))));
    }
    for gap in &placement.gaps {
        let from = if after > 0 { after + 1 } else { 0 };
        let stream = etcd.watch_gap(gap, from, prev_kv).await?;
        sources.push((gap.start.clone(), PartFeed::Etcd(Box::new(stream))));
    }
    sources.sort_by(|a, b| a.0.cmp(&b.0));
    let sources = sources.into_iter().map(|(_, s)| s).collect();
    Ok((
        Watched::Merged(Box::new(Merge::new(sources, after, gaps_grant))),
        resources,
    ))
}

/// etcd's revision at the time of the call, once `part`'s cache has it.
async fn now(api: &Api, part: &Located<'_>) -> Result<Revision, ApiError> {
    let s = part.served;
    let _ = tokio::time::timeout(api.freshness_wait(), s.cache.wait_ready()).await;
    Ok(api.cache_for(s, RequestedVersion::Latest).await?.revision)
}

/// Where a stream's watches wait for their deliveries: its connection's
/// inbox and the stream's place there, on the service's own HTTP/2 path
/// (the connection's task then sorts them with every other watch's, and
/// names the stream); none, an inbox of each watch's own.
pub(super) type Home = Option<(Arc<Inbox>, Place)>;

/// A watcher of `part` after `after` (none: from now), as the caller may
/// have it.
async fn register(
    api: &Api,
    identity: &Identity,
    part: &Located<'_>,
    after: Option<Revision>,
    home: &Home,
) -> Result<WatchStream, ApiError> {
    let entered = api.enter_as(identity)?;
    let name = &part.served.cache.resource.name;
    let limit = api.user_limits().watch(identity)?;
    let (s, scope) = (api.admit(&entered, Verb::Watch, name, &part.namespace))?;
    let predicate = scope.predicate(&s.cache.resource, &part.namespace, "", "", "")?;
    // etcd never refuses a watch for being early: one created while the
    // cache is still listing waits for it (within the freshness bound,
    // then fails as a call would).
    let _ = tokio::time::timeout(api.freshness_wait(), s.cache.wait_ready()).await;
    let after = match after {
        Some(after) => after,
        // From now: after etcd's revision at the time of the call.
        None => api.cache_for(s, RequestedVersion::Latest).await?.revision,
    };
    let query = WatchQuery {
        predicate,
        projection: None,
        version: RequestedVersion::At(after),
        send_initial_events: false,
        batch_initial_events: false,
        allow_bookmarks: true,
        timeout: None,
    };
    let (resource, namespace) = (s.cache.resource.clone(), part.namespace.as_str());
    let Entered { judged, identity } = entered;
    let grant = Grant::new(identity, Verb::Watch, resource, namespace, scope);
    let held = api.authority().hold(grant, &judged);
    let inbox = home
        .as_ref()
        .map_or_else(Inbox::solo, |(inbox, _)| inbox.clone());
    let stream = (api.start_watch(s, query, inbox, (limit, held))).await?;
    if let Some((_, place)) = home {
        stream.report_as(*place);
    }
    Ok(stream)
}

/// What a progress request is answered with: the revision up to which
/// the caches of `names` have dispatched every event to their watches,
/// once they have had [`PROGRESS_WAIT`] to reach etcd's revision at the
/// time of the call. A cache whose prefix is idle stands at its last
/// event (or etcd's last progress notification) until then: a proof that
/// its objects are unchanged leaves out keys created and deleted since,
/// whose events may still be on their way. None when a cache cannot be
/// read at all.
pub(super) async fn fresh_revision(api: Api, names: HashSet<String>) -> Option<Revision> {
    let mut revision = Revision::MAX;
    for name in names {
        let s = api.served(&name).ok()?;
        let now = api
            .cache_for(s, RequestedVersion::Latest)
            .await
            .ok()?
            .revision;
        let dispatched = s.cache.wait_dispatched(now, PROGRESS_WAIT).await;
        revision = revision.min(dispatched.min(now));
    }
    (revision != Revision::MAX).then_some(revision)
}
