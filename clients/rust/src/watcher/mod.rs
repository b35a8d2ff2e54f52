//! A watcher, as kube-runtime has it: one stream of a resource's objects
//! that lists, watches from the list's version, resumes a broken watch
//! from the last version it has every event of (so a restart or a move
//! between replicas costs no list), lists again only when the server says
//! that version is gone, and waits between retries as the server advises.
//! Each failure is handed out as an `Err` item before the retry; only one
//! no retry can mend ends the stream. What it does after each failure is
//! [`recovery`], and where it resumes is a [`Cursor`]: both public, so
//! they can be read and tested on their own.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::time::Duration;

use futures_core::Stream;
use tonic::Code;
use tracing::{info, warn};

pub use crate::backoff::Backoff;
use crate::client::{Client, Watch};
use crate::error::{Error, Reason};
use crate::object::Resource;
use crate::pb::{EventType, ListRequest, WatchEvent};

mod config;

pub use config::Config;

/// What a watcher hands out. A list is `Init`, an `InitApply` per object,
/// then `InitDone`: the objects between are the whole resource at that
/// version (a store replaces its contents with them).
#[derive(Debug, Clone)]
pub enum Event<K> {
    /// A list begins.
    Init,
    /// An object of the list.
    InitApply(K),
    /// The list is complete, at `resource_version`.
    InitDone {
        /// The list's version; the watch goes on from it.
        resource_version: String,
    },
    /// An object was added or changed.
    Apply(K),
    /// An object was deleted: its last state, at the deletion's version.
    Delete(K),
    /// Every change up to `resource_version` has been handed out.
    /// `resync`: it ends the difference the server sent in place of the
    /// history it lost (the `Apply`s and `Delete`s before it since the
    /// previous bookmark, whose objects keep their own versions).
    Bookmark {
        /// The version every change up to has been handed out.
        resource_version: String,
        /// It ends a resync.
        resync: bool,
    },
}

/// Where a watch resumes: `complete` is the last version with all its
/// events handed out. One version can carry several events (a
/// transaction), so the latest one seen is complete only once a later
/// version or a bookmark arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The last version with all its events handed out.
    pub complete: u64,
    /// The latest version seen.
    pub seen: u64,
}

impl Cursor {
    /// At a list's version: everything up to it is in.
    pub fn at(version: u64) -> Cursor {
        Cursor {
            complete: version,
            seen: version,
        }
    }

    /// An event after which a watch resumes from `version`.
    pub fn event(&mut self, version: u64) {
        if version > self.seen {
            self.complete = self.seen;
            self.seen = version;
        }
    }

    /// A bookmark: every event up to `version` is in.
    pub fn bookmark(&mut self, version: u64) {
        self.seen = self.seen.max(version);
        self.complete = self.seen;
    }

    /// A failure that names the version to resume from (a credential's
    /// end names where its watch stopped).
    pub fn resume_at(&mut self, named: Option<u64>) {
        self.complete = self.complete.max(named.unwrap_or(0));
    }
}

/// What a watcher does after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing a retry can mend (a bad selector, an unknown resource, no
    /// permission, a fixed credential that ended): the stream ends.
    Stop,
    /// The version is gone: list again, at once.
    Relist,
    /// Wait (the backoff's step, at least the server's advice), then do
    /// the same again: the list, or the watch from its cursor.
    Retry,
    /// One object's value is not the type asked for: it is left out (and
    /// logged), and the stream goes on.
    Skip,
}

/// What follows `error`; `renewable` says whether the client's credential
/// can come back fresh (a token file or function).
pub fn recovery(error: &Error, renewable: bool) -> Recovery {
    let fixed_credential_ended = !renewable
        && matches!(
            error.reason(),
            Some(Reason::CredentialExpired | Reason::CredentialRevoked)
        );
    if error.is_undecodable() {
        Recovery::Skip
    } else if error.is_permanent() || fixed_credential_ended {
        Recovery::Stop
    } else if error.is_gone() {
        Recovery::Relist
    } else {
        Recovery::Retry
    }
}

/// A stream of `resource`'s objects as [`Event`]s, decoded as `K`: the
/// server's [`Object`](crate::pb::Object)s as they come, or
/// [`Typed<T>`](crate::Typed) for values decoded once with serde.
pub fn watcher<K: Resource>(
    client: Client,
    config: Config,
) -> impl Stream<Item = Result<Event<K>, Error>> + Send {
    let state = State::<K> {
        backoff: Backoff::new(config.first_wait, config.longest_wait),
        client,
        config,
        phase: Phase::List {
            continue_token: String::new(),
        },
        wait: None,
        ready: VecDeque::new(),
        kind: PhantomData,
    };
    futures_util::stream::unfold(state, |mut state| async move {
        let item = state.step().await?;
        Some((item, state))
    })
}

