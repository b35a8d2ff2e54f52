//! The read core, and `watchproxy.v1`'s face over it.
//!
//! [`Api`] is the handle every face takes (`watchproxy.v1` here, etcd's API
//! in `etcd_api`), as mini-redis' commands take `&Db`. Its public methods
//! are the whole contract between a face and the core, in the order a call
//! uses them:
//!
//! 1. **Who calls**: [`CallMeta::of`] takes a request's metadata and
//!    extensions; [`Api::enter`] names the caller under the credentials in
//!    force now ([`Entered`]), [`Api::enter_read`] also takes one unit of the
//!    caller's read rate.
//! 2. **What it may read**: [`Api::admit`] finds the resource a call names
//!    and the [`Scope`] the rules give the caller there; the face turns its
//!    request into a typed query ([`query`]) within that scope.
//! 3. **Consistency**: [`Api::source_for`] and [`Api::catch_up`] say where a
//!    read is answered (a cache snapshot or the origin) under the resource
//!    version rules; [`Api::cache_for`] is the snapshot a watch starts from.
//! 4. **Answers**: [`Api::list_page`] and [`Api::get_object`] for reads,
//!    [`Api::start_watch`] registers a watcher whose deliveries wait in an
//!    [`Inbox`](crate::dispatch::Inbox).
//! 5. **Recording**: [`Api::answer_with`] runs the call in its span, times
//!    and counts it, and maps its [`ApiError`] to the face's status.
//!
//! Failures are [`ApiError`]s, which become statuses only in [`error`].

mod call;
pub mod compression;
mod consistency;
mod continue_token;
pub mod error;
mod initial;
#[cfg(test)]
mod initial_tests;
mod list;
mod progress;
pub mod query;
#[cfg(test)]
mod resync_model_tests;
pub mod v1;
mod watch;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::Request;

use crate::access::limits::UserLimits;
use crate::access::{Auth, Authority, Identified, Identity, Judged, PeerCerts, Scope};
use crate::cache::WatchCache;
use crate::config::Verb;
use crate::source::{Freshness, Origin};
use crate::telemetry::{Metrics, ResourceMetrics};
pub use call::{grpc, CallInfo, ALL};
pub use consistency::ReadFrom;
pub use continue_token::Sealer;
use error::ApiError;
pub use initial::InitialStates;
pub use list::origin_failed;
pub use progress::PROGRESS_WAIT;
pub use watch::{Mark, Shown, Steady, WatchStream};

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

/// The read core: the served resources, who may read them, and the
/// bounds every face's calls share.
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
}

/// What a call's request says about who sends it, taken before its
/// message is read.
pub struct CallMeta {
    pub metadata: MetadataMap,
    pub extensions: http::Extensions,
    /// The client certificates of the call's connection: from the TLS
    /// connection info tonic's server keeps, or from the service's own
    /// path.
    certs: Option<PeerCerts>,
}

impl CallMeta {
    /// A request's metadata and extensions, and its message.
    pub fn of<T>(request: Request<T>) -> (Self, T) {
        let certs = (request.peer_certs().map(PeerCerts))
            .or_else(|| request.extensions().get::<PeerCerts>().cloned());
        let (metadata, extensions, message) = request.into_parts();
        let meta = Self {
            metadata,
            extensions,
            certs,
        };
        (meta, message)
    }
}

/// A caller as the core let it in: who it is, under the authenticators and
/// rules in force when its call started (a grant made from it is judged
/// again when they change).
pub struct Entered {
    pub judged: Judged,
    pub identity: Identity,
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
        }
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

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn watch_codecs(&self) -> &[compression::Codec] {
        &self.watch_codecs
    }

    /// The authenticators and rules in use, which a new configuration
    /// replaces.
    pub fn authority(&self) -> &Arc<Authority> {
        &self.auth
    }

    /// The per-user limits in use, which a new configuration changes.
    pub fn user_limits(&self) -> &Arc<UserLimits> {
        &self.user_limits
    }

    /// Bound on waiting for readiness, freshness or a requested version.
    pub fn freshness_wait(&self) -> Duration {
        self.freshness_wait
    }

    /// Cancelled when the service starts shutting down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Who calls, under the credentials in force now: as admission
    /// identified it from the headers, else from the call's metadata and
    /// its connection's certificates.
    pub fn enter(&self, call: &CallMeta) -> Result<Entered, ApiError> {
        let judged = self.auth.current();
        let identity = match call.extensions.get::<Identified>() {
            Some(identified) => {
                (judged.still_identified(identified)).map_err(|why| error::revoked(why, None))?
            }
            None => (judged.auth).identify(&call.metadata, call.certs.as_ref())?,
        };
        Ok(Entered { judged, identity })
    }

    /// A caller identified earlier (the opener of an etcd Watch stream),
    /// if the authenticators in force now still name it.
    pub fn enter_as(&self, identity: &Identity) -> Result<Entered, ApiError> {
        let judged = self.auth.current();
        (judged.auth.still_names(identity)).map_err(|why| error::revoked(why, None))?;
        let identity = identity.clone();
        Ok(Entered { judged, identity })
    }

    /// [`Api::enter`] for a read, which takes one unit of the caller's
    /// read rate.
    pub fn enter_read(&self, call: &CallMeta) -> Result<Entered, ApiError> {
        let entered = self.enter(call)?;
        self.user_limits.unary(&entered.identity)?;
        Ok(entered)
    }

    /// Who calls, from a request's headers and extensions alone: before
    /// its body is read.
    pub fn identify(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Identified, ApiError> {
        let request = Request::from_parts(
            MetadataMap::from_headers(headers.clone()),
            extensions.clone(),
            (),
        );
        let (call, ()) = CallMeta::of(request);
        let judged = self.auth.current();
        let identity = (judged.auth).identify(&call.metadata, call.certs.as_ref())?;
        Ok(judged.identified(identity))
    }

    /// The resource a call names, and what the caller may see of it there.
    pub fn admit(
        &self,
        entered: &Entered,
        verb: Verb,
        resource: &str,
        namespace: &str,
    ) -> Result<(&Served, Scope), ApiError> {
        let s = self.served(resource)?;
        let caller = &entered.identity.caller;
        let scope = (entered.judged.auth).authorize(caller, verb, &s.cache.resource, namespace)?;
        Ok((s, scope))
    }

    /// A served resource by name.
    pub fn served(&self, name: &str) -> Result<&Served, ApiError> {
        self.resources.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.resources.keys().map(String::as_str).collect();
            known.sort_unstable();
            ApiError::UnknownResource {
                name: name.to_owned(),
                known: known.join(", "),
            }
        })
    }

    /// Every served resource, in no order.
    pub fn all_served(&self) -> impl Iterator<Item = &Served> {
        self.resources.values()
    }
}
