//! The gRPC surface: List, Get and Watch served from the watch caches.
//!
//! A call is checked at the edge into a typed query ([`query`]), answered
//! from the cache or etcd under the resource version rules
//! ([`consistency`], [`list`], [`watch`]), and its failure becomes a
//! status in one place ([`error`]). [`service`] routes the calls as a
//! tower service; [`server`] serves it on HTTP/2, on the service's own
//! connection path ([`http2`]) or on tonic's.

pub mod admission;
pub mod auth;
mod call;
pub mod compression;
mod consistency;
mod continue_token;
pub mod error;
pub mod etcd;
pub mod health;
mod http2;
/// The HTTP/2 server's fuzz targets, for the fuzzers in `fuzz/`.
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub use http2::fuzz as http2_fuzz;
mod initial;
#[cfg(test)]
mod initial_tests;
mod list;
mod progress;
pub mod query;
pub mod reconfigure;
mod reload;
#[cfg(test)]
mod resync_model_tests;
pub mod server;
pub mod service;
pub mod tls;
pub mod user_limits;
mod watch;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::cache::WatchCache;
use crate::config::{EtcdApiConfig, Outside, Verb};
use crate::dispatch::Inbox;
use crate::pb;
use crate::source::{Freshness, Origin};
use crate::telemetry::{Metrics, ResourceMetrics};
use admission::Identified;
use auth::{Auth, Authority, Grant, Identity, Judged, PeerCerts, Scope};
use call::CallInfo;
pub use continue_token::Sealer;
use error::ApiError;
pub use initial::InitialStates;
use query::{GetQuery, ListQuery, WatchQuery};
use user_limits::UserLimits;
pub use watch::WatchStream;

/// One served resource: its cache, its revision checks and its metrics.
#[derive(Clone)]
pub struct Served {
    pub cache: Arc<WatchCache>,
    /// Where reads the cache cannot answer go.
    pub origin: Origin,
    pub freshness: Arc<Freshness>,
    pub metrics: ResourceMetrics,
    /// One permit per open watch of this resource.
    pub watch_slots: Arc<Semaphore>,
    pub initial_states: Arc<InitialStates>,
}

/// The `WatchProxy` service.
#[derive(Clone)]
pub struct Api {
    resources: Arc<HashMap<String, Served>>,
    /// Bound on waiting for readiness, freshness or a requested version.
    freshness_wait: Duration,
    /// One permit per open watch of any resource.
    watch_slots: Arc<Semaphore>,
    metrics: Metrics,
    /// Who may read what, for new calls and open watches.
    auth: Arc<Authority>,
    user_limits: Arc<UserLimits>,
    shutdown: CancellationToken,
    /// What Watch responses may be compressed in, by preference.
    watch_codecs: Arc<[compression::Codec]>,
    /// Seals the continue tokens it issues, and opens those it is sent.
    sealer: Arc<Sealer>,
    /// Serves etcd's own API too (`etcd_api.enabled`).
    etcd_api: bool,
    /// What etcd's API does with keys outside the served prefixes.
    outside: Outside,
}

/// The client certificates of the call's connection: from the TLS
/// connection info tonic's server keeps, or from the service's own path.
fn peer_certs<T>(request: &Request<T>) -> Option<PeerCerts> {
    request
        .peer_certs()
        .map(PeerCerts)
        .or_else(|| request.extensions().get::<PeerCerts>().cloned())
}

