//! Fan-out: hands each event to every interested watcher's bounded queue,
//! rewriting its type per watcher, and sends periodic bookmarks. A watcher
//! whose queue is nearly full falls behind: its live deliveries are skipped
//! until it has caught up from the event window by itself.

mod cuts;
mod dispatcher;
mod inbox;
#[cfg(test)]
mod inbox_tests;
mod posts;
mod shards;
#[cfg(test)]
mod tests;
mod trigger;
mod watcher;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::object::{Event, EventType, Object, Projection, Revision, TooOld};
use crate::selector::Predicate;
pub use dispatcher::{Dispatcher, Subscription};
pub use inbox::{Inbox, Mailbox, Offer, Place, Taker};
pub use trigger::Trigger;
pub use watcher::{Next, Position, Watcher};

/// Turns a change as a watcher sees it into the bytes sent on the wire.
/// Given by the API layer, so dispatch knows nothing of the wire format.
/// Its arguments: the type, the object, the event's revision and, in a
/// resync, the revision its lost history starts from (where a client
/// resumes from after the event).
pub type Encode =
    Arc<dyn Fn(EventType, &Object, Revision, Option<Revision>) -> Encoded + Send + Sync>;

/// An encoded message in two pieces written back to back, so that a piece
/// shared with the cache (an object's own encoding) is not copied to make
/// the message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    pub head: Bytes,
    pub body: Bytes,
}

impl Encoded {
    /// The message's size in bytes.
    pub fn size(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// The whole message in one buffer.
    pub fn to_bytes(&self) -> Bytes {
        if self.body.is_empty() {
            return self.head.clone();
        }
        [&self.head[..], &self.body[..]].concat().into()
    }
}

/// What a watcher is shown: the objects its predicate matches, cut to
/// its projection.
#[derive(Debug, Clone, Default)]
pub struct Wants {
    pub predicate: Predicate,
    pub projection: Option<Arc<Projection>>,
}

impl From<Predicate> for Wants {
    fn from(predicate: Predicate) -> Wants {
        Wants {
            predicate,
            projection: None,
        }
    }
}

/// An event as the watchers of one type (and projection) see it, shared
/// by all of them.
#[derive(Debug)]
pub struct View {
    pub kind: EventType,
    /// DELETED carries the last state the watcher was shown.
    pub object: Arc<Object>,
    /// The key's state before the change (none for a creation), as etcd
    /// held it: what etcd's own API sends as `prev_kv`.
    pub prev: Option<Arc<Object>>,
    pub revision: Revision,
    /// See [`Event::resync_from`].
    pub resync_from: Option<Revision>,
    /// The encoded change, made once per event, type and projection (when
    /// the dispatcher has an encoder).
    pub encoded: Option<Encoded>,
    /// Compressed forms of the change, shared like `encoded`.
    pub compressed: Compressed,
    /// The change as etcd's API encodes it, without and with the previous
    /// state: made by the first stream that sends it, for all of them; a
    /// whole response of it alone, and where the change starts in it.
    pub etcd_encoded: [OnceLock<(Bytes, usize)>; 2],
    /// The change as a line of a Kubernetes API watch, made by the first
    /// stream that sends it, for all of them; none for a value that is not
    /// a JSON object.
    pub kubernetes_line: OnceLock<Option<Bytes>>,
    /// When the cache took the change off its etcd watch; none for a
    /// change read back from the window.
    pub received: Option<std::time::Instant>,
}

/// Compressed forms of a message the API makes when a stream first needs
/// one, a slot per codec, shared by every stream that sends the message.
#[derive(Debug, Default)]
pub struct Compressed([OnceLock<Option<Bytes>>; 2]);

impl Compressed {
    /// The form in `slot`, made by `make` if no stream has yet (none
    /// inside: compressing does not shrink it), and whether this call
    /// made it.
    pub fn get_or_make(
        &self,
        slot: usize,
        make: impl FnOnce() -> Option<Bytes>,
    ) -> (Option<&Bytes>, bool) {
        let mut made = false;
        let form = self.0[slot].get_or_init(|| {
            made = true;
            make()
        });
        (form.as_ref(), made)
    }
}

/// What a watcher's queue carries. Small, so an idle watcher's queue is
/// small too.
#[derive(Debug, Clone)]
pub enum Delivery {
    Event(Arc<View>),
    /// Progress with nothing to show: the watcher has seen everything up to
    /// this revision.
    Bookmark(Revision),
    /// A resync's difference has been sent: the watcher has seen the state
    /// as of this revision, not the history up to it.
    ResyncEnd(Revision),
    /// The queue had no room for the next event: live deliveries are
    /// skipped from here on, and the watcher reads the event window from
    /// the last change it received, then rejoins (through the cache).
    Behind,
}

impl Delivery {
    /// The revision the watcher has seen through once it has this; 0 for
    /// `Behind`.
    fn revision(&self) -> Revision {
        match self {
            Delivery::Event(view) => view.revision,
            Delivery::Bookmark(r) | Delivery::ResyncEnd(r) => *r,
            Delivery::Behind => 0,
        }
    }
}

/// How an event looks to a watcher with predicate `p`: starts matching is
/// ADDED, keeps matching is MODIFIED, stops matching is DELETED (with the
/// previous state), never matched is nothing. The object is the event's,
/// borrowed: a dispatch asks for every watcher an event reaches, and takes
/// a reference only for the first of each type.
pub fn transition<'e>(p: &Predicate, event: &'e Event) -> Option<(EventType, &'e Arc<Object>)> {
    transition_by(event, |o| p.matches(o))
}

