//! Another watchproxy as a resource's source (`upstream:`): its List, then
//! its Watch with bookmarks, in place of etcd's range and watch. Resource
//! versions are etcd's revisions at every tier, so a client can resume on
//! any tier or replica.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status, Streaming};
use tonic_types::StatusExt;

use super::history::History;
use super::revival::Revival;
use super::upstream::{Listed, Notice, Upstream};
use super::EtcdError;
use crate::cache::{Change, Digest, Sameness};
use crate::config::ClientTls;
use crate::object::{Object, Resource, Revision};
use crate::pb::watch_proxy_client::WatchProxyClient;
use crate::pb::{self, EventType};
use crate::telemetry::ResourceMetrics;

/// Objects per List page read from the upstream.
pub(super) const PAGE: i64 = 1000;

/// A watchproxy serving the resource of the same name: the reflector's
/// source, and where the edge's freshness checks and older reads go.
#[derive(Clone)]
pub struct Tier {
    client: WatchProxyClient<Channel>,
    /// Read for every call, so a rotated token is used at once.
    token_file: Option<Arc<PathBuf>>,
    pub(super) resource: Arc<Resource>,
    pub(super) metrics: ResourceMetrics,
    revival: Arc<Revival>,
    /// The upstream answers RequestProgress (until it says it does not).
    asks_progress: Arc<AtomicBool>,
}

/// A watch on the upstream; `created` once the reflector was told.
pub struct TierWatch {
    stream: Streaming<pb::WatchEvent>,
    created: bool,
}

impl Tier {
    /// Connects lazily: an upstream that is not there yet is retried by
    /// the reflector like an etcd that is not. TLS and token files are
    /// read now, so a missing one fails the start.
    pub fn new(
        url: &str,
        tls: Option<&ClientTls>,
        token_file: Option<&std::path::Path>,
        resource: Arc<Resource>,
        metrics: ResourceMetrics,
    ) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())?;
        if url.starts_with("https://") {
            endpoint = endpoint.tls_config(tls_config(tls)?)?;
        }
        if let Some(file) = token_file {
            read_token(file).map_err(anyhow::Error::msg)?;
        }
        Ok(Self {
            client: WatchProxyClient::new(endpoint.connect_lazy())
                .max_decoding_message_size(usize::MAX),
            token_file: token_file.map(|f| Arc::new(f.to_owned())),
            resource,
            metrics,
            revival: Default::default(),
            asks_progress: Arc::new(AtomicBool::new(true)),
        })
    }

    /// A call's request, with the bearer token when one is configured.
    pub(super) fn request<T>(&self, message: T) -> Result<Request<T>, EtcdError> {
        let mut request = Request::new(message);
        if let Some(file) = &self.token_file {
            let token = read_token(file).map_err(EtcdError::Upstream)?;
            let value = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                EtcdError::Upstream(format!(
                    "the token in {} is not a header value",
                    file.display()
                ))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }

    /// One List call, with the token.
    pub(super) async fn list_page(
        &self,
        list: pb::ListRequest,
    ) -> Result<pb::ListResponse, EtcdError> {
        let request = self.request(list)?;
        let page = self.client.clone().list(request).await.map_err(failed)?;
        Ok(page.into_inner())
    }

    /// An object as the upstream sent it, read again as this resource
    /// reads its values (its fields and hashes are this tier's).
    pub(super) fn object(&self, o: &pb::Object) -> Option<Object> {
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

/// The token in `file`, trimmed; an error names the file, never the token.
fn read_token(file: &std::path::Path) -> Result<String, String> {
    match std::fs::read_to_string(file) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_owned()),
        Ok(_) => Err(format!(
            "the upstream token file {} is empty",
            file.display()
        )),
        Err(e) => Err(format!(
            "reading the upstream token file {}: {e}",
            file.display()
        )),
    }
}

