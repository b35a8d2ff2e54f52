//! The token and rule fixture the authorization tests share: alice reads
//! her tenant's namespace, node-7 every namespace's pods on its node, and
//! bob has a token and no rule.

use std::path::Path;

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
