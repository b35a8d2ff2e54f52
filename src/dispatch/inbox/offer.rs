//! What an inbox's reader is offered as the inbox is sorted, and the
//! reader's side of that sort.

use std::sync::Arc;

use super::Place;
use crate::dispatch::View;

/// A live change offered to an inbox's reader as the inbox is sorted (see
/// [`super::Inbox::collect_taking`]).
pub struct Offer<'a> {
    /// The place its queue is named by: its own, or the one it reports as.
    pub by: Place,
    /// Its queue's own place.
    pub queue: Place,
    pub view: &'a Arc<View>,
    /// The changes sorted with it, the view at `at` among them.
    pub(super) views: &'a [Arc<View>],
    pub(super) at: usize,
}

impl Offer<'_> {
    /// Whether no other change of its revision came to the inbox with it
    /// (etcd's API sends a revision's changes in one response). Looked at
    /// only by a reader that asks.
    pub fn alone(&self) -> bool {
        let revision = self.view.revision;
        let apart = |j: Option<usize>| {
            j.and_then(|j| self.views.get(j))
                .is_none_or(|v| v.revision != revision)
        };
        apart(self.at.checked_sub(1)) && apart(Some(self.at + 1))
    }
}

/// What an inbox's reader does with the live changes it is offered while
/// the inbox is sorted (see [`super::Inbox::collect_taking`]).
pub trait Taker {
    /// A change of this sort may be offered for `place`: what the reader
    /// keeps for it is worth reading now, before any change is offered.
    fn ahead(&mut self, _place: Place) {}

    /// Shows the change `offer` brings at once (true), or leaves it to be
    /// queued.
    fn take(&mut self, offer: Offer<'_>) -> bool;
}

impl<F: FnMut(Offer<'_>) -> bool> Taker for F {
    fn take(&mut self, offer: Offer<'_>) -> bool {
        self(offer)
    }
}
