//! Who is calling, and what they may read. A caller is named by its client
//! certificate (user: subject CN, groups: subject O values, as Kubernetes
//! names them), else by a bearer token, else is anonymous where that is
//! allowed. The authorization rules then say whether the call is allowed
//! and through which selectors.

mod jwt;
#[cfg(test)]
mod model_tests;
mod rules;
mod tokens;

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tracing::info;

use super::error::ApiError;
use super::reload::spawn_reloader;
use crate::config::{Config, Verb};
use crate::object::Resource;
use crate::telemetry::Metrics;
use jwt::Jwt;
pub use rules::Scope;
use rules::{Denial, Rules};
use tokens::Tokens;

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

pub struct Auth {
    tokens: Option<Arc<Tokens>>,
    jwt: Option<Arc<Jwt>>,
    /// Whether a caller without an identity is served.
    anonymous: bool,
    /// Whether anything authenticates callers: a client CA or tokens.
    authenticating: bool,
    rules: Option<Rules>,
    metrics: Metrics,
}

impl Auth {
    /// Everyone reads everything: no authenticator, no rules.
    pub fn open(metrics: Metrics) -> Self {
        Self {
            tokens: None,
            jwt: None,
            anonymous: true,
            authenticating: false,
            rules: None,
            metrics,
        }
    }

    /// The authenticators and rules the configuration names; a token file
    /// or a rule that cannot be used fails the start.
    pub fn new(config: &Config, resources: &[Resource], metrics: Metrics) -> anyhow::Result<Self> {
        let tokens = (config.auth.tokens_file.as_deref())
            .map(Tokens::load)
            .transpose()?
            .map(Arc::new);
        let jwt = (config.auth.jwt.as_ref())
            .map(Jwt::load)
            .transpose()?
            .map(Arc::new);
        let client_ca = config
            .tls
            .as_ref()
            .is_some_and(|t| t.client_ca_file.is_some());
        let authenticating = client_ca || tokens.is_some() || jwt.is_some();
        let rules = (config.authorization.as_ref())
            .map(|a| Rules::new(&a.rules, resources))
            .transpose()?;
        Ok(Self {
            tokens,
            jwt,
            anonymous: config.auth.anonymous.unwrap_or(!authenticating),
            authenticating,
            rules,
            metrics,
        })
    }

    /// Reads the token and JWKS files again whenever they change, until
    /// `shutdown`.
    pub fn spawn_reload(&self, shutdown: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(tokens) = self.tokens.clone() {
            let paths = vec![tokens.path().to_owned()];
            tasks.push(spawn_reloader(paths, shutdown.clone(), move || {
                tokens.reload()
            }));
        }
        if let Some(jwt) = self.jwt.clone() {
            let paths = vec![jwt.path().to_owned()];
            tasks.push(spawn_reloader(paths, shutdown, move || jwt.reload()));
        }
        tasks
    }

    /// Who is calling: the client certificate's subject, else the bearer
    /// token's caller, else anonymous where allowed.
    pub fn identify(
        &self,
        metadata: &MetadataMap,
        certs: Option<&[CertificateDer<'_>]>,
    ) -> Result<Caller, ApiError> {
        // `code` labels the metric; `reason` tells the caller.
        let refuse = |code: &'static str, reason: &'static str| {
            self.metrics.auth_failure(code);
            info!(reason, "unauthenticated call");
            Err(ApiError::Unauthenticated { reason })
        };
        if let Some(cert) = certs.and_then(|c| c.first()) {
            return match subject(cert) {
                Some(caller) => Ok(caller),
                None => refuse(
                    "bad_certificate",
                    "the client certificate names no subject common name",
                ),
            };
        }
        if let Some(header) = metadata.get("authorization") {
            if self.tokens.is_none() && self.jwt.is_none() {
                if !self.authenticating {
                    return Ok(Caller::anonymous());
                }
                return refuse("tokens_not_accepted", "bearer tokens are not accepted here");
            }
            let token = header.to_str().ok().and_then(|h| h.strip_prefix("Bearer "));
            let Some(token) = token.map(str::trim) else {
                return refuse(
                    "malformed_authorization",
                    "the authorization metadata is not \"Bearer <token>\"",
                );
            };
            if let Some(caller) = self.tokens.as_ref().and_then(|t| t.caller(token)) {
                return Ok(caller);
            }
            if let Some(jwt) = self.jwt.as_ref().filter(|_| Jwt::looks_like(token)) {
                return match jwt.caller(token) {
                    Ok(caller) => Ok(caller),
                    Err(reason) => refuse("invalid_jwt", reason),
                };
            }
            return refuse("unknown_token", "unknown bearer token");
        }
        if self.anonymous {
            return Ok(Caller::anonymous());
        }
        refuse("no_identity", "no client certificate or bearer token")
    }

    /// Whether `caller` may `verb` `resource` in `namespace` ("" for every
    /// namespace); denials are logged and counted.
    pub fn authorize(
        &self,
        caller: &Caller,
        verb: Verb,
        resource: &Resource,
        namespace: &str,
    ) -> Result<Scope, ApiError> {
        let Some(rules) = &self.rules else {
            return Ok(Scope::unrestricted());
        };
        rules
            .authorize(caller, verb, resource, namespace)
            .map_err(|denial| {
                self.metrics.authz_denied(&resource.name, verb.as_str());
                info!(
                    user = %caller.user,
                    groups = ?caller.groups,
                    verb = verb.as_str(),
                    resource = %resource.name,
                    namespace,
                    "denied"
                );
                ApiError::PermissionDenied {
                    user: caller.user.clone(),
                    verb: verb.as_str(),
                    resource: resource.name.clone(),
                    namespace: namespace.to_owned(),
                    too_wide: denial == Denial::TooWide,
                }
            })
    }

    /// What a continue token is bound to: the caller and what it may see.
    /// 0 without rules, where everyone sees the same.
    pub fn token_scope(&self, caller: &Caller, scope: &Scope) -> u64 {
        if self.rules.is_none() {
            return 0;
        }
        let mut groups = caller.groups.clone();
        groups.sort();
        let mut h = Fnv::default();
        h.write(caller.user.as_bytes());
        for g in &groups {
            h.write(b"\0g");
            h.write(g.as_bytes());
        }
        for (labels, fields) in &scope.alternatives {
            h.write(b"\0s");
            h.write(labels.as_bytes());
            h.write(b"\0");
            h.write(fields.as_bytes());
        }
        h.0.max(1)
    }
}

/// 64-bit FNV-1a: stable across builds and replicas, unlike std's hasher.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The caller a client certificate names: user = subject CN, groups =
/// subject O values.
fn subject(cert: &CertificateDer<'_>) -> Option<Caller> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(Caller { user, groups })
}
