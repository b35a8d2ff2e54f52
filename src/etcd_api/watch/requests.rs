//! The requests of an etcd Watch stream: creations, cancels and progress
//! requests, each answered as etcd answers it.

use std::collections::HashSet;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::Status;

use super::super::batch::{compacted, refused, NO_WATCH};
use super::super::keys::{current, KeyRange};
use super::super::merge::Watched;
use super::super::register::{fresh_revision, start};
use super::super::wire::header;
use super::shown::{Asked, Watch};
use super::EtcdStream;
use crate::api::error::{etcd_status, ApiError};
use crate::etcdpb::etcdserverpb::watch_create_request::FilterType;
use crate::etcdpb::etcdserverpb::watch_request::RequestUnion;
use crate::etcdpb::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use crate::object::Revision;

/// A watch of the stream, as its cancel and its responses need it.
pub(super) struct Opened {
    pub fragment: bool,
    /// The resources it reads.
    pub resources: Vec<String>,
}

/// A request being answered; the stream reads the next once it is.
pub(super) enum Pending {
    Create {
        id: i64,
        request: WatchCreateRequest,
        range: KeyRange,
        start: BoxFuture<'static, Result<(Watched, Vec<String>), ApiError>>,
    },
    /// The revision every watched cache is proven fresh at, if all are.
    Progress(BoxFuture<'static, Option<Revision>>),
}

impl EtcdStream {
    /// Answers what it can at once; a creation or a progress request is
    /// left pending.
    pub(super) fn on_request(&mut self, r: WatchRequest) {
        match r.request_union {
            Some(RequestUnion::CreateRequest(request)) => self.create(request),
            Some(RequestUnion::CancelRequest(c)) => {
                if let Some(opened) = self.open.remove(&c.watch_id) {
                    self.streams.remove(c.watch_id);
                    self.batch.push(WatchResponse {
                        header: header(self.revision_of(&opened.resources)),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    });
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                let mut names: HashSet<String> = (self.open.values())
                    .flat_map(|o| o.resources.iter().cloned())
                    .collect();
                if names.is_empty() {
                    names.extend(
                        self.api
                            .core
                            .all_served()
                            .take(1)
                            .map(|s| s.cache.resource.name.clone()),
                    );
                }
                let api = self.api.core.clone();
                self.pending = Some(Pending::Progress(Box::pin(fresh_revision(api, names))));
            }
            None => {}
        }
    }

    fn revision_of(&self, resources: &[String]) -> Revision {
        (resources.iter())
            .filter_map(|name| self.api.core.served(name).ok())
            .map(current)
            .max()
            .unwrap_or_default()
    }

    /// Starts creating a watch as etcd does: its id, the client's or the
    /// next free one; a duplicate is refused at once.
    fn create(&mut self, request: WatchCreateRequest) {
        let id = match request.watch_id {
            0 => {
                while self.open.contains_key(&self.next_id) {
                    self.next_id += 1;
                }
                self.next_id
            }
            id if self.open.contains_key(&id) => {
                let why = "mvcc: duplicate watch ID provided on the WatchStream";
                self.batch.push(refused(why.into()));
                return;
            }
            id => id,
        };
        let range = KeyRange::watched(&request.key, &request.range_end);
        let (api, identity) = (self.api.clone(), self.identity.clone());
        let home = self.inbox.clone().zip(self.place());
        let start = Box::pin(start(
            api,
            identity,
            request.start_revision,
            range.clone(),
            request.prev_kv,
            home,
        ));
        self.pending = Some(Pending::Create {
            id,
            request,
            range,
            start,
        });
    }

    pub(super) fn poll_pending(
        &mut self,
        pending: Pending,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Status>> {
        match pending {
            Pending::Create {
                id,
                request,
                range,
                mut start,
            } => match start.as_mut().poll(cx) {
                Poll::Ready(started) => {
                    self.created(id, request, range, started);
                    Poll::Ready(Ok(()))
                }
                Poll::Pending => {
                    self.pending = Some(Pending::Create {
                        id,
                        request,
                        range,
                        start,
                    });
                    Poll::Pending
                }
            },
            Pending::Progress(mut fresh) => match fresh.as_mut().poll(cx) {
                Poll::Ready(revision) => {
                    // Everything up to the revision the watches hold goes
                    // out first, what waits in the connection's inbox too.
                    if let Some(inbox) = &self.inbox {
                        inbox.sort_now();
                    }
                    let (_, waiting) = self.take_ready(cx, usize::MAX)?;
                    self.waiting = waiting;
                    // Merged watches vouch only for what they have shown.
                    let shown = (self.streams.values())
                        .filter_map(|w| w.feed.through())
                        .min();
                    let revision = match shown {
                        Some(shown) => revision.map(|r| r.min(shown)),
                        None => revision,
                    };
                    // etcd leaves a request it cannot answer unanswered.
                    if let Some(revision) = revision {
                        self.batch.push(WatchResponse {
                            header: header(revision),
                            watch_id: NO_WATCH,
                            ..Default::default()
                        });
                    }
                    Poll::Ready(Ok(()))
                }
                Poll::Pending => {
                    self.pending = Some(Pending::Progress(fresh));
                    Poll::Pending
                }
            },
        }
    }

    /// A watch created as etcd creates one: `created` with its id, then its
    /// changes; one it may not have is created and canceled at once with
    /// the reason, one older than the window with the oldest revision a
    /// watch can start from.
    fn created(
        &mut self,
        id: i64,
        c: WatchCreateRequest,
        range: KeyRange,
        started: Result<(Watched, Vec<String>), ApiError>,
    ) {
        match started {
            Ok((stream, resources)) => {
                self.batch.push(WatchResponse {
                    header: header(self.revision_of(&resources)),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                });
                let filters = |f: FilterType| c.filters.contains(&(f as i32));
                let whole = (resources.iter())
                    .filter_map(|name| self.api.core.served(name).ok())
                    .all(|s| range.covers(&s.cache.resource));
                let asked = Asked {
                    no_put: filters(FilterType::Noput),
                    no_delete: filters(FilterType::Nodelete),
                    prev_kv: c.prev_kv,
                    progress_notify: c.progress_notify,
                };
                let opened = Opened {
                    fragment: c.fragment,
                    resources,
                };
                let stream = Watch {
                    feed: stream,
                    range: (!whole).then_some(range),
                    asked,
                };
                self.open.insert(id, opened);
                self.streams.insert(id, stream);
                // Not asked yet.
                self.waiting = false;
            }
            Err(ApiError::TooOld {
                oldest, current, ..
            }) => {
                self.batch.push(WatchResponse {
                    header: header(current),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                });
                self.batch.push(compacted(id, current, oldest + 1));
            }
            Err(e) => self
                .batch
                .push(refused(etcd_status(e).message().to_owned())),
        }
    }
}
