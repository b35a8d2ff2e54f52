//! Limits per user, so that one noisy tenant cannot take another's share:
//! open watches, a token bucket of List and Get calls, and the size of a
//! List page.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::auth::Caller;
use super::error::ApiError;
use crate::config::LimitsConfig;

/// Buckets not touched for this long are forgotten (a full bucket is what
/// a new one would be anyway).
const IDLE_BUCKET: Duration = Duration::from_secs(60);

/// Open watches by user; a user with none has no entry.
type Watchers = Arc<Mutex<HashMap<String, usize>>>;

pub struct UserLimits {
    bounds: parking_lot::RwLock<Bounds>,
    watchers: Watchers,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// The limits, as configured: a new configuration changes them in place,
/// for new calls; the open watches and the buckets stay counted.
#[derive(Clone, Copy)]
struct Bounds {
    max_watchers: Option<usize>,
    rate: Option<f64>,
    burst: f64,
    max_page: Option<usize>,
}

impl Bounds {
    fn of(limits: &LimitsConfig) -> Self {
        Self {
            max_watchers: limits.max_watchers_per_user,
            rate: limits.unary_per_user_per_second,
            burst: f64::from(limits.unary_burst_per_user),
            max_page: limits.max_page_size.filter(|&n| n > 0),
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A user's place among its open watches; given back when dropped.
pub struct WatchPlace {
    watchers: Option<(Watchers, String)>,
}

impl Drop for WatchPlace {
    fn drop(&mut self) {
        if let Some((watchers, user)) = self.watchers.take() {
            let mut w = watchers.lock();
            if let Some(n) = w.get_mut(&user) {
                *n -= 1;
                if *n == 0 {
                    w.remove(&user);
                }
            }
        }
    }
}

impl UserLimits {
    pub fn new(limits: &LimitsConfig) -> Self {
        Self {
            bounds: parking_lot::RwLock::new(Bounds::of(limits)),
            watchers: Arc::default(),
            buckets: Mutex::default(),
        }
    }

    /// New calls are held to `limits`' per-user values from now on.
    pub fn reconfigure(&self, limits: &LimitsConfig) {
        *self.bounds.write() = Bounds::of(limits);
    }

    /// A place for one more watch of `caller`'s user.
    pub fn watch(&self, caller: &Caller) -> Result<WatchPlace, ApiError> {
        let Some(max) = self.bounds.read().max_watchers else {
            return Ok(WatchPlace { watchers: None });
        };
        let mut w = self.watchers.lock();
        let n = w.entry(caller.user.clone()).or_default();
        if *n >= max {
            return Err(ApiError::UserLimit {
                user: caller.user.clone(),
                what: format!("{max} open watches"),
                retry_after: None,
            });
        }
        *n += 1;
        Ok(WatchPlace {
            watchers: Some((self.watchers.clone(), caller.user.clone())),
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

    /// Takes one List or Get from `caller`'s user's bucket.
    pub fn unary(&self, caller: &Caller) -> Result<(), ApiError> {
        let Bounds { rate, burst, .. } = *self.bounds.read();
        let Some(rate) = rate else {
            return Ok(());
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock();
        if buckets.len() > 1024 {
            buckets.retain(|_, b| now.duration_since(b.at) < IDLE_BUCKET);
        }
        let b = buckets.entry(caller.user.clone()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(ApiError::UserLimit {
            user: caller.user.clone(),
            what: format!("{rate} List/Get calls per second"),
            retry_after: Some(Duration::from_secs_f64((1.0 - b.tokens) / rate)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str) -> Caller {
        Caller {
            user: user.into(),
            groups: vec![],
        }
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
        let Err(ApiError::UserLimit { retry_after, .. }) = limits.unary(&a) else {
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
}
