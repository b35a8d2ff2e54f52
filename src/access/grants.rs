//! Authorization for a stream's whole life. The [`Authority`] holds the
//! authenticators and rules in use (replaced whole when the configuration
//! changes) and the grant of every open watch: who it was given to, with
//! which credential, and what it was allowed. A grant ends when its
//! credential expires, when its token or key leaves its file, when the
//! rules in use no longer give it what it was given, or when its user has
//! more open watches than a lowered per-user limit allows (the newest
//! end); its watch then ends with a status naming where to resume.
//! Nothing of this runs per delivery: a watch reads one counter that
//! every watch shares, and written only when a grant ends, when it is
//! polled; its own grant only once that counter has moved.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use slab::Slab;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use super::grant::{Grant, Granted, Revoke};
use super::{Auth, Identity, Lapse};

/// How often deadlines are looked at: an expired credential's watches end
/// within this (and one poll) of its expiry.
const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// How many grants have ended: what every open watch reads when it is
/// polled. Alone on its cache line, which only an ending grant writes.
#[repr(align(64))]
#[derive(Default)]
pub(super) struct Ended(pub(super) AtomicU64);

/// The authenticators and rules in use, and the open grants they judge.
pub struct Authority {
    current: RwLock<Current>,
    open: Mutex<Open>,
    ended: Arc<Ended>,
    /// The authenticators were replaced: their files are watched anew.
    replaced: Notify,
}

#[derive(Clone)]
struct Current {
    auth: Arc<Auth>,
    /// The most open watches one user may keep, as the configuration in
    /// use says.
    max_watchers_per_user: Option<usize>,
    /// Counts replacements, so that a grant judged under an older
    /// authority is judged again.
    generation: u64,
}

#[derive(Default)]
struct Open {
    /// Each grant, with when it was given among them all.
    grants: Slab<(u64, Arc<Grant>)>,
    given: u64,
    /// (expiry, slab key) of the grants whose credential expires.
    deadlines: BTreeSet<(SystemTime, usize)>,
}

/// The authenticators and rules a call was judged by.
pub struct Judged {
    pub auth: Arc<Auth>,
    generation: u64,
}

/// Who a request was identified as from its headers, before its body was
/// read, and under which authenticators: set by admission, so the handler
/// does not identify it again unless they changed since.
#[derive(Debug, Clone)]
pub struct Identified {
    pub identity: Identity,
    generation: u64,
}

impl Judged {
    /// `identity`, as these authenticators identified it.
    pub fn identified(&self, identity: Identity) -> Identified {
        Identified {
            identity,
            generation: self.generation,
        }
    }

    /// The identity admission found, if these authenticators still name
    /// it: looked at again when they changed since (a file read again, a
    /// new configuration) or its credential has expired.
    pub fn still_identified(&self, identified: &Identified) -> Result<Identity, Revoke> {
        let identity = &identified.identity;
        let expired = (identity.credential.expires()).is_some_and(|t| t <= SystemTime::now());
        if identified.generation != self.generation || expired {
            self.auth.still_names(identity)?;
        }
        Ok(identity.clone())
    }
}

/// How many grants have ended, as a grant reads it: held by a reader that
/// asks, without reaching the grant, whether any ended since a count
/// [`HeldGrant::seen`] gave it.
#[derive(Clone)]
pub struct GrantEpoch(Arc<Ended>);

impl GrantEpoch {
    /// Whether no grant ended since the count was `seen`.
    pub fn unchanged_since(&self, seen: u64) -> bool {
        self.0 .0.load(Ordering::Acquire) == seen
    }
}

/// An open watch's grant, held while it is open.
pub struct HeldGrant {
    authority: Arc<Authority>,
    key: usize,
    expires: Option<SystemTime>,
    grant: Arc<Grant>,
    ended: Arc<Ended>,
    /// `ended` when the grant was last looked at.
    seen: u64,
}

impl HeldGrant {
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Whether [`HeldGrant::revoked`] has something new to look at: some
    /// grant ended since it last looked. Reads without taking it.
    pub fn may_have_ended(&self) -> bool {
        self.ended.0.load(Ordering::Acquire) != self.seen
    }

    /// The count of ended grants it reads, for a reader that keeps what
    /// it saw apart from the grant (see [`GrantEpoch`]).
    pub fn epoch(&self) -> GrantEpoch {
        GrantEpoch(self.ended.clone())
    }

    /// The count of ended grants when it was last looked at.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Why the grant ended, once it has. While no grant has ended since
    /// the last look, a read of the shared counter alone.
    pub fn revoked(&mut self) -> Option<Revoke> {
        let ended = self.ended.0.load(Ordering::Acquire);
        if ended == self.seen {
            return None;
        }
        self.seen = ended;
        self.grant.revoked()
    }
}

impl Drop for HeldGrant {
    fn drop(&mut self) {
        let mut open = self.authority.open.lock();
        open.grants.remove(self.key);
        if let Some(at) = self.expires {
            open.deadlines.remove(&(at, self.key));
        }
    }
}

