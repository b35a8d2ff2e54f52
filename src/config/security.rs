//! Who may connect and what each caller may read: TLS for clients, the
//! authenticators, and the authorization rules.

use serde::Deserialize;

/// The service's certificate and, for mutual TLS, the clients' CA. The
/// files are read again when they change (rotation by cert-manager or a
/// sidecar): new handshakes use the new pair, open connections keep theirs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM: the certificate, then any intermediates.
    pub cert_file: std::path::PathBuf,
    /// PEM: the certificate's private key.
    pub key_file: std::path::PathBuf,
    /// PEM: the CAs client certificates are verified against.
    #[serde(default)]
    pub client_ca_file: Option<std::path::PathBuf>,
    /// Whether a client must present a certificate; `required` when
    /// `client_ca_file` is set and this is not.
    #[serde(default)]
    pub client_auth: Option<ClientAuth>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    Required,
    Optional,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// YAML: a list of `{token, user, groups}`; read again when it changes.
    #[serde(default)]
    pub tokens_file: Option<std::path::PathBuf>,
    /// Whether a caller without an identity is served (as `system:anonymous`
    /// in `system:unauthenticated`); by default only when no authenticator
    /// (client CA or tokens) is configured.
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// Bearer tokens are accepted over plain text only with this (a sidecar
    /// on loopback, say).
    #[serde(default)]
    pub allow_plaintext_tokens: bool,
    /// JWTs verified offline, as Kubernetes projected service-account
    /// tokens are.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// Which name of a client certificate is the user: its subject CN (the
    /// last, where there are several, as Kubernetes takes it), its first
    /// URI SAN (a SPIFFE ID, say) or its first DNS SAN; only that one, a
    /// certificate without it is refused. Groups are the subject's O
    /// values.
    #[serde(default)]
    pub certificate_user: CertificateUser,
    /// Whether a user name means the same user whichever authenticator
    /// named it (a client certificate, a token, a JWT): then its per-user
    /// budgets are shared. Off by default: each authenticator names its
    /// own users, so one that can carry any name cannot spend another's.
    #[serde(default)]
    pub shared_user_names: bool,
}

/// The name of a client certificate its user is, and what choosing it
/// trusts: that the client CA signs only the names of that kind it has
/// checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CertificateUser {
    /// The subject's common name, as Kubernetes takes it.
    #[default]
    Cn,
    /// The first URI SAN (SPIFFE IDs).
    Uri,
    /// The first DNS SAN.
    Dns,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The signing keys (JSON Web Key Set); read again when it changes.
    pub jwks_file: std::path::PathBuf,
    /// The `iss` a token must carry.
    pub issuer: String,
    /// A token's `aud` must name one of these.
    pub audiences: Vec<String>,
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
}

fn default_username_claim() -> String {
    "sub".into()
}

fn default_groups_claim() -> String {
    "groups".into()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationConfig {
    pub rules: Vec<RuleConfig>,
}

/// One rule: these subjects may use these verbs on these resources in
/// these namespaces, seeing only what the selectors select.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// `user:<name>`, `group:<name>`, or `*` for every caller.
    pub subjects: Vec<String>,
    /// Resource names, or `*`.
    pub resources: Vec<String>,
    /// Namespaces, or `*` for all, cluster-wide requests included.
    pub namespaces: Vec<String>,
    pub verbs: Vec<Verb>,
    /// ANDed into every request this rule allows; `{user}` is the caller's
    /// user name.
    #[serde(default)]
    pub label_selector: String,
    #[serde(default)]
    pub field_selector: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    List,
    Get,
    Watch,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::List => "list",
            Verb::Get => "get",
            Verb::Watch => "watch",
        }
    }
}
