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

/// What a reloader's files held when the credentials they hold were read.
pub struct Baseline(Vec<Option<Vec<u8>>>);

/// What `paths` hold now. Read before the credentials in them are, so
/// that a reloader started from it misses no change made in between (one
/// is then loaded again, at worst).
pub fn baseline(paths: &[PathBuf]) -> Baseline {
    Baseline(read_all(paths))
}

fn read_all(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

/// Calls `reload` each time the contents of `paths` differ from the last
/// ones seen (first: `seen`), until `shutdown`. A file that cannot be
/// read counts as a change (and `reload` reports it), once.
pub fn spawn_reloader(
    paths: Vec<PathBuf>,
    seen: Baseline,
    shutdown: CancellationToken,
    reload: impl Fn() + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    spawn_reloader_on_hangup(paths, seen, false, shutdown, reload)
}

/// [`spawn_reloader`]; with `hangup`, SIGHUP calls `reload` too, whether
/// the files changed or not.
pub fn spawn_reloader_on_hangup(
    paths: Vec<PathBuf>,
    Baseline(mut seen): Baseline,
    hangup: bool,
    shutdown: CancellationToken,
    reload: impl Fn() + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let read = Arc::new(move || read_all(&paths));
    tokio::spawn(async move {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_change_made_between_the_baseline_and_the_start_is_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        std::fs::write(&path, "before").unwrap();
        let seen = baseline(std::slice::from_ref(&path));
        // Changed after the credentials were read, before the reloader runs.
        std::fs::write(&path, "after").unwrap();
        let reloads = Arc::new(AtomicUsize::new(0));
        let counted = reloads.clone();
        let shutdown = CancellationToken::new();
        let task = spawn_reloader(vec![path], seen, shutdown.clone(), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        for _ in 0..50 {
            if reloads.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(reloads.load(Ordering::SeqCst), 1);
    }
}
