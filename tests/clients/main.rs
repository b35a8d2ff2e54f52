//! The clients as their users run them: the Rust crate, the Python package,
//! the command line. Each module was a test file of its own; one binary per
//! concern.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod cli_safety;
mod client_errors;
mod clients;
mod informer_handlers;
mod python_package;
mod subscriptions;
mod typed_watcher;
