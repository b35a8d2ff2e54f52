//! The read API against a real etcd: List, Get, Watch, consistency, errors,
//! projections, shards, key layouts, formats, progress and shared initial
//! states. Each module was a test file of its own; one binary per concern.

#[path = "../common/mod.rs"]
mod common;

mod consistency;
mod errors;
mod join_storm;
mod key_layouts;
mod kubernetes_format;
mod list_get;
mod progress;
mod projection;
mod shards;
mod watch;
