//! Files read again when they change: TLS certificates and keys, token
//! files. They are replaced by rename (cert-manager, projected volumes), so
//! their contents are compared rather than watched.

use std::path::PathBuf;
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
    let read =
        move || -> Vec<Option<Vec<u8>>> { paths.iter().map(|p| std::fs::read(p).ok()).collect() };
    tokio::spawn(async move {
        let read = std::sync::Arc::new(read);
        // What the caller loaded at start.
        let first = read.clone();
        let mut seen = tokio::task::spawn_blocking(move || first())
            .await
            .unwrap_or_default();
        let reload = std::sync::Arc::new(reload);
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (read, reload) = (read.clone(), reload.clone());
            let before = std::mem::take(&mut seen);
            // File reads block: off the workers that serve calls.
            let looked = tokio::task::spawn_blocking(move || {
                let now = read();
                if now != before {
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