enum Phase {
    List {
        continue_token: String,
    },
    Watch {
        cursor: Cursor,
        open: Option<Box<Watch>>,
    },
    Stopped,
}

struct State<K> {
    client: Client,
    config: Config,
    backoff: Backoff,
    phase: Phase,
    /// A wait before the next step: after a failure was handed out.
    wait: Option<Duration>,
    ready: VecDeque<Result<Event<K>, Error>>,
    kind: PhantomData<fn() -> K>,
}

fn version_of(text: &str) -> Result<u64, Error> {
    text.parse().map_err(|_| {
        Error::local(
            Code::Internal,
            format!("the server sent resource version {text:?}"),
        )
    })
}

impl<K: Resource> State<K> {
    async fn step(&mut self) -> Option<Result<Event<K>, Error>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if let Some(wait) = self.wait.take() {
                tokio::time::sleep(wait).await;
            }
            match &mut self.phase {
                Phase::Stopped => return None,
                Phase::List { continue_token } => {
                    let request = ListRequest {
                        continue_token: continue_token.clone(),
                        ..self.config.query.clone()
                    };
                    let first = continue_token.is_empty();
                    match self.client.list(request).await {
                        Ok(page) => self.take_page(first, page),
                        Err(e) => self.failed("list", e),
                    }
                }
                Phase::Watch { cursor, open: None } => {
                    let request = self.config.watch_from(cursor.complete);
                    match self.client.watch(request).await {
                        Ok(watch) => {
                            if let Phase::Watch { open, .. } = &mut self.phase {
                                *open = Some(Box::new(watch));
                            }
                        }
                        Err(e) => self.failed("watch", e),
                    }
                }
                Phase::Watch {
                    cursor,
                    open: Some(watch),
                } => match watch.next().await {
                    Ok(Some(event)) => {
                        self.backoff.reset();
                        if let Err(e) = take_event(cursor, event, &self.config, &mut self.ready) {
                            self.failed("watch", e);
                        }
                    }
                    // Ended cleanly (its timeout): resume at once, unless it
                    // keeps ending before any event.
                    Ok(None) => {
                        self.wait = Some(self.backoff.next(None));
                        if let Phase::Watch { open, .. } = &mut self.phase {
                            *open = None;
                        }
                    }
                    Err(e) => self.failed("watch", e),
                },
            }
        }
    }

    fn take_page(&mut self, first: bool, page: crate::pb::ListResponse) {
        if first {
            self.ready.push_back(Ok(Event::Init));
        }
        for object in page.items {
            self.ready
                .push_back(K::from_object(object).map(Event::InitApply));
        }
        if !page.continue_token.is_empty() {
            self.phase = Phase::List {
                continue_token: page.continue_token,
            };
            return;
        }
        match version_of(&page.resource_version) {
            Ok(at) => {
                info!(resource = %self.config.query.resource, version = at, "listed");
                self.backoff.reset();
                self.ready.push_back(Ok(Event::InitDone {
                    resource_version: page.resource_version,
                }));
                self.phase = Phase::Watch {
                    cursor: Cursor::at(at),
                    open: None,
                };
            }
            Err(e) => self.failed("list", e),
        }
    }

    /// Hands `error` out and sets what comes next.
    fn failed(&mut self, call: &str, error: Error) {
        let resource = &self.config.query.resource;
        match recovery(&error, self.client.renewable()) {
            Recovery::Stop => {
                warn!(%resource, call, %error, "watcher stopped");
                self.phase = Phase::Stopped;
            }
            Recovery::Relist => {
                info!(%resource, %error, "listing again");
                self.phase = Phase::List {
                    continue_token: String::new(),
                };
            }
            // Not a failure of a call; made only where objects are decoded.
            Recovery::Skip => {}
            Recovery::Retry => {
                let wait = self.backoff.next(error.retry_delay());
                // A replica going away, a connection reaching its age or a
                // credential's end is a planned move.
                let planned = error.is_credential_end()
                    || matches!(
                        error.reason(),
                        Some(Reason::ShuttingDown | Reason::ConnectionAged)
                    );
                if planned {
                    info!(%resource, call, %error, ?wait, "moving");
                } else {
                    warn!(%resource, call, %error, ?wait, "retrying");
                }
                self.wait = Some(wait);
                match &mut self.phase {
                    Phase::Watch { cursor, open } => {
                        let named = error.resume_resource_version().and_then(|v| v.parse().ok());
                        cursor.resume_at(named);
                        *open = None;
                    }
                    // A list resumes at its page when that fails; a list
                    // that lost its version starts again (Relist).
                    Phase::List { .. } | Phase::Stopped => {}
                }
            }
        }
        self.ready.push_back(Err(error));
    }
}

