//! Another watchproxy as a resource's source (`upstream:`): its List, then
//! its Watch with bookmarks, in place of etcd's range and watch. Resource
//! versions are etcd's revisions at every tier, so a client can resume on
//! any tier or replica.

use std::sync::Arc;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use super::history::History;
use super::upstream::{Listed, Notice, Upstream};
use super::EtcdError;
use crate::cache::Change;
use crate::object::{Object, Resource, Revision};
use crate::pb::watch_proxy_client::WatchProxyClient;
use crate::pb::{self, EventType};
use crate::telemetry::ResourceMetrics;

/// Objects per List page read from the upstream.
const PAGE: i64 = 1000;

/// A watchproxy serving the resource of the same name.
pub struct TierUpstream {
    client: WatchProxyClient<Channel>,
    resource: Arc<Resource>,
    metrics: ResourceMetrics,
}

/// A watch on the upstream; `created` once the reflector was told.
pub struct TierWatch {
    stream: Streaming<pb::WatchEvent>,
    created: bool,
}

impl TierUpstream {
    /// Connects lazily: an upstream that is not there yet is retried by
    /// the reflector like an etcd that is not.
    pub fn new(
        url: &str,
        resource: Arc<Resource>,
        metrics: ResourceMetrics,
    ) -> anyhow::Result<Self> {
        let channel = Endpoint::from_shared(url.to_owned())?.connect_lazy();
        Ok(Self {
            client: WatchProxyClient::new(channel).max_decoding_message_size(usize::MAX),
            resource,
            metrics,
        })
    }

    /// An object as the upstream sent it, read again as this resource
    /// reads its values (its fields and hashes are this tier's).
    fn object(&self, o: &pb::Object) -> Option<Object> {
        let revision: Revision = o.resource_version.parse().ok()?;
        match self.resource.decode(o.key.as_bytes(), &o.value, revision) {
            Ok(object) => Some(object),
            Err(e) => {
                super::skip(&self.metrics, o.key.as_bytes(), revision, &e);
                None
            }
        }
    }
}

/// An upstream failure, sorted as the reflector sorts etcd's: a version
/// the upstream no longer has means listing again.
fn failed(status: Status) -> EtcdError {
    match status.code() {
        Code::OutOfRange => EtcdError::Compacted { compacted: 0 },
        _ => EtcdError::Upstream(status.message().to_owned()),
    }
}

impl Upstream for TierUpstream {
    type Watch = TierWatch;

    async fn list(&mut self) -> Result<Listed, EtcdError> {
        let mut objects = Vec::new();
        let (mut revision, mut token) = (None, String::new());
        loop {
            let request = pb::ListRequest {
                resource: self.resource.name.clone(),
                limit: PAGE,
                continue_token: token,
                ..Default::default()
            };
            let page = self
                .client
                .list(request)
                .await
                .map_err(failed)?
                .into_inner();
            revision.get_or_insert(page.resource_version.parse().map_err(|_| {
                EtcdError::Upstream(format!(
                    "the upstream's list version {:?} is not a revision",
                    page.resource_version
                ))
            })?);
            objects.extend(page.items.iter().filter_map(|o| self.object(o)));
            if page.continue_token.is_empty() {
                break;
            }
            token = page.continue_token;
        }
        let revision = revision.expect("a page was read");
        Ok(Listed { objects, revision })
    }

    /// The upstream's watch gives no previous states: an edge's window
    /// starts at its list, whatever the depth asked for.
    async fn history(&mut self, listed: Revision, _depth: u64) -> Result<History, EtcdError> {
        Ok(History {
            events: Vec::new(),
            oldest: listed,
            through: listed,
            live: Vec::new(),
        })
    }

    async fn watch(&mut self, after: Revision) -> Result<TierWatch, EtcdError> {
        let request = pb::WatchRequest {
            resource: self.resource.name.clone(),
            resource_version: after.to_string(),
            allow_bookmarks: true,
            ..Default::default()
        };
        let stream = self
            .client
            .watch(request)
            .await
            .map_err(failed)?
            .into_inner();
        Ok(TierWatch {
            stream,
            created: false,
        })
    }

    async fn next(&mut self, watch: &mut TierWatch) -> Result<Notice, EtcdError> {
        if !std::mem::replace(&mut watch.created, true) {
            return Ok(Notice::Created { watch_id: 0 });
        }
        let Some(event) = watch.stream.message().await.map_err(failed)? else {
            return Err(EtcdError::StreamEnded);
        };
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Bookmark);
        let objects: Vec<&pb::Object> = event.object.iter().chain(&event.objects).collect();
        let revision = |o: &pb::Object| o.resource_version.parse::<Revision>().ok();
        if kind == EventType::Bookmark {
            let at = event.object.as_ref().and_then(revision).unwrap_or(0);
            return Ok(Notice::Progress {
                watch_id: 0,
                revision: at,
            });
        }
        let changes = objects
            .into_iter()
            .filter_map(|o| {
                Some(Change {
                    revision: revision(o)?,
                    key: Arc::from(o.key.as_str()),
                    // An undecodable value leaves the cache, as from etcd.
                    object: match kind {
                        EventType::Deleted => None,
                        _ => self.object(o),
                    },
                })
            })
            .collect();
        Ok(Notice::Changes(changes))
    }
}
