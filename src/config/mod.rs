//! Configuration: etcd endpoints, listeners, limits and the resources to
//! cache, as read from YAML; `security.rs` holds TLS, identities and rules,
//! `validate.rs` checks it whole.

mod bytes;
mod etcd_api;
mod key_layout;
mod kubernetes_api;
mod limits;
mod security;
mod source;
mod validate;

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

pub use etcd_api::{EtcdApiConfig, Outside};
pub use key_layout::{KeyLayout, Segment};
pub use kubernetes_api::{KubernetesApiConfig, KubernetesMapping};
pub use limits::LimitsConfig;
pub use security::{
    AuthConfig, AuthorizationConfig, CertificateUser, ClientAuth, JwtConfig, RuleConfig, TlsConfig,
    Verb,
};
pub use source::{ConfigSource, Overrides};
pub use validate::ConfigError;

/// The whole service configuration, as read from YAML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub etcd: EtcdConfig,
    /// Another watchproxy every resource is taken from, unless it names its
    /// own `upstream`.
    #[serde(default)]
    pub upstream: Option<String>,
    /// TLS to `https://` upstreams: the CA to trust (required) and, for
    /// mutual TLS, a certificate and key.
    #[serde(default)]
    pub upstream_tls: Option<ClientTls>,
    /// A file holding the bearer token to present to upstreams; read for
    /// every call, so a rotated token is used at once.
    #[serde(default)]
    pub upstream_token_file: Option<std::path::PathBuf>,
    /// The upstream token is sent over `http://` only with this (a core on
    /// loopback, say): over plain text anyone on the path can read it.
    #[serde(default)]
    pub allow_plaintext_upstream_token: bool,
    /// Address of the gRPC listener.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Address of the HTTP listener serving `/metrics`; none disables it.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Address of a plain-text listener serving only `grpc.health.v1`, for
    /// probes that cannot present a client certificate; none disables it.
    #[serde(default)]
    pub health_listen: Option<SocketAddr>,
    /// TLS for clients; without it the service speaks plain text, and says
    /// so at start.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// A file holding the key continue tokens are sealed with (at least 32
    /// bytes): replicas that serve one list's pages (behind one Service)
    /// share it. None: a key of this process alone, so a page's token
    /// works only on the replica that issued it.
    #[serde(default)]
    pub continue_token_key_file: Option<std::path::PathBuf>,
    /// Who callers are: certificates (with `tls.client_ca_file`), bearer
    /// tokens, or nobody.
    #[serde(default)]
    pub auth: AuthConfig,
    /// What each caller may read; without it every caller reads everything.
    #[serde(default)]
    pub authorization: Option<AuthorizationConfig>,
    #[serde(default)]
    pub watch: WatchConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// etcd's own read API on the same listener.
    #[serde(default)]
    pub etcd_api: EtcdApiConfig,
    /// Kubernetes' own list/watch API, on a listener of its own.
    #[serde(default)]
    pub kubernetes_api: KubernetesApiConfig,
    /// How long open calls get to finish after SIGTERM before the process
    /// exits anyway.
    #[serde(default = "default_shutdown_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
    pub resources: Vec<ResourceConfig>,
    /// The file it was read from, to read again when it changes.
    #[serde(skip)]
    pub source: Option<ConfigSource>,
}

fn default_shutdown_grace() -> Duration {
    Duration::from_secs(10)
}
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Endpoints for the watch streams alone (the reflectors' and the
    /// history read at start), on a connection of their own; none: the
    /// watches share `endpoints`' connection with every read.
    #[serde(default)]
    pub watch_endpoints: Option<Vec<String>>,
    /// Keys per page when listing a prefix, so that a large resource never
    /// needs one huge etcd response.
    #[serde(default = "default_list_page_size")]
    pub list_page_size: i64,
    /// Deadline of each unary etcd request (list pages, revision checks).
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// TLS to etcd (`https://` endpoints): a CA to trust and, for client
    /// certificate authentication, a certificate and key.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// etcd's own authentication: a user, and a file holding its password.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
}

/// PEM files for TLS to etcd or to an upstream watchproxy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// The name to verify the server's certificate against, when it
    /// differs from the endpoint's host.
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// How often watchers that allow bookmarks get one (each with its own
    /// jitter, so they do not all wake together).
    #[serde(default = "default_bookmark_interval", with = "humantime_serde")]
    pub bookmark_interval: Duration,
    /// Events a watcher may have queued; when its queue fills it reads the
    /// event window by itself until it has caught up.
    #[serde(default = "default_watcher_queue")]
    pub watcher_queue: usize,
    /// How long a request for a resource version the cache has not reached
    /// yet (or a consistent read) waits before giving up.
    #[serde(default = "default_freshness_wait", with = "humantime_serde")]
    pub freshness_wait: Duration,
    /// How calls are served on HTTP/2: `fast`, the service's own
    /// connection path, or `tonic`, tonic's server for every call (the
    /// plain path, kept to measure against and as a way back).
    #[serde(default)]
    pub serve_path: ServePath,
    /// On the `fast` path, a live change for a watch with nothing queued
    /// is framed as its connection sorts what arrived, skipping the
    /// watch's queue and its poll; `false` queues every change and polls
    /// the watch for it (the plain path, to measure against).
    #[serde(default = "yes")]
    pub direct_delivery: bool,
    /// Watches that start with the state at once (a rollout, a restart)
    /// share one initial state per selector and projection, encoded once;
    /// `false` encodes one per watch (the plain path, to measure against).
    #[serde(default = "yes")]
    pub share_initial_state: bool,
    /// The encodings Watch responses may be compressed in, in order of
    /// preference, for clients that accept one (`grpc-accept-encoding`).
    /// Each message is compressed once for every stream that sends it.
    /// Empty: never compressed.
    #[serde(default = "all_codecs")]
    pub compression: Vec<Codec>,
    /// How often each resource's cache is compared with etcd: a few of its
    /// keys' versions and its number of keys, at its revision, in one
    /// request; a difference is logged and counted
    /// (`watchproxy_state_mismatch_total`). 0 turns it off.
    #[serde(default = "default_state_check_interval", with = "humantime_serde")]
    pub state_check_interval: Duration,
}

