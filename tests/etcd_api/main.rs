//! etcd's own API served from the caches, tried with etcd's clients: the
//! Rust `etcd-client`, `etcdctl` and Python's aetcd, each call made against
//! etcd itself and against watchproxy and compared field for field. One
//! module per service of etcd's (and one for the keys outside the served
//! prefixes); each was a test file of its own.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod bounds;
mod campaign;
mod clients;
mod credentials;
mod forward;
mod kv;
mod shared;
mod watch;
