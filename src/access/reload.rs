//! Files read again when they change: TLS certificates and keys, token
//! files, the configuration file. They are replaced by rename
//! (cert-manager, projected volumes, ConfigMaps), so their contents are
//! compared rather than watched.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the files are read; a change is in use within this time.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Calls `reload` each time the contents of `paths` differ from the last
/// ones seen, until `shutdown`. A file that cannot be read counts as a
/// change (and `reload` reports it), once.
pub fn spawn_reloader(
    paths: Vec<PathBuf>,
    shutdown: CancellationToken,
    reload: impl Fn() + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    spawn_reloader_on_hangup(paths, false, shutdown, reload)
}

/// [`spawn_reloader`]; with `hangup`, SIGHUP calls `reload` too, whether
/// the files changed or not.
pub fn spawn_reloader_on_hangup(
    paths: Vec<PathBuf>,
    hangup: bool,
    shutdown: CancellationToken,
    reload: impl Fn() + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let read =
        move || -> Vec<Option<Vec<u8>>> { paths.iter().map(|p| std::fs::read(p).ok()).collect() };
    tokio::spawn(async move {
        let read = Arc::new(read);
        // What the caller loaded at start.
        let first = read.clone();
        let mut seen = tokio::task::spawn_blocking(move || first())
            .await
            .unwrap_or_default();
        let reload = Arc::new(reload);
        let mut hangups = Hangups::new(hangup);
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => false,
                () = hangups.next() => true,
            };
            let (read, reload) = (read.clone(), reload.clone());
            let before = std::mem::take(&mut seen);
            // File reads block: off the workers that serve calls.
            let looked = tokio::task::spawn_blocking(move || {
                let now = read();
                if forced || now != before {
                    reload();
                }
                now
            })
            .await;
            if let Ok(now) = looked {
                seen = now;
            }
        }
    })
}

/// SIGHUPs, where they are asked for and the platform has them.
struct Hangups(Option<tokio::signal::unix::Signal>);

impl Hangups {
    fn new(wanted: bool) -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self(wanted.then(|| signal(SignalKind::hangup()).ok()).flatten())
    }

    /// The next SIGHUP; never, without them.
    async fn next(&mut self) {
        if let Some(s) = &mut self.0 {
            if s.recv().await.is_some() {
                return;
            }
        }
        std::future::pending().await
    }
}
