//! How calls reach the service: the own HTTP/2 server and tonic's,
//! conformance to RFC 9113, TLS, and the real binary in production. Each
//! module was a test file of its own; one binary per concern.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/raw.rs"]
mod raw;

mod conformance;
mod http2;
mod production;
mod serve_path;
mod tls;
