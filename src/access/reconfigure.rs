//! The configuration file read again, when it changes and on SIGHUP. What
//! applies live (`auth`, `authorization` and the per-user limits) is put in
//! use for new calls, and every open watch is judged again by it; a change
//! to any other section is logged as needing a restart; a file that does
//! not validate is refused whole, and the configuration in use stays.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::limits::UserLimits;
use super::reload::{baseline, spawn_reloader_on_hangup};
use super::{Auth, Authority};
use crate::config::{Config, ConfigSource};
use crate::object::Resource;
use crate::telemetry::{Metrics, ReloadResult};

/// Reads `running.source` again whenever it changes or SIGHUP comes, until
/// `shutdown`; none for a configuration that was not read from a file.
pub fn spawn_config_reload(
    running: Config,
    authority: Arc<Authority>,
    user_limits: Arc<UserLimits>,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let source = running.source.clone()?;
    let paths = vec![source.path.clone()];
    let reloader = Reloader {
        resources: running.resources.iter().map(Resource::from).collect(),
        in_use: Mutex::new(running),
        source,
        authority,
        user_limits,
        metrics,
    };
    let seen = baseline(&paths);
    Some(spawn_reloader_on_hangup(
        paths,
        seen,
        true,
        shutdown,
        move || reloader.reload(),
    ))
}

struct Reloader {
    source: ConfigSource,
    /// The configuration in use: as started, with what applied live since.
    in_use: Mutex<Config>,
    resources: Vec<Resource>,
    authority: Arc<Authority>,
    user_limits: Arc<UserLimits>,
    metrics: Metrics,
}

impl Reloader {
    fn reload(&self) {
        let metrics = &self.metrics.security;
        let read = match self.source.load() {
            Ok(read) => read,
            Err(e) => {
                warn!(
                    path = %self.source.path.display(),
                    error = %e,
                    "the configuration file changed but does not validate; keeping the one in use"
                );
                metrics.config_reload(ReloadResult::invalid);
                return;
            }
        };
        let mut in_use = self.in_use.lock();
        let restart = needing_restart(&in_use, &read);
        if !restart.is_empty() {
            warn!(
                sections = ?restart,
                "the configuration file changed where only a restart applies; restart to use it"
            );
            metrics.config_reload(ReloadResult::restart_needed);
        }
        let mut next = in_use.clone();
        take_live(&mut next, &read);
        if next == *in_use {
            if restart.is_empty() {
                metrics.config_reload(ReloadResult::unchanged);
            }
            return;
        }
        let client_ca = self.authority.current().auth.client_ca().clone();
        let auth = match Auth::new(&next, &self.resources, client_ca, self.metrics.clone()) {
            Ok(auth) => auth,
            Err(e) => {
                warn!(
                    error = format!("{e:#}"),
                    "the configuration's auth cannot be used; keeping the one in use"
                );
                metrics.config_reload(ReloadResult::invalid);
                return;
            }
        };
        self.user_limits.reconfigure(&next.limits);
        let max_watchers = next.limits.max_watchers_per_user;
        // Counted before the open watches are judged again, so that a
        // watch this ends finds its cause already counted.
        info!("the configuration's auth, authorization and per-user limits changed; in use, open watches judged again");
        metrics.config_reload(ReloadResult::applied);
        self.authority.replace(auth, max_watchers);
        *in_use = next;
    }
}

/// What applies live, taken from `read` into `into`.
fn take_live(into: &mut Config, read: &Config) {
    into.auth = read.auth.clone();
    into.authorization = read.authorization.clone();
    into.limits.max_watchers_per_user = read.limits.max_watchers_per_user;
    into.limits.unary_per_user_per_second = read.limits.unary_per_user_per_second;
    into.limits.unary_burst_per_user = read.limits.unary_burst_per_user;
    into.limits.max_page_size = read.limits.max_page_size;
    into.limits.costly_reads_per_user_per_second = read.limits.costly_reads_per_user_per_second;
    into.limits.costly_read_burst_per_user = read.limits.costly_read_burst_per_user;
}

/// The sections of `read` that differ from `in_use` where only a restart
/// applies.
fn needing_restart(in_use: &Config, read: &Config) -> Vec<&'static str> {
    let mut live = read.clone();
    take_live(&mut live, in_use);
    let (a, b) = (in_use, &live);
    [
        ("etcd", a.etcd == b.etcd),
        ("upstream", a.upstream == b.upstream),
        ("upstream_tls", a.upstream_tls == b.upstream_tls),
        (
            "upstream_token_file",
            a.upstream_token_file == b.upstream_token_file
                && a.allow_plaintext_upstream_token == b.allow_plaintext_upstream_token,
        ),
        ("listen", a.listen == b.listen),
        ("metrics_listen", a.metrics_listen == b.metrics_listen),
        ("health_listen", a.health_listen == b.health_listen),
        ("tls", a.tls == b.tls),
        (
            "continue_token_key_file",
            a.continue_token_key_file == b.continue_token_key_file,
        ),
        ("watch", a.watch == b.watch),
        ("limits", a.limits == b.limits),
        ("etcd_api", a.etcd_api == b.etcd_api),
        ("shutdown_grace", a.shutdown_grace == b.shutdown_grace),
        ("resources", a.resources == b.resources),
    ]
    .into_iter()
    .filter_map(|(section, same)| (!same).then_some(section))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
etcd: {endpoints: [http://127.0.0.1:2379]}
resources: [{name: pods, prefix: /registry/pods}]
";

    #[test]
    fn only_sections_outside_auth_and_the_user_limits_need_a_restart() {
        let a = Config::from_yaml(BASE).unwrap();
        let mut b = a.clone();
        b.auth.anonymous = Some(false);
        b.limits.max_watchers_per_user = Some(3);
        assert!(needing_restart(&a, &b).is_empty());
        b.limits.max_watchers = 7;
        b.watch.watcher_queue += 1;
        assert_eq!(needing_restart(&a, &b), ["watch", "limits"]);
        let mut live = a.clone();
        take_live(&mut live, &b);
        assert_eq!(live.auth.anonymous, Some(false));
        assert_eq!(live.limits.max_watchers_per_user, Some(3));
        assert_eq!(live.limits.max_watchers, a.limits.max_watchers);
    }
}
