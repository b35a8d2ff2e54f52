//! Subscriptions to a running informer, as client-go's event handlers
//! are: made at any time, each with a bounded queue of its own that the
//! informer never waits on. One made after the informer synced first gets
//! every object the store holds, once, as `Added`. One that lets its queue
//! fill falls behind: the changes it would have been queued are dropped,
//! and once it has read what was queued it is given the difference between
//! what it was told and the store, so it ends with every object as the
//! store holds it (the changes in between are lost to it, as a relist's
//! are).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Event;
use crate::pb::Object;
use crate::store::{ObjectKey, Store};

/// Every subscription of one informer.
#[derive(Default)]
pub(crate) struct Subscribers {
    /// Held while the store takes a change and it is offered, and while a
    /// subscription reads the store to start or to catch up (taken before
    /// a queue's state): a change is either in what it read or queued to
    /// it after, never both.
    list: Mutex<Vec<Arc<Queue>>>,
}

struct Queue {
    capacity: usize,
    state: Mutex<State>,
    ready: Notify,
    fell_behind: AtomicU64,
}

#[derive(Default)]
struct State {
    events: VecDeque<Event>,
    behind: bool,
    closed: bool,
}

impl Queue {
    /// Queues one step's events under one lock; false once it is closed.
    fn offer(&self, events: &[Event]) -> bool {
        let mut state = self.state.lock();
        if state.closed {
            return false;
        }
        if state.behind || events.is_empty() {
            return true;
        }
        for event in events {
            if state.events.len() >= self.capacity {
                state.behind = true;
                self.fell_behind.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    capacity = self.capacity,
                    "a subscriber fell behind; it gets the difference once it catches up"
                );
                break;
            }
            state.events.push_back(event.clone());
        }
        drop(state);
        self.ready.notify_one();
        true
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_one();
    }
}

impl Subscribers {
    /// Runs `take` (the store taking a change) and offers what it returns
    /// to every subscription, as one step for new subscriptions.
    pub(crate) fn take(&self, take: impl FnOnce() -> Vec<Event>) -> Vec<Event> {
        let mut list = self.list.lock();
        let events = take();
        list.retain(|queue| queue.offer(&events));
        events
    }

    /// A new subscription; `store`'s objects first when it is ready.
    pub(crate) fn subscribe(self: &Arc<Self>, store: &Store, capacity: usize) -> Subscription {
        let queue = Arc::new(Queue {
            capacity: capacity.max(1),
            state: Mutex::default(),
            ready: Notify::new(),
            fell_behind: AtomicU64::new(0),
        });
        let mut list = self.list.lock();
        let initial = if store.is_ready() {
            store.state()
        } else {
            Vec::new()
        };
        list.push(queue.clone());
        drop(list);
        Subscription {
            queue,
            subscribers: self.clone(),
            store: store.clone(),
            pending: initial.into_iter().map(Event::Added).collect(),
            seen: HashMap::new(),
        }
    }

    /// The informer stopped: each subscription ends once read.
    pub(crate) fn close(&self) {
        for queue in self.list.lock().drain(..) {
            queue.close();
        }
    }
}

/// A subscription to a running informer, from
/// [`Running::subscribe`](crate::Running::subscribe).
pub struct Subscription {
    queue: Arc<Queue>,
    subscribers: Arc<Subscribers>,
    store: Store,
    /// What to hand out before the queue: the store's objects at the
    /// start, or a catch-up's difference.
    pending: VecDeque<Event>,
    /// What it was told: each key's object, for the difference.
    seen: HashMap<ObjectKey, Arc<Object>>,
}

impl Subscription {
    /// The next change; None once the informer stopped and every change
    /// queued before was read.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.remember(&event);
                return Some(event);
            }
            let queue = self.queue.clone();
            let notified = queue.ready.notified();
            {
                let mut state = queue.state.lock();
                if let Some(event) = state.events.pop_front() {
                    drop(state);
                    self.remember(&event);
                    return Some(event);
                }
                if state.behind && !state.closed {
                    // The store as it is now, read while no change is
                    // between the store and the queues; changes after it
                    // are queued again, in order.
                    drop(state);
                    let subscribers = self.subscribers.clone();
                    let list = subscribers.list.lock();
                    let mut state = queue.state.lock();
                    state.behind = false;
                    let now = self.store.state();
                    drop(state);
                    drop(list);
                    self.pending = self.difference(now);
                    continue;
                }
                if state.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// How many times its queue filled.
    pub fn fell_behind(&self) -> u64 {
        self.queue.fell_behind.load(Ordering::Relaxed)
    }

    fn remember(&mut self, event: &Event) {
        match event {
            Event::Added(o) | Event::Modified { new: o, .. } => {
                self.seen
                    .insert((o.namespace.clone(), o.name.clone()), o.clone());
            }
            Event::Deleted(o) => {
                self.seen.remove(&(o.namespace.clone(), o.name.clone()));
            }
            Event::Relisted { .. } => {}
        }
    }

    /// The changes that make what it was told the store's `now`.
    fn difference(&self, now: Vec<Arc<Object>>) -> VecDeque<Event> {
        let now: HashMap<ObjectKey, Arc<Object>> = (now.into_iter())
            .map(|o| ((o.namespace.clone(), o.name.clone()), o))
            .collect();
        let gone = (self.seen.iter())
            .filter(|(key, _)| !now.contains_key(*key))
            .map(|(_, old)| Event::Deleted(old.clone()));
        let changed = now
            .iter()
            .filter_map(|(key, new)| match self.seen.get(key) {
                None => Some(Event::Added(new.clone())),
                Some(old)
                    if old.resource_version != new.resource_version || old.value != new.value =>
                {
                    Some(Event::Modified {
                        old: old.clone(),
                        new: new.clone(),
                    })
                }
                Some(_) => None,
            });
        gone.chain(changed).collect()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.queue.close();
    }
}