pub(crate) fn transition_by(
    event: &Event,
    matches: impl Fn(&Object) -> bool,
) -> Option<(EventType, &Arc<Object>)> {
    let now = event.object().filter(|o| matches(o));
    let before = event.prev().filter(|o| matches(o));
    match (now, before) {
        (Some(o), Some(_)) => Some((EventType::Modified, o)),
        (Some(o), None) => Some((EventType::Added, o)),
        (None, Some(prev)) => Some((EventType::Deleted, prev)),
        (None, None) => None,
    }
}

/// The event window a watcher that fell behind reads by itself. The cache
/// implements it, so dispatch never reaches back into the cache.
pub trait Window {
    /// The next events after `after` (whole revisions, about `max`). When
    /// there are none, the watcher has caught up and is rejoined to live
    /// delivery (`Subscription::rejoin`) under the lock that orders the
    /// window, so no event is missed or delivered twice.
    fn catch_up(
        &self,
        subscription: &Subscription,
        after: Revision,
        max: usize,
    ) -> Result<Vec<Arc<Event>>, TooOld>;

    /// Every event of `revision`, once all of them are in the window;
    /// none when the window cannot tell (the revision is not all there).
    fn events_at(&self, revision: Revision) -> Option<Vec<Arc<Event>>>;
}

impl<W: Window + ?Sized> Window for Arc<W> {
    fn catch_up(
        &self,
        subscription: &Subscription,
        after: Revision,
        max: usize,
    ) -> Result<Vec<Arc<Event>>, TooOld> {
        (**self).catch_up(subscription, after, max)
    }

    fn events_at(&self, revision: Revision) -> Option<Vec<Arc<Event>>> {
        (**self).events_at(revision)
    }
}

/// Sends due bookmarks every `tick` until `shutdown`: the bookmark clock of
/// every resource's dispatcher.
pub fn spawn_bookmarks(
    dispatchers: Vec<Arc<Dispatcher>>,
    tick: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut tick = tokio::time::interval(tick);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::spawn(async move {
        loop {
            let now = tokio::select! {
                _ = shutdown.cancelled() => return,
                now = tick.tick() => now,
            };
            for d in &dispatchers {
                d.send_due_bookmarks(now);
            }
        }
    })
}
