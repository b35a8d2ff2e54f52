//! etcd's true history under a prefix, recorded by a watch of the
//! checker's own, straight on etcd.

use std::collections::BTreeMap;

use anyhow::Context;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One key's change: its new value, or None for a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub revision: u64,
    pub key: String,
    pub value: Option<Vec<u8>>,
}

/// The keys and values under the prefix at `start`, and every change after.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub start: u64,
    pub initial: BTreeMap<String, Vec<u8>>,
    /// The mod revision of each key in `initial`.
    pub initial_versions: BTreeMap<String, u64>,
    pub changes: Vec<Change>,
}

pub type State = BTreeMap<String, Vec<u8>>;

impl History {
    /// The revision of the last change recorded.
    pub fn head(&self) -> u64 {
        self.changes.last().map_or(self.start, |c| c.revision)
    }

    /// The keys and values at `revision` (at least `start`).
    pub fn state_at(&self, revision: u64) -> State {
        let mut state = self.initial.clone();
        for c in self.changes_after(self.start) {
            if c.revision > revision {
                break;
            }
            apply(&mut state, c);
        }
        state
    }

    /// The mod revision of `key` at `revision` (at least `start`); none
    /// when it is not there.
    pub fn version_at(&self, key: &str, revision: u64) -> Option<u64> {
        let upto = self.changes.partition_point(|c| c.revision <= revision);
        match self.changes[..upto].iter().rev().find(|c| c.key == key) {
            Some(c) => c.value.as_ref().map(|_| c.revision),
            None => self.initial_versions.get(key).copied(),
        }
    }

    /// The changes after `revision`, in order.
    pub fn changes_after(&self, revision: u64) -> &[Change] {
        let first = self.changes.partition_point(|c| c.revision <= revision);
        &self.changes[first..]
    }
}

pub fn apply(state: &mut State, c: &Change) {
    match &c.value {
        Some(v) => state.insert(c.key.clone(), v.clone()),
        None => state.remove(&c.key),
    };
}

/// Records the history under `prefix` until `stop`; the receiver sees it
/// grow.
pub async fn record(
    client: &mut Client,
    prefix: &str,
    stop: CancellationToken,
) -> anyhow::Result<watch::Receiver<History>> {
    let listed = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .context("reading the prefix from etcd")?;
    let start = listed.header().context("a header")?.revision() as u64;
    let key = |kv: &etcd_client::KeyValue| String::from_utf8_lossy(kv.key()).into_owned();
    let initial = (listed.kvs().iter())
        .map(|kv| (key(kv), kv.value().to_vec()))
        .collect();
    let initial_versions = (listed.kvs().iter())
        .map(|kv| (key(kv), kv.mod_revision() as u64))
        .collect();
    let (tx, rx) = watch::channel(History {
        start,
        initial,
        initial_versions,
        changes: Vec::new(),
    });
    let mut client = client.clone();
    let prefix = prefix.to_owned();
    tokio::spawn(async move {
        // Each watch starts after the last change recorded: a watch that
        // breaks (etcd restarted) is opened again without a gap.
        loop {
            let from = tx.borrow().head() + 1;
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from as i64)
                .with_progress_notify();
            let opened = tokio::select! {
                _ = stop.cancelled() => return,
                w = client.watch(prefix.as_str(), Some(options)) => w,
            };
            if let Ok(mut stream) = opened {
                loop {
                    let message = tokio::select! {
                        _ = stop.cancelled() => return,
                        m = stream.message() => m,
                    };
                    let Ok(Some(response)) = message else { break };
                    if response.canceled() {
                        eprintln!(
                            "the checker's own etcd watch was cancelled: {}",
                            response.cancel_reason()
                        );
                        return;
                    }
                    let changes: Vec<Change> = response
                        .events()
                        .iter()
                        .filter_map(|e| {
                            let kv = e.kv()?;
                            Some(Change {
                                revision: kv.mod_revision() as u64,
                                key: String::from_utf8_lossy(kv.key()).into_owned(),
                                value: match e.event_type() {
                                    EventType::Put => Some(kv.value().to_vec()),
                                    EventType::Delete => None,
                                },
                            })
                        })
                        .collect();
                    if !changes.is_empty() {
                        tx.send_modify(|h| h.changes.extend(changes));
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            }
        }
    });
    Ok(rx)
}