/// A gRPC message encoding watch streams may be sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    Zstd,
    Gzip,
}

fn all_codecs() -> Vec<Codec> {
    vec![Codec::Zstd, Codec::Gzip]
}

fn yes() -> bool {
    true
}

/// See [`WatchConfig::serve_path`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServePath {
    #[default]
    Fast,
    Tonic,
}

/// How the values of a resource are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// Kubernetes-shaped JSON: labels and selectable fields are read from it.
    Json,
    /// Opaque bytes: only key-based filtering (namespace, name) applies.
    Raw,
    /// As the Kubernetes apiserver stores objects: built-in types as
    /// protobuf in its storage envelope, custom resources as JSON.
    Kubernetes,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// The name clients use, e.g. "pods".
    pub name: String,
    /// The etcd key prefix, e.g. "/registry/pods"; keys are
    /// `<prefix>/<namespace>/<name>` or `<prefix>/<name>` unless
    /// `key_layout` says otherwise.
    pub prefix: String,
    #[serde(default = "default_true")]
    pub namespaced: bool,
    /// Another watchproxy to take the resource from (its List and Watch)
    /// instead of etcd, e.g. `http://core:50051`; see docs/tiers.md.
    #[serde(default)]
    pub upstream: Option<String>,
    /// The most memory the resource's cache may take (objects and event
    /// window): bytes, or a string such as `512Mi` or `2G`. See docs/operating.md.
    #[serde(default, deserialize_with = "bytes::optional")]
    pub max_bytes: Option<u64>,
    /// Where the key, after the prefix, holds the namespace and name, e.g.
    /// `tenants/{namespace}/items/{name...}`.
    #[serde(default)]
    pub key_layout: Option<KeyLayout>,
    #[serde(default = "default_format")]
    pub format: ValueFormat,
    /// Dotted JSON paths usable in field selectors, e.g. "spec.nodeName".
    #[serde(default)]
    pub selectable_fields: Vec<String>,
    /// The selectable fields the dispatcher indexes watchers by.
    #[serde(default)]
    pub indexed_fields: Vec<String>,
    #[serde(default)]
    pub cache: CacheConfig,
    /// What it is on Kubernetes' API (`kubernetes_api`).
    #[serde(default)]
    pub kubernetes: Option<KubernetesMapping>,
}

impl ResourceConfig {
    /// `key_layout`, or Kubernetes' when it is not given.
    pub fn layout(&self) -> KeyLayout {
        (self.key_layout.clone()).unwrap_or_else(|| KeyLayout::standard(self.namespaced))
    }
}

/// Bounds of the event window kept for resuming watches.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    #[serde(default = "default_min_events")]
    pub min_events: usize,
    #[serde(default = "default_max_events")]
    pub max_events: usize,
    /// The window grows while its oldest event is younger than this, so a
    /// burst of writes does not push out events clients still resume from.
    #[serde(default = "default_freshness", with = "humantime_serde")]
    pub freshness: Duration,
    /// What open watches get when etcd's history since the cache's version
    /// is gone and the prefix is listed again.
    #[serde(default)]
    pub on_history_lost: OnHistoryLost,
}

/// What watches get when the history they stand in is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnHistoryLost {
    /// The difference between the old and the new list, as events marked
    /// `resync`, then a BOOKMARK marked `resync` at the list's version.
    #[default]
    Resync,
    /// OUT_OF_RANGE, as Kubernetes does: clients list again.
    End,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 50051))
}
fn default_list_page_size() -> i64 {
    1000
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_state_check_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_bookmark_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_watcher_queue() -> usize {
    256
}
fn default_freshness_wait() -> Duration {
    Duration::from_secs(3)
}
fn default_true() -> bool {
    true
}
fn default_format() -> ValueFormat {
    ValueFormat::Json
}
fn default_min_events() -> usize {
    1024
}
fn default_max_events() -> usize {
    100 * 1024
}
fn default_freshness() -> Duration {
    Duration::from_secs(75)
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            watch_endpoints: None,
            list_page_size: default_list_page_size(),
            request_timeout: default_request_timeout(),
            tls: None,
            username: None,
            password_file: None,
        }
    }
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            bookmark_interval: default_bookmark_interval(),
            watcher_queue: default_watcher_queue(),
            freshness_wait: default_freshness_wait(),
            serve_path: ServePath::Fast,
            direct_delivery: true,
            share_initial_state: true,
            compression: all_codecs(),
            state_check_interval: default_state_check_interval(),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            min_events: default_min_events(),
            max_events: default_max_events(),
            freshness: default_freshness(),
            on_history_lost: OnHistoryLost::default(),
        }
    }
}
