//! What an etcd Watch stream asks of the caches: a watch registered as
//! its caller may have it, and the revision a progress request is
//! answered with.

use std::collections::HashSet;

use super::super::auth::{Grant, Identity};
use super::super::error::ApiError;
use super::super::progress::PROGRESS_WAIT;
use super::super::query::{scoped, WatchQuery};
use super::super::{Api, WatchStream};
use super::keys::KeyRange;
use crate::config::Verb;
use crate::dispatch::Inbox;
use crate::object::{RequestedVersion, Revision};

/// The watch a creation asks for, registered as the caller may have it.
pub(super) async fn start(
    api: Api,
    identity: Identity,
    start_revision: i64,
    range: KeyRange,
) -> Result<(WatchStream, String), ApiError> {
    let judged = api.auth.current();
    let place = api.locate(&range)?;
    let name = place.served.cache.resource.name.clone();
    let limit = api.user_limits.watch(&identity.caller)?;
    let (s, scope) = (api.admit(&judged, &identity, Verb::Watch, &name, &place.namespace))?;
    let predicate = scoped(&s.cache.resource, &place.namespace, "", "", "", &scope)?;
    // etcd never refuses a watch for being early: one created while the
    // cache is still listing waits for it (within the freshness bound,
    // then fails as a call would).
    let _ = tokio::time::timeout(api.freshness_wait, s.cache.wait_ready()).await;
    let after = match start_revision {
        n if n > 0 => n as Revision - 1,
        // From now: after etcd's revision at the time of the call.
        _ => api.cache_for(s, RequestedVersion::Latest).await?.revision,
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
    let (resource, namespace) = (s.cache.resource.clone(), place.namespace.as_str());
    let grant = Grant::new(identity, Verb::Watch, resource, namespace, scope);
    let held = api.auth.hold(grant, &judged);
    let stream = (api.start_watch(s, query, Inbox::solo(), (limit, held))).await?;
    Ok((stream, name))
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
        let s = api.resources.get(&name)?;
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
