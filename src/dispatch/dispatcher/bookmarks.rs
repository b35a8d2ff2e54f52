//! Bookmarks: each watcher's when due, spread over the interval, and all
//! of them at once on demand.

use std::cmp::Reverse;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::{Delivery, Dispatcher};
use crate::object::Revision;

impl Dispatcher {
    /// Sends a bookmark to each watcher whose bookmark is due, visiting
    /// only those. A watcher that is behind, or whose queue is full, gets
    /// none: it shows progress when it has caught up, and the events in a
    /// full queue carry progress anyway.
    pub fn send_due_bookmarks(&self, now: Instant) {
        let mut wakes = std::mem::take(&mut *self.wakes.lock());
        let mut guard = self.watchers.lock();
        let w = &mut *guard;
        while let Some(&Reverse((due, id))) = w.bookmarks_due.peek() {
            if due > now {
                break;
            }
            w.bookmarks_due.pop();
            let revision = w.revision;
            let Some(entry) = w.index.get_mut(id).filter(|e| e.bookmarks) else {
                continue;
            };
            // Nothing newer than the watcher's start yet: try again soon.
            let next = if revision > entry.start {
                w.posts
                    .send(entry.post, entry.to, Delivery::Bookmark(revision));
                self.next_bookmark(now)
            } else {
                now + Duration::from_secs(1)
            };
            w.bookmarks_due.push(Reverse((next, id)));
        }
        w.posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
    }

    /// Sends every watcher that allows bookmarks one now, at `revision` or
    /// the newest revision dispatched if that is older: a caller proved
    /// the cache fresh and wants the watches to know at once.
    pub fn bookmark_all(&self, revision: Revision) {
        let mut wakes = std::mem::take(&mut *self.wakes.lock());
        let mut guard = self.watchers.lock();
        let w = &mut *guard;
        let revision = revision.min(w.revision);
        let posts = &mut w.posts;
        w.index.for_each(|entry| {
            if entry.bookmarks && revision > entry.start {
                posts.send(entry.post, entry.to, Delivery::Bookmark(revision));
            }
        });
        w.posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
    }

    /// Sends watcher `id` a bookmark now, at the newest revision
    /// dispatched: it follows every event dispatched to it, so its reader
    /// knows it has seen all of them up to there.
    pub(in crate::dispatch) fn bookmark_one(&self, id: u64) {
        let mut wakes = std::mem::take(&mut *self.wakes.lock());
        let mut guard = self.watchers.lock();
        let w = &mut *guard;
        let revision = w.revision;
        if let Some(entry) = w.index.get_mut(id).filter(|e| revision > e.start) {
            w.posts
                .send(entry.post, entry.to, Delivery::Bookmark(revision));
        }
        w.posts.post(&mut wakes);
        drop(guard);
        self.wake(wakes);
    }

    /// Spreads bookmarks over the last fifth of the interval so watchers
    /// started together do not wake together.
    pub(super) fn next_bookmark(&self, now: Instant) -> Instant {
        now + self
            .bookmark_interval
            .mul_f64(rand::rng().random_range(0.8..=1.0))
    }
}
