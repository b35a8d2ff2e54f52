//! Watch: a watcher registered at the version asked for, and the stream
//! that shows its initial state, then its changes, until it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Poll};

use futures::Stream;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use super::compression::Codec;
use super::error::ApiError;
use super::initial::InitialCursor;
use super::query::WatchQuery;
use super::wire::{encode_bookmark, Packed, WatchMessage};
use super::{Api, Served};
use crate::access::limits::WatchPlace;
use crate::access::{GrantEpoch, HeldGrant, Lapse, Revoke};
use crate::cache::{WatchCache, WatchFrom};
use crate::dispatch::{Inbox, Next, Place, Position, View, Wants, Watcher};
use crate::object::{RequestedVersion, Revision, TooOld};
use crate::telemetry::{EndReason, ResourceMetrics};

impl Api {
    /// Starts a watch whose deliveries wait in `inbox`.
    pub async fn start_watch(
        &self,
        s: &Served,
        q: WatchQuery,
        inbox: Arc<Inbox>,
        (place, grant): (WatchPlace, HeldGrant),
    ) -> Result<WatchStream, ApiError> {
        if self.shutdown.is_cancelled() {
            return Err(ApiError::ShuttingDown { last: None });
        }
        let resource = &s.cache.resource;
        let slots = (
            place,
            self.watch_slots.clone().try_acquire_owned().map_err(|_| {
                ApiError::TooManyWatchers {
                    scope: "in total".into(),
                }
            })?,
            s.watch_slots
                .clone()
                .try_acquire_owned()
                .map_err(|_| ApiError::TooManyWatchers {
                    scope: format!("for {}", resource.name),
                })?,
        );
        let wants = Wants {
            predicate: q.predicate,
            projection: q.projection,
        };
        let too_old = |requested: Revision| {
            move |too_old: TooOld| ApiError::TooOld {
                requested,
                oldest: too_old.oldest,
                current: s.cache.progress().revision,
            }
        };
        let (watcher, initial) = match q.version {
            RequestedVersion::At(n) if !q.send_initial_events => {
                self.cache_for(s, q.version).await?;
                let from = WatchFrom::Revision(n);
                let start = (s.cache)
                    .watch(&inbox, wants, from, q.allow_bookmarks)
                    .map_err(too_old(n))?;
                (start.watcher, None)
            }
            v => {
                let fresh = self.cache_for(s, v).await?;
                // The state may be older than the cache's, never older
                // than the request allows.
                let need = match v {
                    RequestedVersion::Any => 0,
                    RequestedVersion::At(n) => n,
                    RequestedVersion::Latest => fresh.revision,
                };
                let (watcher, state) = s
                    .initial_states
                    .join(
                        &s.cache,
                        &inbox,
                        wants,
                        need,
                        q.batch_initial_events,
                        q.allow_bookmarks,
                    )
                    .map_err(too_old(s.cache.progress().revision))?;
                (watcher, Some(state))
            }
        };
        // The end of the initial state is marked only when it was sent.
        let initial_end = (initial.as_ref())
            .filter(|_| q.send_initial_events)
            .map(|state| state.revision());
        grant.grant().on_revoke(watcher.alarm());
        Ok(WatchStream {
            _slots: slots,
            grant,
            cache: s.cache.clone(),
            watcher,
            initial: initial.map(InitialCursor::new),
            codec: None,
            initial_end,
            allow_bookmarks: q.allow_bookmarks,
            timer: q.timeout.map(|t| Box::pin(tokio::time::sleep(t))),
            end: EndCounter {
                metrics: s.metrics.clone(),
                reason: None,
            },
        })
    }
}

/// One client's watch, from its start to its end: the initial state (if
/// asked for), then changes, live from the queue or read from the window
/// while the watcher is behind, until the client leaves, the timeout
/// passes, the server shuts down or the watcher falls further behind than
/// the window reaches. Written by hand rather than with `async_stream`: it
/// is polled once per delivery, for every watcher.
pub struct WatchStream {
    /// HeldGrant while the watch is open: its places in the watcher limits.
    _slots: (WatchPlace, OwnedSemaphorePermit, OwnedSemaphorePermit),
    /// What it was allowed, while it still is.
    grant: HeldGrant,
    cache: Arc<WatchCache>,
    watcher: Watcher,
    /// The initial state still to send.
    initial: Option<InitialCursor>,
    /// What its connection compresses messages with.
    codec: Option<Codec>,
    /// The bookmark that marks the end of the initial state, still to send.
    initial_end: Option<Revision>,
    allow_bookmarks: bool,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    end: EndCounter,
}