/// TLS to an `https://` upstream: the CA to trust, and a client
/// certificate when the upstream asks for one.
fn tls_config(tls: Option<&ClientTls>) -> anyhow::Result<ClientTlsConfig> {
    let read =
        |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let tls = tls.context("an https:// upstream needs upstream_tls.ca_file: the CA to trust")?;
    let ca = tls
        .ca_file
        .as_ref()
        .context("an https:// upstream needs upstream_tls.ca_file: the CA to trust")?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

/// An upstream failure, sorted as the reflector sorts etcd's: a version
/// the upstream no longer has means listing again, one it has not reached
/// is a future revision.
pub(super) fn failed(status: Status) -> EtcdError {
    let reason = status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone());
    match (status.code(), reason.as_deref()) {
        (_, Some("TOO_LARGE_RESOURCE_VERSION")) => EtcdError::FutureRevision,
        (Code::OutOfRange, _) => EtcdError::Compacted { compacted: 0 },
        _ => EtcdError::Upstream(status.message().to_owned()),
    }
}

impl Tier {
    /// The upstream's answer to a consistent read (never older than etcd's
    /// revision when it started), and what it says of its objects for this
    /// tier to prove it holds the same: its RequestProgress, or, from an
    /// upstream without it, a List of one key, so the upstream cuts no page
    /// of its objects.
    pub(super) async fn current(&self) -> Result<(Revision, Option<Sameness>), EtcdError> {
        if self.asks_progress.load(Ordering::Relaxed) {
            let request = self.request(pb::ProgressRequest {
                resource: self.resource.name.clone(),
                ..Default::default()
            })?;
            match self.client.clone().request_progress(request).await {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    let same = match Digest::parse(&answer.state_digest) {
                        Some(digest) => Some(Sameness::Digest(digest)),
                        None => answer
                            .changed_resource_version
                            .parse()
                            .ok()
                            .map(Sameness::Changed),
                    };
                    return Ok((revision_of(&answer.resource_version)?, same));
                }
                // A watchproxy from before RequestProgress: asked with a
                // List from now on.
                Err(status) if status.code() == Code::Unimplemented => {
                    self.asks_progress.store(false, Ordering::Relaxed);
                }
                Err(status) => return Err(failed(status)),
            }
        }
        const PROBE: &str = "watchproxy-freshness-probe";
        let namespace = match self.resource.namespaced {
            true => PROBE,
            false => "",
        };
        let page = (self.list_page(pb::ListRequest {
            resource: self.resource.name.clone(),
            namespace: namespace.to_owned(),
            field_selector: format!("metadata.name={PROBE}"),
            limit: 1,
            ..Default::default()
        }))
        .await?;
        let same = match Digest::parse(&page.state_digest) {
            Some(digest) => Some(Sameness::Digest(digest)),
            None => changed_of(&page).map(Sameness::Changed),
        };
        Ok((revision_of(&page.resource_version)?, same))
    }

    /// Every object of the upstream's resource, exactly `at` a version or
    /// (none) as it is now, in pages cut from one revision.
    async fn list_at(&self, at: Option<Revision>) -> Result<Listed, EtcdError> {
        let (mut objects, mut first, mut token) = (Vec::new(), None, String::new());
        loop {
            let mut request = pb::ListRequest {
                resource: self.resource.name.clone(),
                limit: PAGE,
                ..Default::default()
            };
            match (at, token.is_empty()) {
                (_, false) => request.continue_token = token,
                (Some(at), true) => {
                    request.resource_version = at.to_string();
                    request.resource_version_match = pb::ResourceVersionMatch::Exact.into();
                }
                (None, true) => {}
            }
            let page = self.list_page(request).await?;
            if first.is_none() {
                let revision = revision_of(&page.resource_version)?;
                first = Some((revision, changed_of(&page).unwrap_or(revision)));
            }
            objects.extend(page.items.iter().filter_map(|o| self.object(o)));
            if page.continue_token.is_empty() {
                break;
            }
            token = page.continue_token;
        }
        let (revision, changed) = first.expect("a page was read");
        Ok(Listed {
            objects,
            revision,
            changed,
        })
    }

    /// The oldest version at or after `from` that the upstream can send
    /// every change after: a watch opened there is refused with the
    /// upstream's oldest when its window does not reach back so far.
    async fn window_start(&self, from: Revision) -> Result<Revision, EtcdError> {
        let request = self.request(pb::WatchRequest {
            resource: self.resource.name.clone(),
            resource_version: from.to_string(),
            ..Default::default()
        })?;
        let status = match self.client.clone().watch(request).await {
            Ok(_) => return Ok(from),
            Err(status) => status,
        };
        let info = status.get_error_details().error_info().cloned();
        let oldest = info
            .filter(|i| i.reason == "TOO_OLD_RESOURCE_VERSION")
            .and_then(|i| i.metadata.get("oldest_resource_version")?.parse().ok());
        match oldest {
            Some(oldest) => Ok(from.max(oldest)),
            None => Err(failed(status)),
        }
    }
}

