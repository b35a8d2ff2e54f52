//! What watchproxy reads from: etcd with authentication and TLS, another
//! watchproxy (tiers), and replicas on one etcd. Each module was a test
//! file of its own; one binary per concern.

#[path = "../common/mod.rs"]
mod common;

mod etcd_auth;
mod etcd_tls;
mod replicas;
mod tiers;