/// A watch found steady (see [`WatchStream::steady`]): what its reader
/// needs to take its live changes without reading it.
#[derive(Clone, Copy)]
pub struct Steady {
    /// The count of ended grants then: any change since ends the steady.
    pub seen: u64,
    pub codec: Option<Codec>,
    /// Its watcher's position, which the reader moves past each change it
    /// takes and gives back with [`WatchStream::took_steady`].
    pub at: Position,
}

/// Counts how a watch ended when its stream is dropped; a stream dropped
/// without a recorded reason was abandoned by its client.
struct EndCounter {
    metrics: ResourceMetrics,
    reason: Option<EndReason>,
}

impl Drop for EndCounter {
    fn drop(&mut self) {
        self.metrics
            .watcher_ended(self.reason.unwrap_or(EndReason::client_gone));
    }
}

impl WatchStream {
    /// Where its deliveries wait in its inbox (see [`Inbox::collect`]).
    pub fn place(&self) -> Place {
        self.watcher.place()
    }

    /// Read by the stream at `place` of its inbox, which is named when
    /// this watch has something to read.
    pub fn report_as(&self, place: Place) {
        self.watcher.report_as(place);
    }

    /// Asks for a bookmark behind every change dispatched to it so far
    /// (see [`crate::dispatch::Watcher::bookmark_now`]).
    pub fn bookmark_now(&self) {
        self.watcher.bookmark_now();
    }

    /// Its messages will be sent compressed with `codec`: each shared one
    /// is compressed once for all the streams that send it.
    pub fn compress_with(&mut self, codec: Codec) {
        self.codec = Some(codec);
    }

    /// What its messages worth compressing are sent compressed with.
    pub fn codec(&self) -> Option<Codec> {
        self.codec
    }

    /// Ends the watch because its connection reached its maximum age: the
    /// status names the version to resume from, the last one all of whose
    /// events were sent; none while the initial events are unfinished.
    pub fn connection_aged(&mut self) -> Status {
        self.end.reason = Some(EndReason::connection_aged);
        ApiError::ConnectionAged {
            last: self.resume_from(),
        }
        .into()
    }

    /// Where a client that got everything sent so far resumes without a
    /// gap: none while the initial events are unfinished.
    fn resume_from(&self) -> Option<Revision> {
        let unfinished = self.initial.is_some() || self.initial_end.is_some();
        (!unfinished).then(|| self.watcher.settled_revision(&self.cache))
    }

    /// Ends the watch because its grant ended.
    fn revoked(&mut self, why: Revoke) -> ApiError {
        self.end.reason = Some(match why {
            Revoke::Credential(Lapse::Expired) => EndReason::credential_expired,
            Revoke::Credential(Lapse::Revoked) => EndReason::credential_revoked,
            Revoke::AccessChanged => EndReason::access_changed,
        });
        super::error::revoked(why, self.resume_from())
    }

    /// Whether what it showed last was the last it has until its inbox's
    /// reader collects the inbox again: a live change or bookmark that
    /// emptied its queue, with no initial state left and no end due.
    pub fn emptied(&self) -> bool {
        self.watcher.emptied()
            && self.end.reason.is_none()
            && self.initial.is_none()
            && self.initial_end.is_none()
    }

    /// Shows `view`, a live change its inbox's reader takes straight from
    /// the sort of its queue (see [`crate::dispatch::Inbox::collect_taking`]),
    /// when nothing is due before it (as for [`WatchStream::steady`]).
    /// False: the change goes through the queue.
    pub fn take_live(&mut self, view: &View) -> bool {
        let steady = self.is_steady();
        if steady {
            self.watcher.take_known_live(view);
        }
        steady
    }

    /// Whether nothing is due before its next live change: no initial
    /// state or end, no grant ended since it last looked, its watcher live
    /// rather than reading the window. It changes only when the watch is
    /// polled, or a grant ends.
    fn is_steady(&self) -> bool {
        self.end.reason.is_none()
            && self.initial.is_none()
            && self.initial_end.is_none()
            && !self.grant.may_have_ended()
            && self.watcher.is_live()
    }