/// The revision of the newest change in a page of the upstream's current
/// state; none from a watchproxy that does not say.
pub(super) fn changed_of(page: &pb::ListResponse) -> Option<Revision> {
    page.changed_resource_version.parse().ok()
}

/// A resource version the upstream sent.
pub(super) fn revision_of(text: &str) -> Result<Revision, EtcdError> {
    text.parse().map_err(|_| {
        EtcdError::Upstream(format!("the upstream's version {text:?} is not a revision"))
    })
}

impl Upstream for Tier {
    type Watch = TierWatch;

    async fn list(&mut self) -> Result<Listed, EtcdError> {
        self.list_at(None).await
    }

    /// Lists the upstream at a version up to `depth` before its current
    /// one, as far back as its window reaches; the watch from there then
    /// replays the changes since into this tier's window, so clients
    /// resume with versions from before this tier started.
    async fn list_with_history(
        &mut self,
        depth: u64,
    ) -> Result<(Listed, Result<History, EtcdError>), EtcdError> {
        let (now, _) = self.current().await?;
        let from = (self.window_start(now.saturating_sub(depth).max(1)).await?).min(now);
        let mut listed = self.list_at(Some(from)).await?;
        // A list at a past version has no newest change: the objects are
        // known to be the upstream's at `from` only.
        listed.changed = from;
        let history = History {
            events: Vec::new(),
            oldest: from,
            through: from,
            live: Vec::new(),
        };
        Ok((listed, Ok(history)))
    }

    async fn watch(&mut self, after: Revision) -> Result<TierWatch, EtcdError> {
        let request = self.request(pb::WatchRequest {
            resource: self.resource.name.clone(),
            resource_version: after.to_string(),
            allow_bookmarks: true,
            ..Default::default()
        })?;
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

    async fn probe(&mut self) -> bool {
        let probe = tokio::time::timeout(Duration::from_secs(1), self.current());
        matches!(probe.await, Ok(Ok(_)))
    }

    fn revival(&self) -> Option<Arc<Revival>> {
        Some(self.revival.clone())
    }

    async fn next(&mut self, watch: &mut TierWatch) -> Result<Notice, EtcdError> {
        if !std::mem::replace(&mut watch.created, true) {
            return Ok(Notice::Created { watch_id: 0 });
        }
        let event = loop {
            let Some(event) = watch.stream.message().await.map_err(failed)? else {
                return Err(EtcdError::StreamEnded);
            };
            // A resync's events carry the version its lost history starts
            // from, not each object's. This tier lists again once it ends
            // and sends its own watchers the difference, marked as theirs.
            match (event.resync, event.r#type == EventType::Bookmark as i32) {
                (false, _) => break event,
                (true, false) => continue,
                (true, true) => return Err(EtcdError::UpstreamResynced),
            }
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
