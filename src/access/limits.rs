//! Limits per user, so that one noisy tenant cannot take another's share:
//! open watches, a token bucket of List and Get calls, another of the
//! reads the cache cannot answer as it is, and the size of a List page.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{AccessError, Identity};
use crate::config::LimitsConfig;

/// Buckets not touched for this long are forgotten (a full bucket is what
/// a new one would be anyway).
const IDLE_BUCKET: Duration = Duration::from_secs(60);

/// Open watches by user; a user with none has no entry.
type Watchers = Arc<Mutex<HashMap<String, usize>>>;

pub struct UserLimits {
    bounds: parking_lot::RwLock<Bounds>,
    watchers: Watchers,
    buckets: Buckets,
    /// Of the reads that reach the origin or rebuild an old snapshot.
    costly: Buckets,
}

/// A token bucket per user.
#[derive(Default)]
struct Buckets(Mutex<HashMap<String, Bucket>>);

/// The limits, as configured: a new configuration changes them in place,
/// for new calls; the open watches and the buckets stay counted.
#[derive(Clone, Copy)]
struct Bounds {
    max_watchers: Option<usize>,
    rate: Option<f64>,
    burst: f64,
    max_page: Option<usize>,
    costly_rate: Option<f64>,
    costly_burst: f64,
}

impl Bounds {
    fn of(limits: &LimitsConfig) -> Self {
        Self {
            max_watchers: limits.max_watchers_per_user,
            rate: limits.unary_per_user_per_second,
            burst: f64::from(limits.unary_burst_per_user),
            max_page: limits.max_page_size.filter(|&n| n > 0),
            costly_rate: limits.costly_reads_per_user_per_second,
            costly_burst: f64::from(limits.costly_read_burst_per_user),
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A user's place among its open watches; given back when dropped.
pub struct WatchPlace {
    watchers: Watchers,
    user: String,
}

impl Drop for WatchPlace {
    fn drop(&mut self) {
        let mut w = self.watchers.lock();
        if let Some(n) = w.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.user);
            }
        }
    }
}

impl UserLimits {
    pub fn new(limits: &LimitsConfig) -> Self {
        Self {
            bounds: parking_lot::RwLock::new(Bounds::of(limits)),
            watchers: Arc::default(),
            buckets: Buckets::default(),
            costly: Buckets::default(),
        }
    }

    /// New calls are held to `limits`' per-user values from now on.
    pub fn reconfigure(&self, limits: &LimitsConfig) {
        *self.bounds.write() = Bounds::of(limits);
    }

    /// A place for one more watch of `identity`'s account.
    /// Counted with or without a limit, so that one set later counts the
    /// watches already open.
    pub fn watch(&self, identity: &Identity) -> Result<WatchPlace, AccessError> {
        let max = self.bounds.read().max_watchers;
        let mut w = self.watchers.lock();
        let n = w.entry(identity.account.to_string()).or_default();
        if let Some(max) = max.filter(|max| *n >= *max) {
            return Err(AccessError::UserLimit {
                user: identity.caller.user.clone(),
                what: format!("{max} open watches"),
                retry_after: None,
            });
        }
        *n += 1;
        Ok(WatchPlace {
            watchers: self.watchers.clone(),
            user: identity.account.to_string(),
        })
    }

    /// The objects a List page asking for `limit` (`usize::MAX`: all) may
    /// hold.
    pub fn page(&self, limit: usize) -> usize {
        self.bounds
            .read()
            .max_page
            .map_or(limit, |max| limit.min(max))
    }

    /// Takes one List or Get from `identity`'s account's bucket.
    pub fn unary(&self, identity: &Identity) -> Result<(), AccessError> {
        let Bounds { rate, burst, .. } = *self.bounds.read();
        let what = |rate| format!("{rate} List/Get calls per second");
        let user = &identity.caller.user;
        self.buckets
            .take(&identity.account, user, rate, burst, what)
    }

    /// Takes one read the cache cannot answer as it is from `identity`'s
    /// account's bucket of those.
    pub fn costly_read(&self, identity: &Identity) -> Result<(), AccessError> {
        let Bounds {
            costly_rate,
            costly_burst,
            ..
        } = *self.bounds.read();
        let what = |rate| format!("{rate} reads per second from etcd or of old versions");
        self.costly.take(
            &identity.account,
            &identity.caller.user,
            costly_rate,
            costly_burst,
            what,
        )
    }
}

