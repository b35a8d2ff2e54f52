//! What a caller presented, kept beside its open watches so they can be
//! judged again: when it stops being valid, and the token to verify again
//! when the token or key files change. A credential is never printed.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use super::{Caller, PeerCerts};

/// A caller and the credential that named it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub caller: Caller,
    pub credential: Arc<Credential>,
    /// Whose per-user budgets the caller spends: its user name as its
    /// authenticator names it (`cert:alice`, `token:alice`, `jwt:alice`),
    /// or the bare name where every authenticator names the same users
    /// (`auth.shared_user_names`).
    pub account: Arc<str>,
}

impl Identity {
    pub(super) fn new(caller: Caller, credential: Credential, shared_names: bool) -> Self {
        let kind = match &credential {
            Credential::Anonymous => "anonymous",
            Credential::Certificate { .. } => "cert",
            Credential::Token(_) => "token",
            Credential::Jwt { .. } => "jwt",
        };
        let account = match shared_names {
            true => caller.user.as_str().into(),
            false => format!("{kind}:{}", caller.user).into(),
        };
        Self {
            caller,
            credential: Arc::new(credential),
            account,
        }
    }
}

pub enum Credential {
    /// No credential, where anonymous callers are served.
    Anonymous,
    /// A client certificate of the connection, valid until `not_after`;
    /// its chain, as the connection's handshake verified it.
    Certificate {
        not_after: SystemTime,
        chain: PeerCerts,
    },
    /// A token of the token file.
    Token(Secret),
    /// A JWT, valid until its `exp`.
    Jwt { token: Secret, exp: SystemTime },
}

impl Credential {
    /// When it stops being valid, if it ever does on its own.
    pub fn expires(&self) -> Option<SystemTime> {
        match self {
            Credential::Certificate { not_after, .. } => Some(*not_after),
            Credential::Jwt { exp, .. } => Some(*exp),
            Credential::Anonymous | Credential::Token(_) => None,
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Anonymous => f.write_str("Anonymous"),
            Credential::Certificate { not_after, .. } => f
                .debug_struct("Certificate")
                .field("not_after", not_after)
                .finish(),
            Credential::Token(_) => f.write_str("Token(..)"),
            Credential::Jwt { exp, .. } => f.debug_struct("Jwt").field("exp", exp).finish(),
        }
    }
}

/// A bearer token: readable by the verifiers, never by a log.
pub struct Secret(Box<str>);

impl Secret {
    pub fn new(token: &str) -> Self {
        Self(token.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Why a credential that named a caller no longer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// Its validity ended: a JWT's `exp`, a certificate's `notAfter`.
    Expired,
    /// Taken back: its token left the token file, its JWT's key left the
    /// JWKS file.
    Revoked,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_prints_without_its_secret() {
        let token = Credential::Token(Secret::new("hunter2"));
        let jwt = Credential::Jwt {
            token: Secret::new("a.b.c-hunter2"),
            exp: SystemTime::UNIX_EPOCH,
        };
        for c in [token, jwt] {
            let printed = format!("{c:?}");
            assert!(!printed.contains("hunter2"), "{printed}");
        }
    }
}
