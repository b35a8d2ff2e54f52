//! Who may read what, for a stream's whole life, and what a client can make
//! the service hold before it is identified. Each module was a test file of
//! its own; one binary per concern.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/raw.rs"]
mod raw;

mod authz;
mod credential_files;
mod ports;
mod preauth;
mod stay_authorized;
