//! etcd's Watch: one stream of requests that create and cancel watches,
//! each a watcher of the resource its key range lies in, registered and
//! served as a `watchproxy.v1` watch is; only the messages are etcd's.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{FutureExt, Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamMap;
use tonic::{Request, Response, Status, Streaming};

use super::super::auth::{Grant, Identity};
use super::super::error::{etcd_status, ApiError};
use super::super::query::{scoped, WatchQuery};
use super::super::watch::{Mark, Shown};
use super::super::{peer_certs, Api, WatchStream};
use super::keys::{current, KeyRange};
use super::wire::{event, header};
use crate::config::Verb;
use crate::dispatch::Inbox;
use crate::etcdpb::etcdserverpb::watch_create_request::FilterType;
use crate::etcdpb::etcdserverpb::watch_request::RequestUnion;
use crate::etcdpb::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use crate::etcdpb::mvccpb;
use crate::object::{EventType, RequestedVersion, Revision};

/// The watch id of a response that belongs to no one watch (a progress
/// answer, a refused creation), as etcd sends it.
const NO_WATCH: i64 = -1;

/// Changes taken from the watches at once before they are sent, so one
/// busy watch does not hold up the requests of the stream.
const BATCH: usize = 256;

/// The responses of an etcd Watch stream.
pub type WatchResponses = ReceiverStream<Result<WatchResponse, Status>>;

