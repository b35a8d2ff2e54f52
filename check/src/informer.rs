//! A client that behaves as an informer: List (or a watch with initial
//! events), then Watch from its version, resume from the last version
//! seen, list again on OUT_OF_RANGE. It records every answer for the
//! verifier and keeps the store an informer would.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use watchproxy::pb::{self, watch_proxy_client::WatchProxyClient};

use crate::history::State;
use crate::model::{Kind, Selection};

/// One answer on a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    Event {
        kind: Kind,
        key: String,
        /// The object's version.
        revision: u64,
        value: Vec<u8>,
        resync: bool,
        /// Where a client resumes from after it: the object's version, or
        /// in a resync the version its lost history starts from.
        resume: u64,
    },
    Bookmark {
        revision: u64,
        resync: bool,
        initial_end: bool,
    },
}

/// How a run of one watch stream began.
#[derive(Debug, Clone)]
pub enum Start {
    /// After a List at `revision` that returned `items`.
    Listed { revision: u64, items: State },
    /// A watch asking for its initial events.
    Initial,
    /// A watch resumed after `from`, the last version the client saw
    /// complete.
    Resumed { from: u64 },
}

#[derive(Debug, Clone)]
pub struct Segment {
    pub start: Start,
    pub received: Vec<Received>,
    /// How the stream ended, if it did.
    pub ended: Option<String>,
}

/// How an informer reads its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manner {
    Prompt,
    /// 10 ms per message: falls behind under load.
    Slow,
    /// Stops reading for 3 s after every 200 messages.
    Stalling,
    /// Drops its stream after 20 to 60 messages, and resumes.
    Vanishing,
}

/// Everything one informer saw, and the store it built.
#[derive(Debug, Clone)]
pub struct Transcript {
    pub id: usize,
    pub selection: Selection,
    /// The bearer token it calls with, if any.
    pub token: Option<String>,
    pub manner: Manner,
    pub bookmarks: bool,
    pub initial_events: bool,
    pub segments: Vec<Segment>,
    pub store: State,
    /// The last version seen.
    pub version: u64,
    /// The last version all of whose events it has: where it resumes
    /// from. A revision can carry several events (a transaction); a stream
    /// that breaks between them resumes before that revision, or the rest
    /// would be lost.
    pub complete: u64,
    /// Lists made, and initial events received whole.
    pub relists: u64,
}

pub type Shared = Arc<Mutex<Transcript>>;

/// Runs the informer until `stop`. With several replicas it starts on one
/// and moves to the next each time a stream ends, resuming there with the
/// version it had.
pub async fn run(
    mut replicas: Vec<WatchProxyClient<Channel>>,
    resource: String,
    shared: Shared,
    stop: CancellationToken,
) {
    let (selection, bookmarks, initial_events, manner, token) = {
        let t = shared.lock().await;
        (
            t.selection.clone(),
            t.bookmarks,
            t.initial_events,
            t.manner,
            t.token.clone(),
        )
    };
    let request = |version: String, initial: bool| pb::WatchRequest {
        resource: resource.clone(),
        namespace: selection.namespace.clone().unwrap_or_default(),
        name: selection.name.clone().unwrap_or_default(),
        label_selector: selection.label_selector(),
        field_selector: selection.field_selector(),
        resource_version: version,
        allow_bookmarks: bookmarks,
        send_initial_events: initial,
        timeout_seconds: 0,
        ..Default::default()
    };
    let mut resume: Option<u64> = None;
    let mut at = shared.lock().await.id % replicas.len();
    while !stop.is_cancelled() {
        let client = &mut replicas[at];
        let (req, start) = match resume {
            Some(from) => (request(from.to_string(), false), Start::Resumed { from }),
            None if initial_events => (request(String::new(), true), Start::Initial),
            None => match list(client, &resource, &selection, token.as_deref()).await {
                Ok((revision, items)) => {
                    let mut t = shared.lock().await;
                    t.store = items.clone();
                    t.version = revision;
                    t.complete = revision;
                    t.relists += 1;
                    (
                        request(revision.to_string(), false),
                        Start::Listed { revision, items },
                    )
                }
                Err(status) => {
                    pause(&stop, &status).await;
                    continue;
                }
            },
        };
        let initial = matches!(start, Start::Initial);
        {
            let mut t = shared.lock().await;
            if initial {
                t.store.clear();
            }
            t.segments.push(Segment {
                start,
                received: Vec::new(),
                ended: None,
            });
        }
        let ended = follow(
            client,
            as_caller(req, token.as_deref()),
            &shared,
            &stop,
            manner,
        )
        .await;
        at = (at + 1) % replicas.len();
        let mut t = shared.lock().await;
        resume = match &ended {
            Some(status) if status.code() == tonic::Code::OutOfRange => None,
            // A watch for its initial events that ended before they did
            // starts over.
            _ if initial && t.segments.last().is_some_and(|s| !initial_done(s)) => None,
            _ => Some(t.complete),
        };
        if let Some(segment) = t.segments.last_mut() {
            segment.ended = Some(match &ended {
                Some(status) => format!("{:?}: {}", status.code(), status.message()),
                None => "stopped".into(),
            });
        }
        drop(t);
        if let Some(status) = ended {
            pause(&stop, &status).await;
        }
    }
}

