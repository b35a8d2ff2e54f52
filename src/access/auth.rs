//! The authenticators and rules in force: who a call's credentials name,
//! and what the rules let that caller read.

use std::sync::Arc;
use std::time::SystemTime;

use rustls_pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tracing::info;

use super::credential::{Credential, Identity, Lapse, Secret};
use super::grants::Revoke;
use super::jwt::Jwt;
use super::reload::spawn_reloader;
use super::rules::{Denial, Rules, Scope};
use super::tokens::Tokens;
use super::{AccessError, Caller, ClientCa, PeerCerts};
use crate::config::{CertificateUser, Config, Verb};
use crate::object::Resource;
use crate::telemetry::{CredentialFile, Metrics};

pub struct Auth {
    tokens: Option<Arc<Tokens>>,
    jwt: Option<Arc<Jwt>>,
    /// Whether a caller without an identity is served.
    anonymous: bool,
    /// Whether anything authenticates callers: a client CA or tokens.
    authenticating: bool,
    /// Which name of a client certificate is the user.
    certificate_user: CertificateUser,
    /// Whether one user name is one user across authenticators.
    shared_names: bool,
    /// What a connection's certificate is judged by after its handshake.
    client_ca: Arc<ClientCa>,
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
            certificate_user: CertificateUser::default(),
            shared_names: false,
            client_ca: Arc::default(),
            rules: None,
            metrics,
        }
    }

    /// The authenticators and rules the configuration names, judging
    /// connections' certificates by `client_ca`; a token file or a rule
    /// that cannot be used fails the start.
    pub fn new(
        config: &Config,
        resources: &[Resource],
        client_ca: Arc<ClientCa>,
        metrics: Metrics,
    ) -> anyhow::Result<Self> {
        let tokens = (config.auth.tokens_file.as_deref())
            .map(Tokens::load)
            .transpose()?
            .map(Arc::new);
        let jwt = (config.auth.jwt.as_ref())
            .map(Jwt::load)
            .transpose()?
            .map(Arc::new);
        let asks_certificates = (config.tls.as_ref()).is_some_and(|t| t.client_ca_file.is_some());
        let authenticating = asks_certificates || tokens.is_some() || jwt.is_some();
        let rules = (config.authorization.as_ref())
            .map(|a| Rules::new(&a.rules, resources))
            .transpose()?;
        Ok(Self {
            tokens,
            jwt,
            anonymous: config.auth.anonymous.unwrap_or(!authenticating),
            authenticating,
            certificate_user: config.auth.certificate_user,
            shared_names: config.auth.shared_user_names,
            client_ca,
            rules,
            metrics,
        })
    }

    /// What connections' certificates are judged by after their handshake.
    pub fn client_ca(&self) -> &Arc<ClientCa> {
        &self.client_ca
    }

    /// Reads the token and JWKS files again whenever they change, then
    /// calls `after`, until `shutdown`.
    pub fn spawn_reload(
        &self,
        shutdown: CancellationToken,
        after: Arc<dyn Fn() + Send + Sync>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(tokens) = self.tokens.clone() {
            let paths = vec![tokens.path().to_owned()];
            let (after, metrics) = (after.clone(), self.metrics.clone());
            let seen = tokens.baseline();
            tasks.push(spawn_reloader(paths, seen, shutdown.clone(), move || {
                if !tokens.reload() {
                    metrics
                        .security
                        .credential_file_unusable(CredentialFile::tokens);
                }
                after();
            }));
        }
        if let Some(jwt) = self.jwt.clone() {
            let paths = vec![jwt.path().to_owned()];
            let metrics = self.metrics.clone();
            let seen = jwt.baseline();
            tasks.push(spawn_reloader(paths, seen, shutdown, move || {
                if !jwt.reload() {
                    metrics
                        .security
                        .credential_file_unusable(CredentialFile::jwks);
                }
                after();
            }));
        }
        tasks
    }

    /// Who is calling: the client certificate's subject, else the bearer
    /// token's caller, else anonymous where allowed.
    pub fn identify(
        &self,
        metadata: &MetadataMap,
        certs: Option<&PeerCerts>,
    ) -> Result<Identity, AccessError> {
        // `code` labels the metric; `reason` tells the caller.
        let refuse = |code: &'static str, reason: &'static str| {
            self.metrics.auth_failure(code);
            info!(reason, "unauthenticated call");
            Err(AccessError::Unauthenticated { reason })
        };
        let lapsed = |code: &'static str, lapse: Lapse, detail: &'static str| {
            self.metrics.auth_failure(code);
            info!(reason = detail, "unauthenticated call");
            Err(AccessError::CredentialEnded { lapse, detail })
        };
        if let Some((cert, chain)) = certs.and_then(|c| Some((c.0.first()?, c))) {
            if !self.client_ca.verifies(&chain.0) {
                return lapsed(
                    "revoked_certificate",
                    Lapse::Revoked,
                    "the client certificate's CA is no longer trusted",
                );
            }
            return match subject(cert, self.certificate_user) {
                // Verified at the handshake; a connection outlives it.
                Some((_, not_after)) if not_after <= SystemTime::now() => lapsed(
                    "expired_certificate",
                    Lapse::Expired,
                    "the client certificate has expired",
                ),
                Some((caller, not_after)) => Ok(Identity::new(
                    caller,
                    Credential::Certificate {
                        not_after,
                        chain: chain.clone(),
                    },
                    self.shared_names,
                )),
                None => refuse(
                    "bad_certificate",
                    "the client certificate does not hold the name auth.certificate_user names",
                ),
            };
        }
        if let Some(header) = metadata.get("authorization") {
            if self.tokens.is_none() && self.jwt.is_none() {
                if !self.authenticating {
                    return Ok(Identity::new(
                        Caller::anonymous(),
                        Credential::Anonymous,
                        self.shared_names,
                    ));
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
                return Ok(Identity::new(
                    caller,
                    Credential::Token(Secret::new(token)),
                    self.shared_names,
                ));
            }
            if let Some(jwt) = self.jwt.as_ref().filter(|_| Jwt::looks_like(token)) {
                return match jwt.caller(token) {
                    Ok((caller, exp)) => Ok(Identity::new(
                        caller,
                        Credential::Jwt {
                            token: Secret::new(token),
                            exp,
                        },
                        self.shared_names,
                    )),
                    Err(r) if r.expired => lapsed("expired_jwt", Lapse::Expired, r.reason),
                    Err(r) => refuse("invalid_jwt", r.reason),
                };
            }
            return refuse("unknown_token", "unknown bearer token");
        }
        if self.anonymous {
            return Ok(Identity::new(
                Caller::anonymous(),
                Credential::Anonymous,
                self.shared_names,
            ));
        }
        refuse("no_identity", "no client certificate or bearer token")
    }

    /// Whether `identity`'s credential still names its caller here: not
    /// expired, its token still in the token file, its JWT still verified
    /// by the key set, anonymous callers still served.
    pub fn still_names(&self, identity: &Identity) -> Result<(), Revoke> {
        let caller = &identity.caller;
        let expired = identity
            .credential
            .expires()
            .is_some_and(|t| t <= SystemTime::now());
        if expired {
            return Err(Revoke::Credential(Lapse::Expired));
        }
        let names = match &*identity.credential {
            Credential::Anonymous => {
                return match self.anonymous || !self.authenticating {
                    true => Ok(()),
                    false => Err(Revoke::AccessChanged),
                }
            }
            Credential::Certificate { chain, .. } => self.client_ca.verifies(&chain.0),
            Credential::Token(t) => {
                (self.tokens.as_ref()).and_then(|tokens| tokens.caller(t.expose()))
                    == Some(caller.clone())
            }
            Credential::Jwt { token, .. } => match self.jwt.as_ref() {
                None => false,
                Some(jwt) => match jwt.caller(token.expose()) {
                    Ok((now, _)) => now == *caller,
                    Err(r) if r.expired => return Err(Revoke::Credential(Lapse::Expired)),
                    Err(_) => false,
                },
            },
        };
        match names {
            true => Ok(()),
            false => Err(Revoke::Credential(Lapse::Revoked)),
        }
    }

    /// Whether the rules let `caller` `verb` some of `resource`: what a
    /// refusal may name to it. Neither logged nor counted.
    pub fn reaches(&self, caller: &Caller, verb: Verb, resource: &str) -> bool {
        (self.rules.as_ref()).is_none_or(|rules| rules.reaches(caller, verb, resource))
    }

    /// Whether `caller` may `verb` keys that no served resource holds
    /// (etcd's API, forwarded): only by a rule over every resource and
    /// namespace without a selector. Denials are logged and counted.
    pub fn authorize_unserved(&self, caller: &Caller, verb: Verb) -> Result<(), AccessError> {
        if self.allows_unserved(caller, verb) {
            return Ok(());
        }
        const UNSERVED: &str = "(keys of no resource)";
        self.metrics.authz_denied(UNSERVED, verb.as_str());
        info!(user = %caller.user, verb = verb.as_str(), "denied keys of no resource");
        Err(AccessError::PermissionDenied {
            user: caller.user.clone(),
            verb: verb.as_str(),
            resource: UNSERVED.into(),
            namespace: String::new(),
            too_wide: false,
        })
    }

    /// Whether `caller` may `verb` keys that no served resource holds, as
    /// [`Auth::authorize_unserved`] judges, with nothing logged.
    pub fn allows_unserved(&self, caller: &Caller, verb: Verb) -> bool {
        (self.rules.as_ref()).is_none_or(|rules| rules.allows_everything(caller, verb))
    }

    /// Whether `caller` may `verb` `resource` in `namespace` ("" for every
    /// namespace); denials are logged and counted.
    pub fn authorize(
        &self,
        caller: &Caller,
        verb: Verb,
        resource: &Resource,
        namespace: &str,
    ) -> Result<Scope, AccessError> {
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
                AccessError::PermissionDenied {
                    user: caller.user.clone(),
                    verb: verb.as_str(),
                    resource: resource.name.clone(),
                    namespace: namespace.to_owned(),
                    too_wide: denial == Denial::TooWide,
                }
            })
    }

    /// What `caller` may see when it `verb`s `resource` in `namespace`,
    /// if anything: [`Auth::authorize`] without its log and count, for
    /// judging open watches again.
    pub(super) fn scope_of(
        &self,
        caller: &Caller,
        verb: Verb,
        resource: &Resource,
        namespace: &str,
    ) -> Option<Scope> {
        match &self.rules {
            None => Some(Scope::unrestricted()),
            Some(rules) => rules.authorize(caller, verb, resource, namespace).ok(),
        }
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

/// The caller a client certificate names (user: the SAN `from` says,
/// else the subject CN, the last of several as Kubernetes takes it;
/// groups: the subject's O values), and the end of its validity.
fn subject(cert: &CertificateDer<'_>, from: CertificateUser) -> Option<(Caller, SystemTime)> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let subject = cert.subject();
    let san = || {
        let san = cert.subject_alternative_name().ok().flatten()?;
        san.value
            .general_names
            .iter()
            .find_map(|name| match (from, name) {
                (CertificateUser::Uri, GeneralName::URI(uri)) => Some(uri.to_string()),
                (CertificateUser::Dns, GeneralName::DNSName(dns)) => Some(dns.to_string()),
                _ => None,
            })
    };
    let cn = || Some(subject.iter_common_name().last()?.as_str().ok()?.to_owned());
    let user = match from {
        CertificateUser::Cn => cn(),
        CertificateUser::Uri | CertificateUser::Dns => san(),
    }
    .filter(|u| !u.is_empty())?;
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    let not_after = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
    let not_after = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(not_after);
    Some((Caller { user, groups }, not_after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert(cn: &str, sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "team");
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_certificate_names_its_user_by_the_one_name_asked_for_and_cn_by_default() {
        let both = cert(
            "cn-user",
            vec![
                SanType::DnsName("host.example".try_into().unwrap()),
                SanType::URI("spiffe://cluster/ns/a/sa/b".try_into().unwrap()),
            ],
        );
        let user = |c: &CertificateDer<'_>, from| subject(c, from).unwrap().0.user;
        assert_eq!(
            user(&both, CertificateUser::Uri),
            "spiffe://cluster/ns/a/sa/b"
        );
        assert_eq!(user(&both, CertificateUser::Dns), "host.example");
        assert_eq!(user(&both, CertificateUser::Cn), "cn-user");
        assert_eq!(user(&both, CertificateUser::default()), "cn-user");
        // No fallback from one kind of name to another: a CA that checks
        // the names it signs checks one kind.
        let plain = cert("cn-only", vec![]);
        assert!(subject(&plain, CertificateUser::Uri).is_none());
        assert!(subject(&plain, CertificateUser::Dns).is_none());
        let no_cn = cert("", vec![SanType::URI("spiffe://c/x".try_into().unwrap())]);
        assert!(subject(&no_cn, CertificateUser::Cn).is_none());
        assert_eq!(
            subject(&both, CertificateUser::Uri).unwrap().0.groups,
            ["team"]
        );
    }
}
