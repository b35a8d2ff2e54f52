//! RequestProgress: a cache's proof that it caught up with etcd, for reads
//! and for watches.

use std::time::Duration;

use tonic::{Request, Response, Status};

use super::call::CallInfo;
use super::error::ApiError;
use super::{Api, CallMeta};
use crate::config::Verb;
use crate::object::RequestedVersion;
use crate::pb;

/// How long a progress request waits for a cache's watches to reach
/// etcd's revision: long enough for events in flight.
pub const PROGRESS_WAIT: Duration = Duration::from_millis(250);

impl Api {
    pub async fn request_progress(
        &self,
        request: Request<pb::ProgressRequest>,
    ) -> Result<Response<pb::ProgressResponse>, Status> {
        let (meta, req) = CallMeta::of(request);
        let info = CallInfo {
            method: "RequestProgress",
            resource: &req.resource,
            label_selector: "",
            field_selector: "",
        };
        let call = async {
            let entered = self.enter_read(&meta)?;
            let (s, scope) = self.admit(&entered, Verb::Watch, &req.resource, &req.namespace)?;
            // The digest is over every object of the resource, and the
            // bookmarks go to every watch of it: only for a caller whose
            // rule covers it whole (every namespace, no selector forced).
            let whole = scope.covers_whole(&req.namespace);
            let user = &entered.identity.caller.user;
            if req.bookmark_watches {
                if !whole {
                    return Err(ApiError::BookmarksNotAllowed {
                        user: user.clone(),
                        resource: req.resource.clone(),
                    });
                }
                self.user_limits.costly_read(&entered.identity)?;
            }
            let snapshot = self.cache_for(s, RequestedVersion::Latest).await?;
            let now = snapshot.revision;
            let dispatched = s.cache.wait_dispatched(now, PROGRESS_WAIT).await.min(now);
            if req.bookmark_watches {
                s.cache.dispatcher().bookmark_all(dispatched);
            }
            let changed = (snapshot.changed != 0).then_some(snapshot.changed);
            Ok(pb::ProgressResponse {
                resource_version: now.to_string(),
                watch_resource_version: dispatched.to_string(),
                changed_resource_version: changed.map(|c| c.to_string()).unwrap_or_default(),
                state_digest: (snapshot.digest)
                    .filter(|_| changed.is_some() && whole)
                    .map(|d| d.to_string())
                    .unwrap_or_default(),
            })
        };
        self.answer(&meta.metadata, info, call).await
    }
}
