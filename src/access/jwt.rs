//! JSON Web Tokens verified offline against a JWKS file, in the shape of
//! Kubernetes projected service-account tokens: issuer, audiences, expiry
//! and not-before checked without leeway (an open watch ends at `exp`, so
//! a call must not be admitted past it), the user and groups read from
//! configured claims. Only asymmetric keys are accepted, so a public key
//! can never sign.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{decode, decode_header, DecodingKey, Validation};
use parking_lot::{Mutex, RwLock};
use tracing::{info, warn};

use super::reload::{baseline, Baseline};
use super::Caller;
use crate::config::JwtConfig;

pub struct Jwt {
    config: JwtConfig,
    keys: RwLock<Arc<JwkSet>>,
    /// What the JWKS file held before the keys in use were read from it,
    /// for its reloader's first comparison.
    first_seen: Mutex<Option<Baseline>>,
}

/// Why a token was refused; never the token or its claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    /// Refused for its `exp` alone.
    pub expired: bool,
}

impl From<&'static str> for Refusal {
    fn from(reason: &'static str) -> Self {
        Self {
            reason,
            expired: false,
        }
    }
}

impl Jwt {
    pub fn load(config: &JwtConfig) -> anyhow::Result<Self> {
        let first_seen = baseline(std::slice::from_ref(&config.jwks_file));
        Ok(Self {
            keys: RwLock::new(Arc::new(read(&config.jwks_file)?)),
            config: config.clone(),
            first_seen: Mutex::new(Some(first_seen)),
        })
    }

    /// Where a reloader of the JWKS file starts (as [`super::tokens::Tokens::baseline`]).
    pub fn baseline(&self) -> Baseline {
        (self.first_seen.lock().take())
            .unwrap_or_else(|| baseline(std::slice::from_ref(&self.config.jwks_file)))
    }

    pub fn path(&self) -> &Path {
        &self.config.jwks_file
    }

    /// Reads the key set again. One that cannot be used ends the keys in
    /// use (a JWKS file is emptied or removed to stop trusting a key);
    /// logged with the file; false then.
    pub fn reload(&self) -> bool {
        match read(&self.config.jwks_file) {
            Ok(keys) => {
                info!(keys = keys.keys.len(), "JWKS file changed; using it");
                *self.keys.write() = Arc::new(keys);
                true
            }
            Err(e) => {
                *self.keys.write() = Arc::new(JwkSet { keys: Vec::new() });
                warn!(
                    file = %self.config.jwks_file.display(),
                    error = format!("{e:#}"),
                    "JWKS file changed and cannot be used; no JWT verifies until it can"
                );
                false
            }
        }
    }

    /// Whether `token` has a JWT's shape (three dot-separated parts).
    pub fn looks_like(token: &str) -> bool {
        token.split('.').count() == 3
    }

    /// The caller a valid token names, and the token's `exp`.
    pub fn caller(&self, token: &str) -> Result<(Caller, SystemTime), Refusal> {
        let header = decode_header(token).map_err(|_| "the JWT header cannot be read")?;
        let keys = self.keys.read().clone();
        let jwk = match &header.kid {
            Some(kid) => keys.find(kid),
            None if keys.keys.len() == 1 => keys.keys.first(),
            None => None,
        }
        .ok_or("no key in the JWKS file verifies this JWT")?;
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            return Err("symmetric keys are not accepted".into());
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| "a JWKS key cannot be used")?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&self.config.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = 0;
        validation.validate_nbf = true;
        let claims = decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &validation)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                if matches!(e.kind(), K::ExpiredSignature) {
                    return Refusal {
                        reason: "the JWT has expired",
                        expired: true,
                    };
                }
                Refusal::from(match e.kind() {
                    K::ImmatureSignature => "the JWT is not valid yet (its nbf is in the future)",
                    K::InvalidIssuer => "the JWT's issuer is not the configured one",
                    K::InvalidAudience => "the JWT is not for this audience",
                    K::InvalidSignature => "the JWT's signature does not verify",
                    K::InvalidAlgorithm => "the JWT's algorithm does not match its key",
                    K::MissingRequiredClaim(_) => "the JWT lacks exp, iss or aud",
                    _ => "the JWT is not valid",
                })
            })?
            .claims;
        let exp = claims
            .get("exp")
            .and_then(serde_json::Value::as_f64)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| UNIX_EPOCH + Duration::from_secs_f64(s.min(1e12)))
            .ok_or("the JWT's exp is not a time")?;
        // RFC 7519: valid only before `exp`; the library's check lets the
        // second of `exp` itself pass, and an open watch ends at it.
        if exp <= SystemTime::now() {
            return Err(Refusal {
                reason: "the JWT has expired",
                expired: true,
            });
        }
        let user = claims
            .get(&self.config.username_claim)
            .and_then(|v| v.as_str())
            .filter(|u| !u.is_empty())
            .ok_or("the JWT has no user name claim")?
            .to_owned();
        let groups = match claims.get(&self.config.groups_claim) {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|g| g.as_str().map(str::to_owned)).collect())
                .ok_or("the JWT's groups claim is not a list of strings")?,
        };
        Ok((Caller { user, groups }, exp))
    }
}

