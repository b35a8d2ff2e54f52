//! `etcd_api`: etcd's own read API, served from the caches beside
//! `watchproxy.v1`.

use serde::Deserialize;

/// Whether the listener also speaks etcd's `etcdserverpb` KV.Range and
/// Watch, so etcd clients read through the caches with only their
/// endpoint changed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdApiConfig {
    #[serde(default)]
    pub enabled: bool,
    /// What a range outside every configured resource's prefix gets.
    #[serde(default)]
    pub outside: Outside,
}

/// What a range outside every configured resource's prefix gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outside {
    /// FAILED_PRECONDITION naming the prefixes that are served: a range
    /// that reaches outside them is never answered in part.
    #[default]
    Refuse,
    /// Read from etcd on watchproxy's connection (counted): a range wholly
    /// outside is etcd's answer; the keys of a range between the served
    /// prefixes are merged with theirs at one revision (Range) or in
    /// revision order (Watch).
    Forward,
}
