//! Who is calling, and what they may read. A caller is named by its client
//! certificate (user: subject CN, groups: subject O values, as Kubernetes
//! names them), else by a bearer token, else is anonymous where that is
//! allowed. The authorization rules then say whether the call is allowed
//! and through which selectors ([`Auth`]). An open watch keeps its grant
//! ([`Authority`]): it ends when its credential expires or is revoked, or
//! when the rules, read again, no longer give it what it was given. Each
//! identity's calls are bounded ([`limits`]); a new configuration applies
//! live ([`reconfigure`]).
//!
//! This module knows no wire: its failures are [`AccessError`]s, which each
//! face maps to its statuses.

mod auth;
mod client_ca;
mod credential;
mod error;
mod grant;
mod grants;
mod jwt;
pub mod limits;
#[cfg(test)]
mod model_tests;
pub mod reconfigure;
mod reload;
mod rules;
mod tokens;

use std::sync::Arc;

use rustls_pki_types::CertificateDer;

pub use auth::Auth;
pub use client_ca::ClientCa;
pub use credential::{Credential, Identity, Lapse, Secret};
pub use error::AccessError;
pub use grants::{Authority, Grant, GrantEpoch, Granted, HeldGrant, Identified, Judged, Revoke};
pub use reload::{baseline, spawn_reloader, spawn_reloader_on_hangup, Baseline};
pub use rules::Scope;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
}

impl Caller {
    fn anonymous() -> Self {
        Self {
            user: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// The client certificates of a connection, as a request extension set by
/// the connection path that completed the handshake.
#[derive(Debug, Clone)]
pub struct PeerCerts(pub Arc<Vec<CertificateDer<'static>>>);