fn read(path: &PathBuf) -> anyhow::Result<JwkSet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the JWKS file {}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a JWKS document: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

    use super::*;

    struct Issuer {
        key: EncodingKey,
        jwks: String,
    }

    fn issuer() -> Issuer {
        let pair = rcgen::KeyPair::generate().unwrap();
        let raw = pair.public_key_raw();
        let (x, y) = (&raw[1..33], &raw[33..65]);
        let jwks = format!(
            r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"k1","use":"sig","alg":"ES256","x":"{}","y":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode(x),
            URL_SAFE_NO_PAD.encode(y)
        );
        Issuer {
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
            jwks,
        }
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn token(issuer: &Issuer, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        encode(&header, &claims, &issuer.key).unwrap()
    }

    fn verifier(jwks: &str) -> (Jwt, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, jwks).unwrap();
        let config = JwtConfig {
            jwks_file: path,
            issuer: "https://kubernetes.default.svc".into(),
            audiences: vec!["watchproxy".into()],
            username_claim: "sub".into(),
            groups_claim: "groups".into(),
        };
        (Jwt::load(&config).unwrap(), dir)
    }

    #[test]
    fn a_jwks_file_that_cannot_be_used_ends_its_keys() {
        let iss = issuer();
        let (jwt, dir) = verifier(&iss.jwks);
        let good = token(
            &iss,
            serde_json::json!({
                "sub": "reader", "iss": "https://kubernetes.default.svc",
                "aud": ["watchproxy"], "exp": now() + 600,
            }),
        );
        assert!(jwt.caller(&good).is_ok());
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, "{\"keys\": [").unwrap();
        assert!(!jwt.reload());
        assert!(jwt.caller(&good).is_err(), "a file that does not parse");
        std::fs::write(&path, &iss.jwks).unwrap();
        assert!(jwt.reload());
        assert!(jwt.caller(&good).is_ok());
        std::fs::remove_file(&path).unwrap();
        assert!(!jwt.reload());
        assert!(jwt.caller(&good).is_err(), "a file removed");
    }

    #[test]
    fn a_service_account_token_names_its_caller_and_a_bad_one_is_refused() {
        let iss = issuer();
        let (jwt, _dir) = verifier(&iss.jwks);
        let claims = |exp: u64, aud: &str, iss_: &str| {
            serde_json::json!({
                "sub": "system:serviceaccount:ns:reader",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:ns"],
                "iss": iss_, "aud": [aud], "exp": exp,
            })
        };
        let good = token(
            &iss,
            claims(now() + 600, "watchproxy", "https://kubernetes.default.svc"),
        );
        assert!(Jwt::looks_like(&good));
        let (caller, _) = jwt.caller(&good).unwrap();
        assert_eq!(caller.user, "system:serviceaccount:ns:reader");
        assert_eq!(caller.groups.len(), 2);

        let expired = token(
            &iss,
            claims(now() - 3600, "watchproxy", "https://kubernetes.default.svc"),
        );
        let refusal = jwt.caller(&expired).unwrap_err();
        assert_eq!(refusal.reason, "the JWT has expired");
        assert!(refusal.expired);
        let other_aud = token(
            &iss,
            claims(now() + 600, "other", "https://kubernetes.default.svc"),
        );
        assert_eq!(
            jwt.caller(&other_aud).unwrap_err().reason,
            "the JWT is not for this audience"
        );
        let other_iss = token(&iss, claims(now() + 600, "watchproxy", "https://evil"));
        assert!(jwt.caller(&other_iss).is_err());
        let forged = token(
            &issuer(),
            claims(now() + 600, "watchproxy", "https://kubernetes.default.svc"),
        );
        assert_eq!(
            jwt.caller(&forged).unwrap_err().reason,
            "the JWT's signature does not verify"
        );
        let early = token(
            &iss,
            serde_json::json!({
                "sub": "u", "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"],
                "nbf": now() + 600, "exp": now() + 1200,
            }),
        );
        assert_eq!(
            jwt.caller(&early).unwrap_err().reason,
            "the JWT is not valid yet (its nbf is in the future)"
        );
        // A claim of the wrong type is not a claim left out
        // (CVE-2026-25537): refused, not skipped.
        for claims in [
            serde_json::json!({
                "sub": "u", "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"],
                "nbf": "99999999999", "exp": now() + 1200,
            }),
            serde_json::json!({
                "sub": "u", "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"],
                "exp": (now() + 1200).to_string(),
            }),
        ] {
            assert!(jwt.caller(&token(&iss, claims)).is_err());
        }
        // A token signed with the public key as an HMAC secret.
        let mut parts: Vec<&str> = good.split('.').collect();
        let hs = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","kid":"k1"}"#);
        parts[0] = &hs;
        assert!(jwt.caller(&parts.join(".")).is_err());
        assert!(jwt.caller("not.a.jwt").is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_token_is_verified_or_refused_without_a_panic(t in "[A-Za-z0-9_.=-]{0,120}") {
            let (jwt, _dir) = verifier(r#"{"keys":[]}"#);
            let _ = jwt.caller(&t);
        }
    }
}