impl Api {
    /// etcd's Watch: the caller identified once, each watch it creates
    /// authorized, limited and registered on its own.
    pub async fn etcd_watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
        max_message: usize,
    ) -> Result<Response<WatchResponses>, Status> {
        let certs = peer_certs(&request);
        let (metadata, extensions, requests) = request.into_parts();
        let judged = self.auth.current();
        let identity =
            (self.caller(&judged, &metadata, &certs, &extensions)).map_err(etcd_status)?;
        let (tx, rx) = mpsc::channel(4);
        let session = Session {
            api: self.clone(),
            identity,
            open: HashMap::new(),
            streams: StreamMap::new(),
            next_id: 0,
            max_message,
        };
        // Owned by the call: it ends when the client goes (the response
        // stream is dropped), when it must end the stream, or at shutdown.
        tokio::spawn(session.run(requests, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What a watch of the stream asked for.
struct Opened {
    range: KeyRange,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    resource: String,
}

/// A watch's stream of what it shows.
struct Shows(WatchStream);

impl Stream for Shows {
    type Item = Result<Shown, ApiError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().0.poll_shown(cx)
    }
}

struct Session {
    api: Api,
    identity: Identity,
    open: HashMap<i64, Opened>,
    streams: StreamMap<i64, Shows>,
    /// Where the search for a free id starts, as etcd assigns them.
    next_id: i64,
    max_message: usize,
}

type Sent = Result<WatchResponse, Status>;

impl Session {
    async fn run(mut self, mut requests: Streaming<WatchRequest>, tx: mpsc::Sender<Sent>) {
        let mut reading = true;
        let end = loop {
            let mut batch = Batch::default();
            tokio::select! {
                biased;
                () = tx.closed() => break None,
                () = self.api.shutdown.cancelled() => {
                    break Some(etcd_status(ApiError::ShuttingDown { last: None }))
                }
                request = requests.message(), if reading => match request {
                    Ok(Some(request)) => {
                        if let Err(status) = self.on_request(request, &mut batch).await {
                            break Some(status);
                        }
                    }
                    // etcd goes on sending after its client's half-close.
                    Ok(None) => reading = false,
                    Err(_) => break None,
                },
                Some((id, shown)) = self.streams.next(), if !self.streams.is_empty() => {
                    if let Err(status) = self.take(id, shown, &mut batch) {
                        break Some(status);
                    }
                    if let Err(status) = self.take_ready(&mut batch, BATCH) {
                        break Some(status);
                    }
                }
            }
            for response in batch.into_responses(&self.open, self.max_message) {
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        };
        if let Some(status) = end {
            let _ = tx.send(Err(status)).await;
        }
    }

    async fn on_request(&mut self, r: WatchRequest, batch: &mut Batch) -> Result<(), Status> {
        match r.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c, batch).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if let Some(opened) = self.open.remove(&c.watch_id) {
                    self.streams.remove(&c.watch_id);
                    batch.push(WatchResponse {
                        header: header(self.revision_of(&opened.resource)),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    });
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => self.progress(batch).await?,
            None => {}
        }
        Ok(())
    }

    fn revision_of(&self, resource: &str) -> Revision {
        self.api.resources.get(resource).map_or(0, current)
    }

    /// Creates a watch as etcd does: `created` with its id, then its
    /// changes; one it may not have is created and canceled at once with
    /// the reason, one older than the window with the oldest revision a
    /// watch can start from.
    async fn create(&mut self, c: WatchCreateRequest, batch: &mut Batch) {
        let id = match c.watch_id {
            0 => {
                while self.open.contains_key(&self.next_id) {
                    self.next_id += 1;
                }
                self.next_id
            }
            id if self.open.contains_key(&id) => {
                let why = "mvcc: duplicate watch ID provided on the WatchStream";
                batch.push(refused(why.into()));
                return;
            }
            id => id,
        };
        let range = KeyRange::watched(&c.key, &c.range_end);
        match self.start(&c, &range).await {
            Ok((stream, resource)) => {
                batch.push(WatchResponse {
                    header: header(self.revision_of(&resource)),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                });
                let filters = |f: FilterType| c.filters.contains(&(f as i32));
                self.open.insert(
                    id,
                    Opened {
                        range,
                        no_put: filters(FilterType::Noput),
                        no_delete: filters(FilterType::Nodelete),
                        prev_kv: c.prev_kv,
                        progress_notify: c.progress_notify,
                        fragment: c.fragment,
                        resource,
                    },
                );
                self.streams.insert(id, Shows(stream));
            }
            Err(ApiError::TooOld {
                oldest, current, ..
            }) => {
                batch.push(WatchResponse {
                    header: header(current),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                });
                batch.push(compacted(id, current, oldest + 1));
            }
            Err(e) => batch.push(refused(etcd_status(e).message().to_owned())),
        }
    }

    /// The watch `c` asks for, registered as the caller may have it.
    async fn start(
        &self,
        c: &WatchCreateRequest,
        range: &KeyRange,
    ) -> Result<(WatchStream, String), ApiError> {
        let api = &self.api;
        let judged = api.auth.current();
        let place = api.locate(range)?;
        let name = place.served.cache.resource.name.clone();
        let limit = api.user_limits.watch(&self.identity.caller)?;
        let (s, scope) = (api.admit(
            &judged,
            &self.identity,
            Verb::Watch,
            &name,
            &place.namespace,
        ))?;
        let predicate = scoped(&s.cache.resource, &place.namespace, "", "", "", &scope)?;
        let after = match c.start_revision {
            n if n > 0 => n as Revision - 1,
            // From now: after etcd's revision at the time of the call.
            _ => api.cache_for(s, RequestedVersion::Latest).await?.revision,
        };
        let query = WatchQuery {
            predicate,
            projection: None,
            version: RequestedVersion::At(after),
            send_initial_events: false,
            batch_initial_events: false,
            allow_bookmarks: true,
            timeout: None,
        };
        let (resource, namespace) = (s.cache.resource.clone(), place.namespace.as_str());
        let grant = Grant::new(
            self.identity.clone(),
            Verb::Watch,
            resource,
            namespace,
            scope,
        );
        let held = api.auth.hold(grant, &judged);
        let stream = (api.start_watch(s, query, Inbox::solo(), (limit, held))).await?;
        Ok((stream, name))
    }

    /// Answers a progress request with the revision every watch of the
    /// stream is proven to have been shown all changes up to: etcd's
    /// revision at the time of the request, once each cache has caught up
    /// with it and what it holds for the watches is taken.
    async fn progress(&mut self, batch: &mut Batch) -> Result<(), Status> {
        let mut resources: HashSet<&str> =
            self.open.values().map(|o| o.resource.as_str()).collect();
        if resources.is_empty() {
            resources.extend(self.api.resources.keys().map(String::as_str).take(1));
        }
        let mut revision = Revision::MAX;
        for name in resources {
            let Some(s) = self.api.resources.get(name) else {
                continue;
            };
            match self.api.cache_for(s, RequestedVersion::Latest).await {
                Ok(snapshot) => revision = revision.min(snapshot.revision),
                // etcd leaves a request it cannot answer unanswered.
                Err(_) => return Ok(()),
            }
        }
        self.take_ready(batch, usize::MAX)?;
        if revision != Revision::MAX {
            batch.push(WatchResponse {
                header: header(revision),
                watch_id: NO_WATCH,
                ..Default::default()
            });
        }
        Ok(())
    }

    /// Takes what the watches have ready, at most `max` of it.
    fn take_ready(&mut self, batch: &mut Batch, max: usize) -> Result<(), Status> {
        for _ in 0..max {
            match self.streams.next().now_or_never() {
                Some(Some((id, shown))) => self.take(id, shown, batch)?,
                _ => break,
            }
        }
        Ok(())
    }

    /// What watch `id` showed, as etcd's client sees it; a failure that
    /// is not the watch's alone ends the stream with its status.
    fn take(
        &mut self,
        id: i64,
        shown: Result<Shown, ApiError>,
        batch: &mut Batch,
    ) -> Result<(), Status> {
        let Some(opened) = self.open.get(&id) else {
            return Ok(());
        };
        match shown {
            Ok(Shown::Change(view)) if view.resync_from.is_some() => {
                // etcd's history was lost and the cache listed again at
                // the view's revision: etcd's clients know this as a
                // compaction, and read again.
                self.close(id);
                batch.push(compacted(id, view.revision, view.revision + 1));
            }
            Ok(Shown::Change(view)) => {
                let put = view.kind != EventType::Deleted;
                let filtered = (put && opened.no_put) || (!put && opened.no_delete);
                if !filtered && opened.range.contains(view.object.key_bytes()) {
                    batch.event(id, view.revision, event(&view, opened.prev_kv));
                }
            }
            Ok(Shown::Bookmark(revision, Mark::Progress)) if opened.progress_notify => {
                batch.push(WatchResponse {
                    header: header(revision),
                    watch_id: id,
                    ..Default::default()
                });
            }
            Ok(Shown::Bookmark(..) | Shown::Initial(_)) => {}
            Err(ApiError::FellBehind {
                oldest, current, ..
            }) => {
                self.close(id);
                batch.push(compacted(id, current, oldest + 1));
            }
            Err(e) => return Err(etcd_status(e)),
        }
        Ok(())
    }

    fn close(&mut self, id: i64) {
        self.open.remove(&id);
        self.streams.remove(&id);
    }
}

/// A creation refused for `why`.
fn refused(why: String) -> WatchResponse {
    WatchResponse {
        watch_id: NO_WATCH,
        created: true,
        canceled: true,
        cancel_reason: why,
        ..Default::default()
    }
}

/// Watch `id` canceled because the changes it needs are gone: it may
/// start again from `compact_revision`, after reading the state again.
fn compacted(id: i64, current: Revision, compact_revision: Revision) -> WatchResponse {
    WatchResponse {
        header: header(current),
        watch_id: id,
        canceled: true,
        compact_revision: compact_revision as i64,
        ..Default::default()
    }
}

/// The responses one turn of the stream sends, in order: a watch's
/// changes taken together go in one response (split only between
/// revisions, or, for a watch that allows it, into fragments).
#[derive(Default)]
struct Batch {
    responses: Vec<WatchResponse>,
    /// Where each watch's changes are gathered, while nothing else for it
    /// has followed.
    gathering: HashMap<i64, usize>,
}

impl Batch {
    fn push(&mut self, response: WatchResponse) {
        self.gathering.remove(&response.watch_id);
        self.responses.push(response);
    }

    fn event(&mut self, id: i64, revision: Revision, event: mvccpb::Event) {
        let at = *self.gathering.entry(id).or_insert_with(|| {
            self.responses.push(WatchResponse {
                watch_id: id,
                ..Default::default()
            });
            self.responses.len() - 1
        });
        let response = &mut self.responses[at];
        response.header = header(revision);
        response.events.push(event);
    }

    fn into_responses(self, open: &HashMap<i64, Opened>, max: usize) -> Vec<WatchResponse> {
        let mut out = Vec::with_capacity(self.responses.len());
        for r in self.responses {
            if r.events.is_empty() || r.encoded_len() <= max {
                out.push(r);
                continue;
            }
            let fragment = open.get(&r.watch_id).is_some_and(|o| o.fragment);
            split(r, max, fragment, &mut out);
        }
        out
    }
}

/// `r` in responses of at most `max` bytes where it can be: cut between
/// revisions, and, with `fragment`, inside one too, each part but the last
/// of a cut revision marked `fragment` as etcd marks them.
fn split(r: WatchResponse, max: usize, fragment: bool, out: &mut Vec<WatchResponse>) {
    let part = |events: Vec<mvccpb::Event>, fragment: bool| WatchResponse {
        header: (events.last())
            .and_then(|e| e.kv.as_ref())
            .and_then(|kv| header(kv.mod_revision as Revision)),
        watch_id: r.watch_id,
        events,
        fragment,
        ..Default::default()
    };
    let revision = |e: &mvccpb::Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
    let mut current: Vec<mvccpb::Event> = Vec::new();
    let mut size = 0;
    let mut events = r.events.iter().peekable();
    while let Some(e) = events.next() {
        let len = e.encoded_len() + 8;
        let same_revision = current
            .last()
            .is_some_and(|last| revision(last) == revision(e));
        if size + len > max && !current.is_empty() && (fragment || !same_revision) {
            let cut_inside = same_revision;
            out.push(part(std::mem::take(&mut current), cut_inside));
            size = 0;
        }
        current.push(e.clone());
        size += len;
        if events.peek().is_none() {
            out.push(part(std::mem::take(&mut current), false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: key.as_bytes().to_vec().into(),
                mod_revision: revision,
                value: vec![b'v'; 100].into(),
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn parts(fragment: bool) -> Vec<(Vec<i64>, bool)> {
        let r = WatchResponse {
            watch_id: 3,
            events: vec![put("/a", 5), put("/b", 5), put("/c", 5), put("/d", 6)],
            ..Default::default()
        };
        let mut out = Vec::new();
        split(r, 250, fragment, &mut out);
        let revisions = |r: &WatchResponse| {
            r.events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect()
        };
        out.iter().map(|r| (revisions(r), r.fragment)).collect()
    }

    #[test]
    fn a_revision_is_cut_only_into_fragments_and_only_when_asked() {
        assert_eq!(parts(false), [(vec![5, 5, 5], false), (vec![6], false)]);
        assert_eq!(parts(true), [(vec![5, 5], true), (vec![5, 6], false)]);
    }

    #[test]
    fn a_watchs_changes_gather_until_something_else_for_it_follows() {
        let mut batch = Batch::default();
        batch.event(1, 5, put("/a", 5));
        batch.event(2, 5, put("/b", 5));
        batch.event(1, 6, put("/c", 6));
        batch.push(compacted(1, 6, 7));
        batch.event(1, 7, put("/d", 7));
        let sent = batch.into_responses(&HashMap::new(), usize::MAX);
        let shape: Vec<(i64, usize, bool)> = sent
            .iter()
            .map(|r| (r.watch_id, r.events.len(), r.canceled))
            .collect();
        assert_eq!(
            shape,
            [(1, 2, false), (2, 1, false), (1, 0, true), (1, 1, false)]
        );
        assert_eq!(sent[0].header.unwrap().revision, 6);
    }
}
