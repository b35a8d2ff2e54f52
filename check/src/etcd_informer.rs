//! An informer written against etcd's own API, as programs that watch etcd
//! are: a Range of its keys, then a Watch from the Range's revision with
//! the state before each change, resuming from the last revision it saw
//! whole, reading again when its watch is canceled for a compacted
//! revision. Its answers are recorded as the `watchproxy.v1` informer's
//! are, for the same verifier: a PUT of a key that did not exist is an
//! addition, a DELETE shows the state before it.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio_util::sync::CancellationToken;

use crate::history::State;
use crate::informer::{Manner, Received, Segment, Shared, Start};
use crate::model::{Kind, Selection};

/// How one watch stream ended.
enum Ended {
    Stopped,
    /// Canceled for a compacted revision: read again.
    Compacted,
    Failed(String),
}

/// Runs the informer until `stop`, moving to the next replica each time a
/// stream ends.
pub async fn run(urls: Vec<String>, prefix: String, shared: Shared, stop: CancellationToken) {
    let (selection, manner, id) = {
        let t = shared.lock().await;
        (t.selection.clone(), t.manner, t.id)
    };
    let (start_key, end_key) = key_range(&prefix, &selection);
    let mut resume: Option<u64> = None;
    let mut at = id % urls.len();
    while !stop.is_cancelled() {
        let url = urls[at].clone();
        at = (at + 1) % urls.len();
        let mut client = match Client::connect([url], None).await {
            Ok(c) => c,
            Err(_) => {
                pause(&stop).await;
                continue;
            }
        };
        let (from, start) = match resume {
            Some(from) => (from, Start::Resumed { from }),
            None => match range(&mut client, &start_key, &end_key).await {
                Ok((revision, items)) => {
                    let mut t = shared.lock().await;
                    t.store = items.clone();
                    (t.version, t.complete) = (revision, revision);
                    t.relists += 1;
                    (revision, Start::Listed { revision, items })
                }
                Err(_) => {
                    pause(&stop).await;
                    continue;
                }
            },
        };
        shared.lock().await.segments.push(Segment {
            start,
            received: Vec::new(),
            ended: None,
        });
        let options = WatchOptions::new()
            .with_range(end_key.clone())
            .with_start_revision(from as i64 + 1)
            .with_prev_key()
            .with_progress_notify();
        let ended = follow(&mut client, &start_key, options, &shared, &stop, manner).await;
        let mut t = shared.lock().await;
        resume = match ended {
            Ended::Compacted => None,
            _ => Some(t.complete),
        };
        if let Some(segment) = t.segments.last_mut() {
            segment.ended = Some(match &ended {
                Ended::Stopped => "stopped".into(),
                Ended::Compacted => "canceled: compacted".into(),
                Ended::Failed(why) => why.clone(),
            });
        }
        drop(t);
        if !matches!(ended, Ended::Stopped) {
            pause(&stop).await;
        }
    }
}

/// The key range of what the informer asks for: one key, a namespace's
/// keys, or all of the prefix's.
fn key_range(prefix: &str, selection: &Selection) -> (String, String) {
    match (&selection.namespace, &selection.name) {
        (Some(ns), Some(name)) => (format!("{prefix}/{ns}/{name}"), String::new()),
        (Some(ns), None) => {
            let start = format!("{prefix}/{ns}/");
            let end = format!("{prefix}/{ns}0");
            (start, end)
        }
        _ => (format!("{prefix}/"), format!("{prefix}0")),
    }
}

/// A linearizable Range of the informer's keys: its revision and pairs.
async fn range(client: &mut Client, start: &str, end: &str) -> Result<(u64, State), String> {
    let options = (!end.is_empty()).then(|| GetOptions::new().with_range(end));
    let got = client
        .get(start, options)
        .await
        .map_err(|e| e.to_string())?;
    let revision = got.header().map_or(0, |h| h.revision()) as u64;
    let items = got
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
            )
        })
        .collect();
    Ok((revision, items))
}

async fn pause(stop: &CancellationToken) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
}

/// Follows one watch stream, recording it, until it ends.
async fn follow(
    client: &mut Client,
    key: &str,
    options: WatchOptions,
    shared: &Shared,
    stop: &CancellationToken,
    manner: Manner,
) -> Ended {
    let mut stream = match client.watch(key, Some(options)).await {
        Ok(s) => s,
        Err(e) => return Ended::Failed(e.to_string()),
    };
    let vanish_after = rand::random_range(20..60);
    let mut read = 0u64;
    loop {
        read += 1;
        let pause = match manner {
            Manner::Prompt => None,
            Manner::Slow => Some(Duration::from_millis(10)),
            Manner::Stalling if read.is_multiple_of(200) => Some(Duration::from_secs(3)),
            Manner::Stalling => None,
            Manner::Vanishing if read > vanish_after => return Ended::Stopped,
            Manner::Vanishing => None,
        };
        if let Some(pause) = pause {
            tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        let message = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            m = stream.message() => m,
        };
        let response = match message {
            Ok(Some(r)) => r,
            Ok(None) => return Ended::Failed("end of stream".into()),
            Err(e) => return Ended::Failed(e.to_string()),
        };
        if response.canceled() {
            return match response.compact_revision() {
                0 => Ended::Failed(format!("canceled: {}", response.cancel_reason())),
                _ => Ended::Compacted,
            };
        }
        let mut t = shared.lock().await;
        if response.events().is_empty() && !response.created() {
            // A progress notification: every event up to it was sent.
            let revision = response.header().map_or(0, |h| h.revision()) as u64;
            if revision > t.version {
                (t.version, t.complete) = (revision, revision);
            }
            if let Some(s) = t.segments.last_mut() {
                s.received.push(Received::Bookmark {
                    revision,
                    resync: false,
                    initial_end: false,
                });
            }
            continue;
        }
        // etcd sends a revision's events in one response: each response
        // ends with a revision seen whole.
        for e in response.events() {
            let Some(kv) = e.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let revision = kv.mod_revision() as u64;
            let (kind, value) = match e.event_type() {
                EventType::Put if kv.version() == 1 => (Kind::Added, kv.value().to_vec()),
                EventType::Put => (Kind::Modified, kv.value().to_vec()),
                EventType::Delete => {
                    let prev = e.prev_kv().map(|p| p.value().to_vec()).unwrap_or_default();
                    (Kind::Deleted, prev)
                }
            };
            match kind {
                Kind::Deleted => t.store.remove(&key),
                _ => t.store.insert(key.clone(), value.clone()),
            };
            if let Some(s) = t.segments.last_mut() {
                s.received.push(Received::Event {
                    kind,
                    key,
                    revision,
                    value,
                    resync: false,
                    resume: revision,
                });
            }
            t.version = revision;
        }
        t.complete = t.version;
    }
}