impl Authority {
    pub fn new(auth: Auth) -> Self {
        Self {
            current: RwLock::new(Current {
                auth: Arc::new(auth),
                max_watchers_per_user: None,
                generation: 0,
            }),
            open: Mutex::default(),
            ended: Arc::default(),
            replaced: Notify::new(),
        }
    }

    /// The authenticators and rules in use.
    pub fn current(&self) -> Judged {
        let c = self.current.read().clone();
        Judged {
            auth: c.auth,
            generation: c.generation,
        }
    }

    /// Keeps `grant` while the returned guard lives; `judged` is what
    /// allowed it, so a replacement since is caught.
    pub fn hold(self: &Arc<Self>, grant: Grant, judged: &Judged) -> HeldGrant {
        let expires = grant.identity.credential.expires();
        let grant = Arc::new(grant);
        // Before the grant can end: every end after it moves the counter.
        let seen = self.ended.0.load(Ordering::Acquire);
        let key = {
            let mut open = self.open.lock();
            open.given += 1;
            let given = open.given;
            let key = open.grants.insert((given, grant.clone()));
            if let Some(at) = expires {
                open.deadlines.insert((at, key));
            }
            key
        };
        let now = self.current();
        if now.generation != judged.generation {
            if let Some(why) = grant.judge(&now.auth) {
                grant.revoke(why, &self.ended);
            }
        }
        HeldGrant {
            authority: self.clone(),
            key,
            expires,
            grant,
            ended: self.ended.clone(),
            seen,
        }
    }

    /// Puts `auth` in use for new calls, and ends each open watch it would
    /// not give what it was given, and each beyond `max_watchers_per_user`
    /// of its user (the newest).
    pub fn replace(&self, auth: Auth, max_watchers_per_user: Option<usize>) {
        {
            let mut current = self.current.write();
            current.auth = Arc::new(auth);
            current.max_watchers_per_user = max_watchers_per_user;
            current.generation += 1;
        }
        self.replaced.notify_one();
        self.rejudge();
    }

    /// The authenticators' files were read again: calls identified before
    /// are looked at again, and every open grant is judged again.
    pub fn credentials_changed(&self) {
        self.current.write().generation += 1;
        self.rejudge();
    }

    /// Judges every open grant by the authority in use.
    fn rejudge(&self) {
        let (auth, max) = {
            let c = self.current.read();
            (c.auth.clone(), c.max_watchers_per_user)
        };
        let mut grants: Vec<(u64, Arc<Grant>)> = (self.open.lock().grants.iter())
            .map(|(_, g)| g.clone())
            .collect();
        for (_, grant) in grants.iter().filter(|(_, g)| g.revoked().is_none()) {
            if let Some(why) = grant.judge(&auth) {
                grant.revoke(why, &self.ended);
            }
        }
        let Some(max) = max else {
            return;
        };
        // Oldest first: each user keeps its first `max`.
        grants.sort_unstable_by_key(|(given, _)| *given);
        let mut kept: HashMap<&str, usize> = HashMap::new();
        let counted = |g: &Grant| g.revoked().is_none() && g.is_a_watch();
        for (_, grant) in grants.iter().filter(|(_, g)| counted(g)) {
            let n = kept.entry(&*grant.identity.account).or_default();
            if *n < max {
                *n += 1;
            } else {
                grant.revoke(Revoke::AccessChanged, &self.ended);
            }
        }
    }

    /// Ends the grants whose credential has expired by `now`.
    fn expire(&self, now: SystemTime) {
        let due: Vec<Arc<Grant>> = {
            let open = &mut *self.open.lock();
            let mut due = Vec::new();
            while let Some(&(at, key)) = open.deadlines.first() {
                if at > now {
                    break;
                }
                open.deadlines.pop_first();
                due.extend(open.grants.get(key).map(|(_, g)| g.clone()));
            }
            due
        };
        for grant in due {
            grant.revoke(Revoke::Credential(Lapse::Expired), &self.ended);
        }
    }

    /// Ends expired grants as their time comes, and reads the token and
    /// JWKS files of the authenticators in use again when they change
    /// (judging every grant again after), until `shutdown`.
    pub fn spawn_guard(
        self: &Arc<Self>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let authority = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRY_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let files = shutdown.child_token();
                let rejudge = rejudge(&Arc::downgrade(&authority));
                let watching = authority
                    .current()
                    .auth
                    .spawn_reload(files.clone(), rejudge);
                let replaced = async { authority.replaced.notified().await };
                tokio::pin!(replaced);
                let stop = loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break true,
                        _ = &mut replaced => break false,
                        _ = tick.tick() => authority.expire(SystemTime::now()),
                    }
                };
                files.cancel();
                for task in watching {
                    let _ = task.await;
                }
                if stop {
                    return;
                }
            }
        })
    }
}

/// Judges every call identified and every grant given before again, while
/// the authority lives.
fn rejudge(authority: &Weak<Authority>) -> Arc<dyn Fn() + Send + Sync> {
    let authority = authority.clone();
    Arc::new(move || {
        if let Some(a) = authority.upgrade() {
            a.credentials_changed();
        }
    })
}
