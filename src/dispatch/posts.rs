//! The inboxes of a dispatcher's watchers, each with the deliveries a
//! dispatch gathered for it, posted together.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Waker;

use slab::Slab;

use super::inbox::{Carried, Inbox, Parcel, Place};
use super::{Delivery, View};

/// The deliveries of one dispatch for one inbox, posted together.
struct Post {
    inbox: Arc<Inbox>,
    parcels: Vec<Parcel>,
    /// The changes the parcels name, each once.
    views: Vec<Arc<View>>,
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
            views: Vec::new(),
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

    /// A bookmark, the end of a resync or `Behind` for the queue at `to`.
    pub fn send(&mut self, post: usize, to: Place, delivery: Delivery) {
        self.push(post, to, Carried::Other(delivery));
    }

    /// A change for the queue at `to`; its inbox holds it once for all the
    /// queues of a post it goes to.
    #[inline]
    pub fn send_change(&mut self, post: usize, to: Place, view: &Arc<View>) {
        let views = &mut self.posts[post].views;
        if !views.last().is_some_and(|last| Arc::ptr_eq(last, view)) {
            views.push(view.clone());
        }
        let at = (views.len() - 1) as u32;
        self.push(post, to, Carried::Change(at));
    }

    #[inline]
    fn push(&mut self, post: usize, to: Place, carried: Carried) {
        let parcels = &mut self.posts[post].parcels;
        if parcels.is_empty() {
            self.posting.push(post);
        }
        parcels.push(Parcel { to, carried });
        self.parcels += 1;
    }

    /// Posts what was gathered, each inbox's parcels at once.
    pub fn post(&mut self, wakes: &mut Vec<Waker>) {
        for i in self.posting.drain(..) {
            if let Some(post) = self.posts.get_mut(i) {
                post.inbox.post(&mut post.parcels, &mut post.views, wakes);
            }
        }
        self.parcels = 0;
    }
}
