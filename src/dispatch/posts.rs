//! The inboxes of a dispatcher's watchers, each with the deliveries a
//! dispatch gathered for it, posted together.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Waker;

use slab::Slab;

use super::inbox::{Inbox, Parcel, Place};
use super::Delivery;

/// The deliveries of one dispatch for one inbox, posted together.
struct Post {
    inbox: Arc<Inbox>,
    parcels: Vec<Parcel>,
    /// The watchers registered with this inbox.
    watchers: usize,
}

/// Parcels gathered before a dispatch of many events posts what it has.
pub(super) const POST_PARCELS: usize = 16 * 1024;

#[derive(Default)]
pub(super) struct Posts {
    posts: Slab<Post>,
    /// The place in `posts` of each inbox, by its address.
    post_of: HashMap<usize, usize>,
    /// The posts holding parcels.
    posting: Vec<usize>,
    /// How many parcels they hold together.
    pub parcels: usize,
}

impl Posts {
    /// The place of `inbox`'s post, for one more watcher.
    pub fn join(&mut self, inbox: &Arc<Inbox>) -> usize {
        let key = Arc::as_ptr(inbox) as usize;
        if let Some(&i) = self.post_of.get(&key) {
            self.posts[i].watchers += 1;
            return i;
        }
        let i = self.posts.insert(Post {
            inbox: inbox.clone(),
            parcels: Vec::new(),
            watchers: 1,
        });
        self.post_of.insert(key, i);
        i
    }

    /// One watcher fewer at post `i`.
    pub fn leave(&mut self, i: usize) {
        let post = &mut self.posts[i];
        post.watchers -= 1;
        if post.watchers == 0 {
            self.post_of.remove(&(Arc::as_ptr(&post.inbox) as usize));
            self.posts.remove(i);
        }
    }

    pub fn inbox(&self, i: usize) -> &Arc<Inbox> {
        &self.posts[i].inbox
    }

    pub fn send(&mut self, post: usize, to: Place, delivery: Delivery) {
        let parcels = &mut self.posts[post].parcels;
        if parcels.is_empty() {
            self.posting.push(post);
        }
        parcels.push(Parcel {
            to,
            delivery: Some(delivery),
        });
        self.parcels += 1;
    }

    /// Posts what was gathered, each inbox's parcels at once.
    pub fn post(&mut self, wakes: &mut Vec<Waker>) {
        for i in self.posting.drain(..) {
            if let Some(post) = self.posts.get_mut(i) {
                post.inbox.post(&mut post.parcels, wakes);
            }
        }
        self.parcels = 0;
    }
}
