//! Configuration: etcd endpoints, listeners, limits and the resources to cache.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The whole service configuration, as read from YAML.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub etcd: EtcdConfig,
    /// Address of the gRPC listener.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Address of the HTTP listener serving `/metrics`; none disables it.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    #[serde(default)]
    pub watch: WatchConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// How long open calls get to finish after SIGTERM before the process
    /// exits anyway.
    #[serde(default = "default_shutdown_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
    pub resources: Vec<ResourceConfig>,
}

/// Limits that protect the service from its clients.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open watches in total; beyond, RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_watchers")]
    pub max_watchers: usize,
    /// Open watches per resource; beyond, RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_watchers_per_resource")]
    pub max_watchers_per_resource: usize,
    /// HTTP/2 streams one connection may have open at once.
    #[serde(default = "default_max_concurrent_streams")]
    pub max_concurrent_streams: u32,
    /// List and Get calls in progress at once; beyond, calls are shed
    /// with RESOURCE_EXHAUSTED instead of queueing.
    #[serde(default = "default_max_concurrent_unary")]
    pub max_concurrent_unary: usize,
    /// Largest gRPC message accepted or sent.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Each connection gets an HTTP/2 PING this often; one that does not
    /// answer within `keepalive_timeout` is closed, so the watches of a
    /// client that vanished without a word do not stay open.
    #[serde(default = "default_keepalive_interval", with = "humantime_serde")]
    pub keepalive_interval: Duration,
    #[serde(default = "default_keepalive_timeout", with = "humantime_serde")]
    pub keepalive_timeout: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_watchers: default_max_watchers(),
            max_watchers_per_resource: default_max_watchers_per_resource(),
            max_concurrent_streams: default_max_concurrent_streams(),
            max_concurrent_unary: default_max_concurrent_unary(),
            max_message_bytes: default_max_message_bytes(),
            keepalive_interval: default_keepalive_interval(),
            keepalive_timeout: default_keepalive_timeout(),
        }
    }
}

fn default_shutdown_grace() -> Duration {
    Duration::from_secs(10)
}
fn default_max_watchers() -> usize {
    100_000
}
fn default_max_watchers_per_resource() -> usize {
    50_000
}
fn default_max_concurrent_streams() -> u32 {
    10_000
}
fn default_max_concurrent_unary() -> usize {
    512
}
fn default_max_message_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_keepalive_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_keepalive_timeout() -> Duration {
    Duration::from_secs(10)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
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
    pub tls: Option<EtcdTls>,
}

/// PEM files for TLS to etcd.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTls {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// The name to verify etcd's certificate against, when it differs from
    /// the endpoint's host.
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// The name clients use, e.g. "pods".
    pub name: String,
    /// The etcd key prefix, e.g. "/registry/pods"; keys are
    /// `<prefix>/<namespace>/<name>` or `<prefix>/<name>`.
    pub prefix: String,
    #[serde(default = "default_true")]
    pub namespaced: bool,
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
}

/// Bounds of the event window kept for resuming watches.
#[derive(Debug, Clone, Deserialize)]
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
            list_page_size: default_list_page_size(),
            request_timeout: default_request_timeout(),
            tls: None,
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
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            min_events: default_min_events(),
            max_events: default_max_events(),
            freshness: default_freshness(),
        }
    }
}

