//! One watcher's side of the fan-out: live deliveries from its queue, and
//! while it is behind, its own reading of the event window.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use super::{transition, Delivery, Place, Subscription, View, Wants, Window};
use crate::object::Revision;
use crate::selector::Predicate;

/// How many window events a watcher that is behind reads per turn.
const CATCH_UP_EVENTS: usize = 256;

/// What a watcher has to show next.
#[derive(Debug)]
pub enum Next {
    Event(Arc<View>),
    Bookmark(Revision),
    /// The end of a resync: the state shown is etcd's at this revision.
    ResyncEnd(Revision),
    /// The watcher fell further behind than the window reaches: the events
    /// after `after` are gone, the oldest still there follow `oldest`.
    Expired {
        after: Revision,
        oldest: Revision,
    },
    /// The dispatcher is gone (the server is stopping).
    Closed,
}

/// How far a watcher has got: every event before `revision`, and the first
/// `partial` of its deliveries at `revision` (0: all of them). A revision
/// can carry several events (one transaction), and the queue can fill in
/// the middle of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    revision: Revision,
    partial: usize,
    /// Where the resync the deliveries at `revision` belong to started.
    resync_from: Option<Revision>,
}

impl Position {
    fn through(revision: Revision) -> Self {
        Self {
            revision,
            partial: 0,
            resync_from: None,
        }
    }

    /// Past `view`, shown next.
    pub fn delivered(&mut self, view: &View) {
        if view.revision == self.revision && self.partial > 0 {
            self.partial += 1;
        } else {
            *self = Self {
                revision: view.revision,
                partial: 1,
                resync_from: view.resync_from,
            };
        }
    }
}

/// A registered watcher with its predicate and position.
pub struct Watcher {
    subscription: Subscription,
    wants: Wants,
    at: Position,
    /// Reading the window instead of the queue.
    behind: bool,
    /// Changes read from the window and not yet shown, up to `read_through`.
    replay: VecDeque<Next>,
    read_through: Revision,
    /// What it showed last emptied its queue until its reader's next
    /// collection (see [`Watcher::emptied`]).
    emptied: bool,
}

impl Watcher {
    /// A watcher that has seen everything up to `revision`; `behind` when it
    /// must first read the window after it.
    pub(crate) fn new(
        subscription: Subscription,
        wants: Wants,
        revision: Revision,
        behind: bool,
    ) -> Self {
        Self {
            subscription,
            wants,
            at: Position::through(revision),
            behind,
            replay: VecDeque::new(),
            read_through: revision,
            emptied: false,
        }
    }

    /// Where its deliveries wait in its inbox (see [`super::Inbox::collect`]).
    pub fn place(&self) -> Place {
        self.subscription.mailbox.place()
    }

