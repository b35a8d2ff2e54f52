//! The opaque token that carries a paged list from one page to the next,
//! sealed with an HMAC so that a token this service did not issue (one
//! naming an old revision, to make it read etcd, or another caller's
//! scope) is refused rather than served.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::object::{Resource, Revision};

/// Where the next page starts: every page of a list is cut from the
/// revision of its first page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    #[serde(rename = "v")]
    version: u8,
    #[serde(rename = "r")]
    pub resource: String,
    #[serde(rename = "rv")]
    pub revision: Revision,
    /// The last key returned; the next page starts after it.
    #[serde(rename = "k")]
    pub after: String,
    /// The list is read from the origin, etcd or the upstream watchproxy
    /// (its revision is older than the cache's window), and so are its
    /// pages.
    #[serde(rename = "e", default, skip_serializing_if = "std::ops::Not::not")]
    pub from_origin: bool,
    /// Where the upstream watchproxy's list goes on.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The caller and what it may see (0 where everyone sees the same): a
    /// token is refused for another.
    #[serde(rename = "s", default, skip_serializing_if = "is_zero")]
    pub scope: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl ContinueToken {
    pub fn new(resource: &Resource, revision: Revision, after: String, scope: u64) -> Self {
        Self {
            version: 1,
            resource: resource.name.clone(),
            revision,
            after,
            from_origin: false,
            upstream: None,
            scope,
        }
    }

    /// A token of a list read from the origin, which goes on at `upstream`
    /// when that is another watchproxy.
    pub fn read_from_origin(self, upstream: Option<String>) -> Self {
        Self {
            from_origin: true,
            upstream,
            ..self
        }
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).expect("a token always serialises"))
    }

    /// Decodes and checks that the token belongs to this resource.
    pub fn decode(token: &str, resource: &Resource, scope: u64) -> Result<Self, ApiError> {
        let bad = |why: String| ApiError::invalid("continue_token", why);
        let foreign = || bad("invalid continue token: not one this service issued".into());
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| foreign())?;
        let t: Self = serde_json::from_slice(&bytes).map_err(|_| foreign())?;
        if t.version != 1 {
            return Err(bad(format!(
                "invalid continue token: version {} is not supported",
                t.version
            )));
        }
        if t.resource != resource.name {
            return Err(bad(format!(
                "invalid continue token: issued for resource {:?}",
                t.resource
            )));
        }
        if t.revision == 0 || !t.after.starts_with(&resource.key_prefix()) {
            return Err(bad(
                "invalid continue token: it does not match the resource".into(),
            ));
        }
        if t.scope != scope {
            return Err(bad(
                "invalid continue token: issued for another caller or scope".into(),
            ));
        }
        Ok(t)
    }
}

/// Seals and opens tokens: `<payload>.<HMAC-SHA256 of it>`. Replicas that
/// serve one list's pages share its key (`continue_token_key_file`);
/// without one, each process has its own.
pub struct Sealer(hmac::Key);

impl Sealer {
    pub fn new(key: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, key))
    }

    /// A key of this process alone.
    pub fn random() -> Self {
        let rng = ring::rand::SystemRandom::new();
        Self(hmac::Key::generate(hmac::HMAC_SHA256, &rng).expect("the system's random source"))
    }

    pub fn seal(&self, token: &str) -> String {
        if token.is_empty() {
            return String::new();
        }
        let tag = hmac::sign(&self.0, token.as_bytes());
        format!("{token}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The token inside a sealed one, if this key sealed it.
    pub fn open<'a>(&self, sealed: &'a str) -> Result<&'a str, ApiError> {
        let forged = || {
            ApiError::invalid(
                "continue_token",
                "invalid continue token: not one this service issued",
            )
        };
        let (token, tag) = sealed.rsplit_once('.').ok_or_else(forged)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| forged())?;
        hmac::verify(&self.0, token.as_bytes(), &tag).map_err(|_| forged())?;
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tokens_sealed_with_the_key_open() {
        let (a, b) = (Sealer::new(b"key-a"), Sealer::new(b"key-b"));
        let r = pods();
        let token = ContinueToken::new(&r, 42, "/p/ns/a".into(), 0).encode();
        let sealed = a.seal(&token);
        assert_eq!(a.open(&sealed).unwrap(), token);
        assert!(b.open(&sealed).is_err(), "another key");
        assert!(
            a.open(&token).is_err(),
            "unsealed, as a forger would send it"
        );
        let forged = ContinueToken::new(&r, 1, "/p/ns/a".into(), 0).encode();
        let (_, tag) = sealed.rsplit_once('.').unwrap();
        assert!(
            a.open(&format!("{forged}.{tag}")).is_err(),
            "another token's seal"
        );
        assert!(a.open("").is_err());
        assert_eq!(a.seal(""), "", "no next page, no token");
        let random = Sealer::random();
        assert_eq!(random.open(&random.seal(&token)).unwrap(), token);
        assert!(Sealer::random().open(&random.seal(&token)).is_err());
    }

    fn pods() -> Resource {
        Resource::for_tests(&[])
    }

    #[test]
    fn tokens_round_trip_and_tampering_is_rejected() {
        let r = pods();
        let t = ContinueToken::new(&r, 42, "/p/ns/a".into(), 0);
        assert_eq!(ContinueToken::decode(&t.encode(), &r, 0).unwrap(), t);
        let bound = ContinueToken::new(&r, 42, "/p/ns/a".into(), 7);
        assert_eq!(
            ContinueToken::decode(&bound.encode(), &r, 7).unwrap(),
            bound
        );
        assert!(ContinueToken::decode(&bound.encode(), &r, 8).is_err());
        let upstream = t.clone().read_from_origin(Some("next".into()));
        let read = ContinueToken::decode(&upstream.encode(), &r, 0).unwrap();
        assert!(read.from_origin && read.upstream.as_deref() == Some("next"));
        assert!(ContinueToken::decode(&bound.encode(), &r, 0).is_err());
        let mut other = r.clone();
        other.name = "nodes".into();
        assert!(ContinueToken::decode(&t.encode(), &other, 0).is_err());
        let forged = URL_SAFE_NO_PAD.encode(br#"{"v":1,"r":"pods","rv":42,"k":"/etc/secret"}"#);
        assert!(ContinueToken::decode(&forged, &r, 0).is_err());
        let mut s = t.encode();
        s.insert(3, '*');
        assert!(ContinueToken::decode(&s, &r, 0).is_err());
        assert!(ContinueToken::decode("e30", &r, 0).is_err());
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_continue_tokens(token in crate::fuzzing::text("continue_token")) {
            if let Err(e) = ContinueToken::decode(&token, &pods(), 0) {
                let status: tonic::Status = e.into();
                proptest::prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
            }
        }
    }
}
