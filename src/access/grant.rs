//! One open watch's or stream's grant: what it was allowed, whether it
//! still is, and its end, which wakes the watch.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use tracing::info;

use super::grants::Ended;
use super::{Auth, Identity, Lapse, Scope};
use crate::config::Verb;
use crate::object::Resource;

/// Why a grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoke {
    Credential(Lapse),
    /// The rules in use no longer allow the watch, or force other selectors
    /// on it.
    AccessChanged,
}

/// What a grant allows `verb` on.
pub enum Granted {
    /// The objects of `resource` in `namespace` ("" for all) that `scope`
    /// lets through.
    Resource {
        resource: Arc<Resource>,
        namespace: String,
        scope: Scope,
    },
    /// Keys that no served resource holds (etcd's API, forwarded): judged
    /// by whether a rule still gives every resource and namespace.
    Unserved,
    /// Nothing but the caller's identity: a stream that lives longer than
    /// the watches it opens (etcd's Watch) ends with its credential.
    Identity,
}

/// What an open watch or stream was allowed, and whether it still is.
pub struct Grant {
    pub(super) identity: Identity,
    verb: Verb,
    granted: Granted,
    revoked: OnceLock<Revoke>,
    /// Wakes the watch, so that it sees the end at once.
    alarm: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Grant {
    pub fn new(
        identity: Identity,
        verb: Verb,
        resource: Arc<Resource>,
        namespace: &str,
        scope: Scope,
    ) -> Self {
        let granted = Granted::Resource {
            resource,
            namespace: namespace.to_owned(),
            scope,
        };
        Self::of(identity, verb, granted)
    }

    /// A grant of `verb` on what `granted` names.
    pub fn of(identity: Identity, verb: Verb, granted: Granted) -> Self {
        Self {
            identity,
            verb,
            granted,
            revoked: OnceLock::new(),
            alarm: OnceLock::new(),
        }
    }

    /// Why the grant ended, once it has.
    pub fn revoked(&self) -> Option<Revoke> {
        self.revoked.get().copied()
    }

    /// `alarm` is called when the grant ends (at once if it has).
    pub fn on_revoke(&self, alarm: impl Fn() + Send + Sync + 'static) {
        if self.alarm.set(Box::new(alarm)).is_ok() && self.revoked.get().is_some() {
            self.ring();
        }
    }

    pub(super) fn revoke(&self, why: Revoke, ended: &Ended) {
        if self.revoked.set(why).is_ok() {
            ended.0.fetch_add(1, Ordering::Release);
            let (resource, namespace) = match &self.granted {
                Granted::Resource {
                    resource,
                    namespace,
                    ..
                } => (resource.name.as_str(), namespace.as_str()),
                Granted::Unserved => ("(keys of no resource)", ""),
                Granted::Identity => ("(a stream)", ""),
            };
            info!(
                user = %self.identity.caller.user,
                resource,
                namespace,
                reason = ?why,
                "ending a watch: its grant ended"
            );
            self.ring();
        }
    }

    pub(super) fn ring(&self) {
        if let Some(alarm) = self.alarm.get() {
            alarm();
        }
    }

    /// Why `auth` would not give this grant now.
    pub(super) fn judge(&self, auth: &Auth) -> Option<Revoke> {
        if let Err(why) = auth.still_names(&self.identity) {
            return Some(why);
        }
        let caller = &self.identity.caller;
        let allowed = match &self.granted {
            Granted::Resource {
                resource,
                namespace,
                scope,
            } => {
                auth.scope_of(caller, self.verb, resource, namespace)
                    .as_ref()
                    == Some(scope)
            }
            Granted::Unserved => auth.allows_unserved(caller, self.verb),
            Granted::Identity => true,
        };
        (!allowed).then_some(Revoke::AccessChanged)
    }

    /// Whether it holds one of its user's watch places.
    pub(super) fn is_a_watch(&self) -> bool {
        matches!(self.granted, Granted::Resource { .. })
    }
}