impl Buckets {
    /// One token from `account`'s bucket (of `user`, as it is told), which
    /// fills at `rate` up to `burst`; none: no bound.
    fn take(
        &self,
        account: &str,
        user: &str,
        rate: Option<f64>,
        burst: f64,
        what: impl Fn(f64) -> String,
    ) -> Result<(), AccessError> {
        let Some(rate) = rate else {
            return Ok(());
        };
        let now = Instant::now();
        let mut buckets = self.0.lock();
        if buckets.len() > 1024 {
            buckets.retain(|_, b| now.duration_since(b.at) < IDLE_BUCKET);
        }
        let b = buckets.entry(account.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(AccessError::UserLimit {
            user: user.to_owned(),
            what: what(rate),
            retry_after: Some(Duration::from_secs_f64((1.0 - b.tokens) / rate)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Caller, Credential, Secret};

    /// `user` as a token of the token file names it.
    fn caller(user: &str) -> Identity {
        token_of(user, false)
    }

    fn token_of(user: &str, shared_names: bool) -> Identity {
        let caller = Caller {
            user: user.into(),
            groups: vec![],
        };
        Identity::new(caller, Credential::Token(Secret::new("t")), shared_names)
    }

    fn certificate_of(user: &str, shared_names: bool) -> Identity {
        let caller = Caller {
            user: user.into(),
            groups: vec![],
        };
        let not_after = std::time::SystemTime::now() + Duration::from_secs(60);
        let chain = crate::access::PeerCerts(Arc::default());
        let certificate = Credential::Certificate { not_after, chain };
        Identity::new(caller, certificate, shared_names)
    }

    #[test]
    fn a_name_each_authenticator_gives_is_a_user_of_its_own_unless_names_are_shared() {
        let limits = UserLimits::new(&LimitsConfig {
            max_watchers_per_user: Some(1),
            ..LimitsConfig::default()
        });
        let _alice = limits.watch(&certificate_of("alice", false)).unwrap();
        assert!(
            limits.watch(&token_of("alice", false)).is_ok(),
            "a token naming alice does not spend the certificate's alice's places"
        );
        let _shared = limits.watch(&certificate_of("bob", true)).unwrap();
        assert!(
            limits.watch(&token_of("bob", true)).is_err(),
            "shared names: one bob"
        );
    }

    #[test]
    fn each_user_has_its_own_watch_places() {
        let limits = UserLimits::new(&LimitsConfig {
            max_watchers_per_user: Some(2),
            ..LimitsConfig::default()
        });
        let (a, b) = (caller("a"), caller("b"));
        let first = limits.watch(&a).unwrap();
        let _second = limits.watch(&a).unwrap();
        assert!(limits.watch(&a).is_err());
        assert!(limits.watch(&b).is_ok(), "another user is not held up");
        drop(first);
        assert!(
            limits.watch(&a).is_ok(),
            "a closed watch gives its place back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn each_user_has_its_own_bucket_of_calls() {
        let limits = UserLimits::new(&LimitsConfig {
            unary_per_user_per_second: Some(10.0),
            unary_burst_per_user: 3,
            ..LimitsConfig::default()
        });
        let (a, b) = (caller("a"), caller("b"));
        for _ in 0..3 {
            limits.unary(&a).unwrap();
        }
        let Err(AccessError::UserLimit { retry_after, .. }) = limits.unary(&a) else {
            panic!("the burst is spent");
        };
        assert_eq!(retry_after, Some(Duration::from_millis(100)));
        limits.unary(&b).unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        limits.unary(&a).unwrap();
    }

    #[test]
    fn a_list_page_holds_at_most_the_bound_and_a_new_bound_applies_at_once() {
        let limits = UserLimits::new(&LimitsConfig::default());
        assert_eq!(limits.page(usize::MAX), usize::MAX);
        limits.reconfigure(&LimitsConfig {
            max_page_size: Some(500),
            ..LimitsConfig::default()
        });
        assert_eq!(limits.page(usize::MAX), 500, "all: pages of the bound");
        assert_eq!(limits.page(20), 20);
        assert_eq!(limits.page(501), 500);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_the_cache_cannot_answer_have_their_own_bucket() {
        let limits = UserLimits::new(&LimitsConfig {
            costly_reads_per_user_per_second: Some(2.0),
            costly_read_burst_per_user: 2,
            ..LimitsConfig::default()
        });
        let (a, b) = (caller("a"), caller("b"));
        limits.costly_read(&a).unwrap();
        limits.costly_read(&a).unwrap();
        let Err(AccessError::UserLimit { retry_after, .. }) = limits.costly_read(&a) else {
            panic!("the burst is spent");
        };
        assert_eq!(retry_after, Some(Duration::from_millis(500)));
        limits.costly_read(&b).unwrap();
        limits.unary(&caller("a")).unwrap();
    }
}