/// A configuration that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config: {0}")]
    Parse(#[from] serde_yaml_ng::Error),
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates; prefixes lose a trailing '/'.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = serde_yaml_ng::from_str(text)?;
        for r in &mut config.resources {
            while r.prefix.len() > 1 && r.prefix.ends_with('/') {
                r.prefix.pop();
            }
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.etcd.endpoints.is_empty() {
            return Err(invalid(
                "etcd.endpoints",
                "at least one endpoint is required",
            ));
        }
        if let Some(tls) = &self.etcd.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(invalid("etcd.tls", "cert_file and key_file go together"));
            }
        }
        if self.etcd.list_page_size <= 0 {
            return Err(invalid("etcd.list_page_size", "must be positive"));
        }
        if self.watch.watcher_queue < 2 {
            return Err(invalid("watch.watcher_queue", "must be at least 2"));
        }
        if self.watch.bookmark_interval.is_zero() {
            return Err(invalid("watch.bookmark_interval", "must be positive"));
        }
        let l = &self.limits;
        for (field, v) in [
            ("limits.max_watchers", l.max_watchers),
            (
                "limits.max_watchers_per_resource",
                l.max_watchers_per_resource,
            ),
            (
                "limits.max_concurrent_streams",
                l.max_concurrent_streams as usize,
            ),
            ("limits.max_concurrent_unary", l.max_concurrent_unary),
            ("limits.max_message_bytes", l.max_message_bytes),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if self.resources.is_empty() {
            return Err(invalid("resources", "at least one resource is required"));
        }
        let mut names = HashSet::new();
        let mut prefixes: Vec<(&str, usize)> = Vec::new();
        for (i, r) in self.resources.iter().enumerate() {
            let at = |field: &str| format!("resources[{i}].{field}");
            if r.name.is_empty()
                || !r
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            {
                return Err(invalid(
                    at("name"),
                    format!("{:?} must be non-empty and use only [A-Za-z0-9._-]", r.name),
                ));
            }
            if !names.insert(r.name.as_str()) {
                return Err(invalid(at("name"), format!("{:?} is used twice", r.name)));
            }
            if r.prefix.is_empty() || r.prefix == "/" {
                return Err(invalid(
                    at("prefix"),
                    "must name a key prefix, e.g. /registry/pods",
                ));
            }
            for (other, j) in &prefixes {
                let (a, b) = (format!("{other}/"), format!("{}/", r.prefix));
                if a.starts_with(&b) || b.starts_with(&a) {
                    return Err(invalid(
                        at("prefix"),
                        format!("{:?} overlaps resources[{j}].prefix {other:?}", r.prefix),
                    ));
                }
            }
            prefixes.push((&r.prefix, i));
            if r.format == ValueFormat::Raw && !r.selectable_fields.is_empty() {
                return Err(invalid(
                    at("selectable_fields"),
                    "raw resources have no fields to select on; use format: json",
                ));
            }
            for (k, f) in r.selectable_fields.iter().enumerate() {
                if f.is_empty() || f.split('.').any(str::is_empty) {
                    return Err(invalid(
                        format!("resources[{i}].selectable_fields[{k}]"),
                        format!("{f:?} is not a dotted path such as spec.nodeName"),
                    ));
                }
                if f == "metadata.name" || f == "metadata.namespace" {
                    return Err(invalid(
                        format!("resources[{i}].selectable_fields[{k}]"),
                        format!("{f} is always selectable; remove it"),
                    ));
                }
            }
            for (k, f) in r.indexed_fields.iter().enumerate() {
                if !r.selectable_fields.contains(f) {
                    return Err(invalid(
                        format!("resources[{i}].indexed_fields[{k}]"),
                        format!("{f:?} must also be listed in selectable_fields"),
                    ));
                }
            }
            let c = &r.cache;
            if c.min_events == 0 {
                return Err(invalid(at("cache.min_events"), "must be positive"));
            }
            if c.max_events < c.min_events {
                return Err(invalid(
                    at("cache.max_events"),
                    format!(
                        "{} is below cache.min_events {}",
                        c.max_events, c.min_events
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
etcd:
  endpoints: ["http://127.0.0.1:2379"]
resources:
  - name: pods
    prefix: /registry/pods/
    selectable_fields: [spec.nodeName, status.phase]
    indexed_fields: [spec.nodeName]
  - name: nodes
    prefix: /registry/minions
    namespaced: false
"#;

    #[test]
    fn a_good_config_parses_with_defaults() {
        let c = Config::from_yaml(GOOD).unwrap();
        assert_eq!(c.resources[0].prefix, "/registry/pods");
        assert!(c.resources[0].namespaced);
        assert!(!c.resources[1].namespaced);
        assert_eq!(c.resources[1].format, ValueFormat::Json);
        assert_eq!(c.watch.bookmark_interval, Duration::from_secs(60));
        assert_eq!(c.listen.port(), 50051);
    }

    #[test]
    fn bad_configs_name_the_offending_field() {
        let cases = [
            (
                GOOD.replace(
                    "indexed_fields: [spec.nodeName]",
                    "indexed_fields: [spec.x]",
                ),
                "resources[0].indexed_fields[0]",
            ),
            (
                GOOD.replace("name: nodes", "name: pods"),
                "resources[1].name",
            ),
            (
                GOOD.replace("/registry/minions", "/registry/pods/sub"),
                "resources[1].prefix",
            ),
            (
                GOOD.replace("status.phase", "status..phase"),
                "resources[0].selectable_fields[1]",
            ),
            (
                GOOD.replace(
                    "namespaced: false",
                    "namespaced: false\n    format: raw\n    selectable_fields: [a]",
                ),
                "resources[1].selectable_fields",
            ),
            (
                GOOD.replace(
                    "namespaced: false",
                    "namespaced: false\n    cache: {min_events: 10, max_events: 5}",
                ),
                "resources[1].cache.max_events",
            ),
            (
                GOOD.replace("resources:", "watch: {watcher_queue: 1}\nresources:"),
                "watch.watcher_queue",
            ),
            (
                GOOD.replace("namespaced: false", "namespaced: false\n    colour: blue"),
                "colour",
            ),
            (
                GOOD.replace("[\"http://127.0.0.1:2379\"]", "[]"),
                "etcd.endpoints",
            ),
        ];
        for (yaml, field) in cases {
            let err = Config::from_yaml(&yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{err:?} should name {field}");
        }
    }
}