fn initial_done(s: &Segment) -> bool {
    s.received.iter().any(|r| {
        matches!(
            r,
            Received::Bookmark {
                initial_end: true,
                ..
            }
        )
    })
}

/// A short pause before trying again, as an informer's backoff.
async fn pause(stop: &CancellationToken, status: &tonic::Status) {
    let wait = match status.code() {
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted => Duration::from_millis(300),
        _ => Duration::from_millis(100),
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(wait) => {}
    }
}

/// `message` with the caller's bearer token.
fn as_caller<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("a token is ASCII");
        req.metadata_mut().insert("authorization", value);
    }
    req
}

/// A paged, consistent List.
pub async fn list(
    client: &mut WatchProxyClient<Channel>,
    resource: &str,
    selection: &Selection,
    caller: Option<&str>,
) -> Result<(u64, State), tonic::Status> {
    let mut items = State::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(as_caller(
                pb::ListRequest {
                    resource: resource.into(),
                    namespace: selection.namespace.clone().unwrap_or_default(),
                    label_selector: selection.label_selector(),
                    field_selector: name_and_node(selection),
                    limit: 25,
                    continue_token: token,
                    ..Default::default()
                },
                caller,
            ))
            .await?
            .into_inner();
        items.extend(page.items.into_iter().map(|o| (o.key, o.value.to_vec())));
        if page.continue_token.is_empty() {
            let revision = page
                .resource_version
                .parse()
                .map_err(|_| tonic::Status::internal("a list without a version"))?;
            return Ok((revision, items));
        }
        token = page.continue_token;
    }
}

/// A List has no name field: one object is `metadata.name` in the field
/// selector.
fn name_and_node(selection: &Selection) -> String {
    let mut parts = Vec::new();
    if let Some(name) = &selection.name {
        parts.push(format!("metadata.name={name}"));
    }
    let node = selection.field_selector();
    if !node.is_empty() {
        parts.push(node);
    }
    parts.join(",")
}

/// Follows one watch stream, recording it, until it ends (its status; None
/// when stopped or ended cleanly).
async fn follow(
    client: &mut WatchProxyClient<Channel>,
    req: tonic::Request<pb::WatchRequest>,
    shared: &Shared,
    stop: &CancellationToken,
    manner: Manner,
) -> Option<tonic::Status> {
    let mut stream = match client.watch(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => return Some(status),
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
            Manner::Vanishing if read > vanish_after => return None,
            Manner::Vanishing => None,
        };
        if let Some(pause) = pause {
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        let message = tokio::select! {
            _ = stop.cancelled() => return None,
            m = stream.message() => m,
        };
        let event = match message {
            Ok(Some(e)) => e,
            Ok(None) => return None,
            Err(status) => return Some(status),
        };
        let o = event.object.unwrap_or_default();
        let revision = o.resource_version.parse().unwrap_or(0);
        let resume = event.resume_resource_version.parse().unwrap_or(revision);
        let kind = match pb::EventType::try_from(event.r#type) {
            Ok(pb::EventType::Added) => Kind::Added,
            Ok(pb::EventType::Modified) => Kind::Modified,
            Ok(pb::EventType::Deleted) => Kind::Deleted,
            _ => {
                let mut t = shared.lock().await;
                t.version = resume;
                t.complete = resume;
                // Initial events count as a list once they are all in.
                if event.initial_events_end {
                    t.relists += 1;
                }
                if let Some(s) = t.segments.last_mut() {
                    s.received.push(Received::Bookmark {
                        revision,
                        resync: event.resync,
                        initial_end: event.initial_events_end,
                    });
                }
                continue;
            }
        };
        let mut t = shared.lock().await;
        match kind {
            Kind::Added | Kind::Modified => t.store.insert(o.key.clone(), o.value.to_vec()),
            Kind::Deleted => t.store.remove(&o.key),
        };
        // A later revision completes the one before; the initial events
        // complete nothing until their end.
        let initial = t
            .segments
            .last()
            .is_some_and(|s| matches!(s.start, Start::Initial) && !initial_done(s));
        if !initial && resume > t.version {
            t.complete = t.version;
        }
        t.version = resume;
        if let Some(s) = t.segments.last_mut() {
            s.received.push(Received::Event {
                kind,
                key: o.key,
                revision,
                value: o.value.to_vec(),
                resync: event.resync,
                resume,
            });
        }
    }
}