    /// Set when nothing is due before its next live change (no initial
    /// state or end, no grant ended since it last looked, its watcher live
    /// rather than reading the window), with what its reader keeps to take
    /// live changes without reading the watch until it is next polled (an
    /// ended grant shows in the epoch), then gives back with
    /// [`WatchStream::took_steady`].
    pub fn steady(&self) -> Option<Steady> {
        self.is_steady().then(|| Steady {
            seen: self.grant.seen(),
            codec: self.codec,
            at: self.watcher.position(),
        })
    }

    /// The count of ended grants its [`Steady`] is judged against.
    pub fn grant_epoch(&self) -> GrantEpoch {
        self.grant.epoch()
    }

    /// The live changes its reader took by the [`Steady`] it kept since
    /// the watch was last polled (the epoch unchanged meanwhile) were
    /// shown: its watcher is at `steady.at`.
    pub fn took_steady(&mut self, steady: &Steady) {
        self.watcher.took_known_live(steady.at);
    }

    /// What the watch shows next, before it is encoded for a wire: the
    /// initial state, then changes and bookmarks (those the client allowed,
    /// and the one that ends the initial state) until it ends.
    pub fn poll_shown(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Shown, ApiError>>> {
        if self.end.reason.is_some() {
            return Poll::Ready(None);
        }
        if let Some(why) = self.grant.revoked() {
            return Poll::Ready(Some(Err(self.revoked(why))));
        }
        if let Some(initial) = &mut self.initial {
            match initial.next_message(self.codec) {
                Some(added) => return Poll::Ready(Some(Ok(Shown::Initial(added)))),
                // Dropped, so the state goes with its last reader.
                None => self.initial = None,
            }
        }
        if let Some(revision) = self.initial_end.take() {
            return Poll::Ready(Some(Ok(Shown::Bookmark(revision, Mark::InitialEnd))));
        }
        if let Some(timer) = &mut self.timer {
            if timer.as_mut().poll(cx).is_ready() {
                self.end.reason = Some(EndReason::timeout);
                return Poll::Ready(None);
            }
        }
        loop {
            let error = match ready!(self.watcher.poll_next(cx, &self.cache)) {
                Next::Event(view) => return Poll::Ready(Some(Ok(Shown::Change(view)))),
                Next::Bookmark(revision) if self.allow_bookmarks => {
                    return Poll::Ready(Some(Ok(Shown::Bookmark(revision, Mark::Progress))))
                }
                Next::ResyncEnd(revision) if self.allow_bookmarks => {
                    return Poll::Ready(Some(Ok(Shown::Bookmark(revision, Mark::ResyncEnd))))
                }
                Next::Bookmark(_) | Next::ResyncEnd(_) => continue,
                Next::Expired { after, oldest } => {
                    self.end.reason = Some(EndReason::expired);
                    ApiError::FellBehind {
                        after,
                        oldest,
                        current: self.cache.progress().revision,
                    }
                }
                // Shutdown stops the reflectors, which closes every queue
                // after what it holds.
                Next::Closed => {
                    self.end.reason = Some(EndReason::shutdown);
                    ApiError::ShuttingDown {
                        last: Some(self.watcher.revision()),
                    }
                }
            };
            return Poll::Ready(Some(Err(error)));
        }
    }
}

/// What a watch shows next, before it is encoded for a wire.
pub enum Shown {
    /// A live or replayed change.
    Change(Arc<View>),
    /// An initial object, already encoded.
    Initial(Arc<Packed>),
    /// Everything up to the revision was shown.
    Bookmark(Revision, Mark),
}

/// What a bookmark marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Only progress.
    Progress,
    /// The end of the initial state.
    InitialEnd,
    /// The end of a resync: the state shown is etcd's at its revision.
    ResyncEnd,
}

impl Stream for WatchStream {
    type Item = Result<WatchMessage, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let shown = ready!(self.get_mut().poll_shown(cx));
        Poll::Ready(shown.map(|shown| match shown {
            Ok(Shown::Change(view)) => Ok(WatchMessage::Change(view)),
            Ok(Shown::Initial(added)) => Ok(WatchMessage::Initial(added)),
            Ok(Shown::Bookmark(revision, mark)) => Ok(WatchMessage::Own(encode_bookmark(
                revision,
                mark == Mark::InitialEnd,
                mark == Mark::ResyncEnd,
            ))),
            Err(e) => Err(e.into()),
        }))
    }
}
