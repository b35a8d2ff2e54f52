//! The token and rule fixture the authorization tests share: alice reads
//! her tenant's namespace, node-7 every namespace's pods on its node, and
//! bob has a token and no rule.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use tonic::metadata::MetadataValue;
use tonic::Request;

pub const TENANT_TOKENS: &str = "
- {token: alice-token, user: alice, groups: [tenant-a]}
- {token: node-token, user: node-7}
- {token: bob-token, user: bob}
";

const TENANT_RULES: &str = r#"
auth:
  tokens_file: TOKENS
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["group:tenant-a"]
      resources: ["pods"]
      namespaces: ["tenant-a"]
      verbs: ["list", "get", "watch"]
    - subjects: ["user:node-7"]
      resources: ["pods"]
      namespaces: ["*"]
      verbs: ["list", "get", "watch"]
      field_selector: "spec.nodeName={user}"
"#;

/// The `auth` and `authorization` sections of the tenant fixture, with
/// [`TENANT_TOKENS`] written in `dir`.
pub fn tenant_auth(dir: &Path) -> String {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, TENANT_TOKENS).unwrap();
    TENANT_RULES.replace("TOKENS", &tokens.display().to_string())
}

/// `message` sent with `token` as its bearer token.
pub fn as_caller<T>(token: &str, message: T) -> Request<T> {
    let mut req = Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    req.metadata_mut().insert("authorization", value);
    req
}

/// `text` written to `dir/name` by rename, as Kubernetes updates mounted
/// files: a reader sees the old file or the new, whole.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// Seconds since the epoch, as JWTs count time.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An ES256 issuer: its key and its JWKS document.
pub struct Issuer {
    key: EncodingKey,
    pub jwks: String,
}

pub fn issuer(kid: &str) -> Issuer {
    let pair = rcgen::KeyPair::generate().unwrap();
    let raw = pair.public_key_raw();
    Issuer {
        key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
        jwks: format!(
            r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"{kid}","x":"{}","y":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode(&raw[1..33]),
            URL_SAFE_NO_PAD.encode(&raw[33..65])
        ),
    }
}

impl Issuer {
    pub fn sign(&self, kid: &str, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        encode(&header, &claims, &self.key).unwrap()
    }

    /// A service account's token of group `system:serviceaccounts:ns`,
    /// for the issuer and audience [`JWT_AUTH`] names.
    pub fn token(&self, kid: &str, exp: u64) -> String {
        self.sign(
            kid,
            serde_json::json!({
                "sub": "system:serviceaccount:ns:reader",
                "groups": ["system:serviceaccounts:ns"],
                "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"], "exp": exp,
            }),
        )
    }
}

/// JWTs of the issuer whose keys are in `JWKS`, by the name and audience
/// [`Issuer::token`] signs.
pub const JWT_AUTH: &str = r#"
auth:
  allow_plaintext_tokens: true
  jwt: {jwks_file: JWKS, issuer: "https://kubernetes.default.svc", audiences: [watchproxy]}
"#;
