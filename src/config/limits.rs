//! `limits`: what protects the service from its clients, in total and
//! per identity.

use std::time::Duration;

use serde::Deserialize;

/// Limits that protect the service from its clients.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// Largest gRPC message sent (a List page, an event).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Largest request message accepted, once decompressed: requests are
    /// small, and what a client sends before it is answered is held.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// How long a request may take to arrive whole after its headers;
    /// then it ends with DEADLINE_EXCEEDED.
    #[serde(default = "default_request_body_timeout", with = "humantime_serde")]
    pub request_body_timeout: Duration,
    /// Each connection gets an HTTP/2 PING this often; one that does not
    /// answer within `keepalive_timeout` is closed, so the watches of a
    /// client that vanished without a word do not stay open.
    #[serde(default = "default_keepalive_interval", with = "humantime_serde")]
    pub keepalive_interval: Duration,
    #[serde(default = "default_keepalive_timeout", with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// A connection this old (give or take a tenth, so that connections
    /// made together do not end together) gets GOAWAY, and its open watches
    /// end with UNAVAILABLE and the version to resume from: clients
    /// reconnect, spreading over the replicas. None: connections live on.
    #[serde(default, with = "humantime_serde")]
    pub max_connection_age: Option<Duration>,
    /// How long calls other than watches may go on after GOAWAY before the
    /// connection closes.
    #[serde(default = "default_max_connection_age_grace", with = "humantime_serde")]
    pub max_connection_age_grace: Duration,
    /// Open watches of one user (an identity's user name); none: no bound.
    /// One noisy tenant cannot take another's places.
    #[serde(default)]
    pub max_watchers_per_user: Option<usize>,
    /// List and Get calls one user may make per second, on average;
    /// none: no bound.
    #[serde(default)]
    pub unary_per_user_per_second: Option<f64>,
    /// How many List and Get calls one user may make at once before the
    /// rate applies.
    #[serde(default = "default_unary_burst_per_user")]
    pub unary_burst_per_user: u32,
    /// The most objects one List page holds: a List asking for more (or
    /// for all, `limit` 0) gets pages of this many, with a continue token,
    /// so one call cannot make the server copy a whole resource at once.
    /// None: no bound.
    #[serde(default)]
    pub max_page_size: Option<usize>,
    /// List and Get calls one user may make per second, on average, that
    /// the cache cannot answer as it is: read from etcd (or the upstream),
    /// or rebuilt from the event window at an old revision (exact reads,
    /// continue tokens of old lists). None: no bound.
    #[serde(default)]
    pub costly_reads_per_user_per_second: Option<f64>,
    /// How many of those one user may make at once before the rate applies.
    #[serde(default = "default_costly_read_burst_per_user")]
    pub costly_read_burst_per_user: u32,
}

fn default_costly_read_burst_per_user() -> u32 {
    10
}

fn default_unary_burst_per_user() -> u32 {
    20
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_watchers: default_max_watchers(),
            max_watchers_per_resource: default_max_watchers_per_resource(),
            max_concurrent_streams: default_max_concurrent_streams(),
            max_concurrent_unary: default_max_concurrent_unary(),
            max_message_bytes: default_max_message_bytes(),
            max_request_bytes: default_max_request_bytes(),
            request_body_timeout: default_request_body_timeout(),
            keepalive_interval: default_keepalive_interval(),
            keepalive_timeout: default_keepalive_timeout(),
            max_connection_age: None,
            max_connection_age_grace: default_max_connection_age_grace(),
            max_watchers_per_user: None,
            unary_per_user_per_second: None,
            unary_burst_per_user: default_unary_burst_per_user(),
            max_page_size: None,
            costly_reads_per_user_per_second: None,
            costly_read_burst_per_user: default_costly_read_burst_per_user(),
        }
    }
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
fn default_max_request_bytes() -> usize {
    64 * 1024
}
fn default_request_body_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_keepalive_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_keepalive_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_connection_age_grace() -> Duration {
    Duration::from_secs(10)
}