impl Api {
    pub fn new(
        resources: HashMap<String, Served>,
        freshness_wait: Duration,
        max_watchers: usize,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            resources: Arc::new(resources),
            freshness_wait,
            watch_slots: Arc::new(Semaphore::new(max_watchers)),
            auth: Arc::new(Authority::new(Auth::open(metrics.clone()))),
            user_limits: Arc::new(UserLimits::new(&Default::default())),
            metrics,
            shutdown,
            watch_codecs: Arc::new([]),
            sealer: Arc::new(Sealer::random()),
            etcd_api: false,
            outside: Outside::Refuse,
        }
    }

    /// Serves etcd's own read API beside `watchproxy.v1`, as `config`
    /// says.
    pub fn with_etcd_api(mut self, config: &EtcdApiConfig) -> Self {
        self.etcd_api = config.enabled;
        self.outside = config.outside;
        self
    }

    pub(crate) fn serves_etcd_api(&self) -> bool {
        self.etcd_api
    }

    /// Continue tokens sealed with `sealer`'s key: replicas that share it
    /// serve each other's pages.
    pub fn with_continue_key(mut self, sealer: Sealer) -> Self {
        self.sealer = Arc::new(sealer);
        self
    }

    /// Watch responses compressed in the first of `codecs` a client
    /// accepts.
    pub fn with_watch_compression(mut self, codecs: &[compression::Codec]) -> Self {
        self.watch_codecs = codecs.into();
        self
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn watch_codecs(&self) -> &[compression::Codec] {
        &self.watch_codecs
    }

    /// Each user's calls bounded by `limits`.
    pub fn with_user_limits(mut self, limits: UserLimits) -> Self {
        self.user_limits = Arc::new(limits);
        self
    }

    /// Calls authenticated and authorized by `auth`.
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = Arc::new(Authority::new(auth));
        self
    }

    /// The authenticators and rules in use, which a new configuration
    /// replaces.
    pub fn authority(&self) -> &Arc<Authority> {
        &self.auth
    }

    /// The per-user limits in use, which a new configuration changes.
    pub fn user_limits(&self) -> &UserLimits {
        &self.user_limits
    }

    /// Who calls: as admission identified it, else from the call's
    /// metadata and its connection's certificates.
    fn caller(
        &self,
        judged: &Judged,
        metadata: &MetadataMap,
        certs: &Option<PeerCerts>,
        extensions: &http::Extensions,
    ) -> Result<Identity, ApiError> {
        if let Some(Identified(identity)) = extensions.get() {
            return Ok(identity.clone());
        }
        (judged.auth).identify(metadata, certs.as_ref().map(|c| &c.0[..]))
    }

    /// Who calls, from a request's headers and extensions alone: before
    /// its body is read.
    pub(crate) fn identify(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Identity, ApiError> {
        let request = Request::from_parts(
            MetadataMap::from_headers(headers.clone()),
            extensions.clone(),
            (),
        );
        let certs = peer_certs(&request);
        (self.auth.current().auth).identify(request.metadata(), certs.as_ref().map(|c| &c.0[..]))
    }

    /// The resource a call names, and what `identity` may see of it there.
    fn admit(
        &self,
        judged: &Judged,
        identity: &Identity,
        verb: Verb,
        resource: &str,
        namespace: &str,
    ) -> Result<(&Served, Scope), ApiError> {
        let s = self.served(resource)?;
        let scope =
            (judged.auth).authorize(&identity.caller, verb, &s.cache.resource, namespace)?;
        Ok((s, scope))
    }

    fn served(&self, name: &str) -> Result<&Served, ApiError> {
        self.resources.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.resources.keys().map(String::as_str).collect();
            known.sort_unstable();
            ApiError::UnknownResource {
                name: name.to_owned(),
                known: known.join(", "),
            }
        })
    }

    pub async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let certs = peer_certs(&request);
        let (metadata, extensions, mut req) = request.into_parts();
        let opened = match req.continue_token.as_str() {
            "" => Ok(String::new()),
            sealed => self.sealer.open(sealed).map(str::to_owned),
        };
        req.continue_token.clear();
        let info = CallInfo {
            method: "List",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        let call = async {
            let judged = self.auth.current();
            let identity = self.caller(&judged, &metadata, &certs, &extensions)?;
            self.user_limits.unary(&identity.caller)?;
            let (s, scope) = self.admit(
                &judged,
                &identity,
                Verb::List,
                &req.resource,
                &req.namespace,
            )?;
            let token_scope = judged.auth.token_scope(&identity.caller, &scope);
            let req = pb::ListRequest {
                continue_token: opened?,
                ..req.clone()
            };
            let mut query = ListQuery::parse(&req, &s.cache.resource, &scope, token_scope)?;
            query.limit = self.user_limits.page(query.limit);
            let mut page = self.list_page(s, query, &identity.caller.user).await?;
            page.continue_token = self.sealer.seal(&page.continue_token);
            Ok(page)
        };
        self.answer(&metadata, info, call).await
    }

    pub async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::Object>, Status> {
        let certs = peer_certs(&request);
        let (metadata, extensions, req) = request.into_parts();
        let info = CallInfo {
            method: "Get",
            resource: &req.resource,
            label_selector: "",
            field_selector: "",
        };
        let call = async {
            let judged = self.auth.current();
            let identity = self.caller(&judged, &metadata, &certs, &extensions)?;
            self.user_limits.unary(&identity.caller)?;
            let (s, scope) =
                self.admit(&judged, &identity, Verb::Get, &req.resource, &req.namespace)?;
            let query = GetQuery::parse(&req, &s.cache.resource, &scope)?;
            self.get_object(s, query, &identity.caller.user).await
        };
        self.answer(&metadata, info, call).await
    }

    /// Starts a Watch; its stream yields each event encoded for the wire.
    /// A caller that reads the deliveries of several watches in one task
    /// passes their [`Inbox`] as a request extension; otherwise the watch
    /// gets one of its own. Timed and traced until the stream starts; how
    /// a watch ends is counted in `watchproxy_watchers_ended_total`.
    pub async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let certs = peer_certs(&request);
        let (metadata, extensions, req) = request.into_parts();
        let inbox = extensions
            .get::<Arc<Inbox>>()
            .cloned()
            .unwrap_or_else(Inbox::solo);
        let info = CallInfo {
            method: "Watch",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        let call = async {
            let judged = self.auth.current();
            let identity = self.caller(&judged, &metadata, &certs, &extensions)?;
            let place = self.user_limits.watch(&identity.caller)?;
            let (s, scope) = self.admit(
                &judged,
                &identity,
                Verb::Watch,
                &req.resource,
                &req.namespace,
            )?;
            let query = WatchQuery::parse(&req, &s.cache.resource, &scope)?;
            let resource = s.cache.resource.clone();
            let grant = Grant::new(identity, Verb::Watch, resource, &req.namespace, scope);
            let held = self.auth.hold(grant, &judged);
            self.start_watch(s, query, inbox, (place, held)).await
        };
        self.answer(&metadata, info, call).await
    }
}