    /// Wakes its reader at once, its queue ended (see
    /// [`super::inbox::Mailbox::alarm`]).
    pub fn alarm(&self) -> impl Fn() + Send + Sync + 'static {
        self.subscription.mailbox.alarm()
    }

    /// Has its inbox's reader name `place` when it has something to read
    /// (see [`super::Mailbox::report_as`]).
    pub fn report_as(&self, place: Place) {
        self.subscription.mailbox.report_as(place);
    }

    /// Asks for a bookmark behind everything dispatched to it so far: once
    /// it arrives, the watcher has shown every change up to its revision.
    pub fn bookmark_now(&self) {
        self.subscription.bookmark_now();
    }

    pub fn predicate(&self) -> &Predicate {
        &self.wants.predicate
    }

    /// The revision of the last change shown (or of the start or the last
    /// bookmark): where the client resumes from.
    pub fn revision(&self) -> Revision {
        self.at.revision
    }

    /// The last revision all of whose events it was given: where a client
    /// that got everything it was given resumes without a gap.
    pub fn complete_revision(&self) -> Revision {
        match (self.at.partial, self.at.resync_from) {
            (0, _) => self.at.revision,
            // Inside a resync: from where it started, it comes whole again.
            (_, Some(from)) => from,
            _ => self.at.revision.saturating_sub(1),
        }
    }

    /// [`Watcher::complete_revision`], where a revision partly shown
    /// counts as whole when the window holds all of its events and none
    /// of the rest is for this watcher: where a watch ended by the server
    /// resumes with nothing shown twice.
    pub fn settled_revision(&self, window: &impl Window) -> Revision {
        let Position {
            revision,
            partial,
            resync_from: None,
        } = self.at
        else {
            return self.complete_revision();
        };
        if partial == 0 || !self.replay.is_empty() {
            return self.complete_revision();
        }
        let shown = window.events_at(revision).map(|events| {
            (events.iter())
                .filter(|e| transition(&self.wants.predicate, e).is_some())
                .count()
        });
        match shown == Some(partial) {
            true => revision,
            false => self.complete_revision(),
        }
    }

    /// The next thing to show. Cancel-safe: nothing is lost when the
    /// future is dropped before it completes.
    pub async fn next(&mut self, window: &impl Window) -> Next {
        std::future::poll_fn(|cx| self.poll_next(cx, window)).await
    }

    /// [`Watcher::next`] for a hand-written stream: `Pending` registers
    /// `cx` to be woken by the next delivery.
    pub fn poll_next(&mut self, cx: &mut Context<'_>, window: &impl Window) -> Poll<Next> {
        self.emptied = false;
        loop {
            if let Some(next) = self.read_window(window) {
                return Poll::Ready(next);
            }
            let Some((delivery, emptied)) = ready!(self.subscription.mailbox.poll_take(cx)) else {
                return Poll::Ready(Next::Closed);
            };
            self.emptied = emptied;
            match delivery {
                Delivery::Event(view) => {
                    self.at.delivered(&view);
                    return Poll::Ready(Next::Event(view));
                }
                Delivery::Bookmark(revision) => {
                    self.at = Position::through(revision);
                    return Poll::Ready(Next::Bookmark(revision));
                }
                Delivery::ResyncEnd(revision) => {
                    self.at = Position::through(revision);
                    return Poll::Ready(Next::ResyncEnd(revision));
                }
                Delivery::Behind => {
                    self.behind = true;
                    self.emptied = false;
                }
            }
        }
    }

    /// Whether it reads its queue, not the window: until it is polled
    /// again, a live change may be taken for it straight from the sort.
    pub fn is_live(&self) -> bool {
        !self.behind && self.replay.is_empty()
    }

    /// Shows `view`, a live change taken straight from the sort, which
    /// the reader knows it may take: it found the watcher live and has not
    /// polled it since.
    pub fn take_known_live(&mut self, view: &View) {
        debug_assert!(self.is_live());
        self.at.delivered(view);
    }

    /// Where it is: a reader that takes live changes for it without
    /// reading it (see [`Watcher::take_known_live`]) keeps this, moved
    /// past each, and gives it back with [`Watcher::took_known_live`].
    pub fn position(&self) -> Position {
        self.at
    }

    /// Gives back the position a reader kept while it took live changes
    /// for the watcher, which it found live and has not polled since.
    pub fn took_known_live(&mut self, at: Position) {
        debug_assert!(self.is_live());
        self.at = at;
    }

    /// Whether what it showed last was the last thing queued for it in a
    /// shared inbox: asked again before its reader collects the inbox
    /// anew, it would only find nothing (and register nothing it has not
    /// registered already).
    pub fn emptied(&self) -> bool {
        self.emptied
    }

    /// While behind, the next change from the window; `None` once the
    /// watcher has rejoined live delivery (or was never behind).
    fn read_window(&mut self, window: &impl Window) -> Option<Next> {
        loop {
            if let Some(next) = self.replay.pop_front() {
                match &next {
                    Next::Event(view) => self.at.delivered(view),
                    Next::ResyncEnd(revision) => self.at = Position::through(*revision),
                    _ => {}
                }
                if self.replay.is_empty() {
                    self.at = Position::through(self.read_through);
                }
                return Some(next);
            }
            if !self.behind {
                return None;
            }
            // Mid-revision, read that revision again and skip what was shown.
            let (after, mut skip) = match self.at.partial {
                0 => (self.at.revision, 0),
                n => (self.at.revision - 1, n),
            };
            let events = match window.catch_up(&self.subscription, after, CATCH_UP_EVENTS) {
                Ok(events) => events,
                Err(too_old) => {
                    return Some(Next::Expired {
                        after,
                        oldest: too_old.oldest,
                    })
                }
            };
            let Some(last) = events.last() else {
                self.behind = false;
                return None;
            };
            self.read_through = last.revision;
            // Where a resync read here ends, once its last event is passed.
            let mut resync_end = None;
            for e in &events {
                if e.resync_from.is_none() {
                    if let Some(end) = resync_end.take() {
                        self.replay.push_back(Next::ResyncEnd(end));
                    }
                } else {
                    resync_end = Some(e.revision);
                }
                let Some((kind, object)) = transition(&self.wants.predicate, e) else {
                    continue;
                };
                if e.revision == self.at.revision && skip > 0 {
                    skip -= 1;
                    continue;
                }
                self.replay.push_back(Next::Event(Arc::new(View {
                    kind,
                    object: self.subscription.show(&self.wants, object.clone()),
                    prev: e.prev().cloned(),
                    revision: e.revision,
                    resync_from: e.resync_from,
                    encoded: None,
                    compressed: Default::default(),
                    etcd_encoded: Default::default(),
                    kubernetes_line: Default::default(),
                    received: None,
                })));
            }
            if let Some(end) = resync_end {
                self.replay.push_back(Next::ResyncEnd(end));
            }
            if self.replay.is_empty() {
                self.at = Position::through(self.read_through);
            }
        }
    }
}