/// One watch event into the cursor and the events handed out.
fn take_event<K: Resource>(
    cursor: &mut Cursor,
    event: WatchEvent,
    config: &Config,
    ready: &mut VecDeque<Result<Event<K>, Error>>,
) -> Result<(), Error> {
    let Some(object) = event.object else {
        return Ok(());
    };
    // Where to resume after the event: a resync's events name the version
    // its lost history starts from, while their objects keep their own. A
    // server that does not say: the object's.
    let version = match event.resume_resource_version.as_str() {
        "" => version_of(&object.resource_version)?,
        resume => version_of(resume)?,
    };
    match EventType::try_from(event.r#type) {
        Ok(EventType::Bookmark) => {
            cursor.bookmark(version);
            ready.push_back(Ok(Event::Bookmark {
                resource_version: object.resource_version,
                resync: event.resync,
            }));
        }
        Ok(kind @ (EventType::Added | EventType::Modified | EventType::Deleted)) => {
            cursor.event(version);
            let made = match kind {
                EventType::Deleted => K::from_object(object).map(Event::Delete),
                _ => K::from_object(object).map(Event::Apply),
            };
            if let Err(e) = &made {
                warn!(resource = %config.query.resource, error = %e, "skipped an object that cannot be decoded");
            }
            ready.push_back(made);
        }
        _ => {
            warn!(resource = %config.query.resource, kind = event.r#type, "skipped an event of an unknown type");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_complete_once_a_later_one_or_a_bookmark_arrives() {
        let mut c = Cursor::at(10);
        c.event(12);
        assert_eq!((c.complete, c.seen), (10, 12));
        c.event(12);
        assert_eq!((c.complete, c.seen), (10, 12));
        c.event(13);
        assert_eq!((c.complete, c.seen), (12, 13));
        c.bookmark(15);
        assert_eq!((c.complete, c.seen), (15, 15));
        // A resync's events resume from the version its lost history
        // starts from: no later than what the cursor has.
        c.event(15);
        assert_eq!((c.complete, c.seen), (15, 15));
        // A credential's end names where its watch stopped; an older name
        // never moves the cursor back.
        c.resume_at(Some(17));
        assert_eq!(c.complete, 17);
        c.resume_at(Some(3));
        assert_eq!(c.complete, 17);
    }

    fn status(code: Code, reason: Option<&str>) -> Error {
        let mut status = tonic::Status::new(code, "x");
        if let Some(reason) = reason {
            let info = tonic_types::ErrorDetails::with_error_info(
                reason,
                crate::DOMAIN,
                std::collections::HashMap::new(),
            );
            status = <tonic::Status as tonic_types::StatusExt>::with_error_details(code, "x", info);
        }
        Error::from(status)
    }

    #[test]
    fn each_failure_has_one_recovery() {
        let cases = [
            (Code::Unavailable, Some("NOT_READY"), false, Recovery::Retry),
            (
                Code::Unavailable,
                Some("SHUTTING_DOWN"),
                false,
                Recovery::Retry,
            ),
            (
                Code::OutOfRange,
                Some("TOO_OLD_RESOURCE_VERSION"),
                false,
                Recovery::Relist,
            ),
            (
                Code::InvalidArgument,
                Some("BAD_SELECTOR"),
                true,
                Recovery::Stop,
            ),
            (Code::NotFound, None, true, Recovery::Stop),
            (Code::PermissionDenied, None, true, Recovery::Stop),
            (
                Code::Unauthenticated,
                Some("CREDENTIAL_REVOKED"),
                true,
                Recovery::Retry,
            ),
            (
                Code::Unauthenticated,
                Some("CREDENTIAL_REVOKED"),
                false,
                Recovery::Stop,
            ),
            (
                Code::Unauthenticated,
                Some("CREDENTIAL_EXPIRED"),
                false,
                Recovery::Stop,
            ),
            (
                Code::PermissionDenied,
                Some("ACCESS_CHANGED"),
                false,
                Recovery::Retry,
            ),
            (Code::ResourceExhausted, None, false, Recovery::Retry),
            (Code::Internal, None, false, Recovery::Retry),
        ];
        assert_eq!(recovery(&Error::undecodable("x"), false), Recovery::Skip);
        for (code, reason, renewable, want) in cases {
            let error = status(code, reason);
            assert_eq!(
                recovery(&error, renewable),
                want,
                "{error} renewable={renewable}"
            );
        }
    }
}
