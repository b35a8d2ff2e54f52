//! Initial states shared by the watches that join together (a rollout, a
//! replica restart, a storm of `send_initial_events`): the matching objects
//! of a snapshot, cut to a projection and encoded once for every joiner
//! that wants the same, built in chunks as the first of them reads, and
//! dropped with the last. A joiner that finds one recent enough starts its
//! watch at that snapshot's revision and reads the changes since from the
//! event window.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::compression::Codec;
use super::wire::{encode_added_batch, encode_initial, Packed};
use crate::cache::{Snapshot, WatchCache, WatchFrom};
use crate::dispatch::{Dispatcher, Encoded, Inbox, Wants, Watcher};
use crate::object::{Object, Projection, Resource, Revision, TooOld};
use crate::selector::Predicate;
use crate::telemetry::ResourceMetrics;

/// Objects encoded per turn of a joiner that reaches the end of what is
/// built: the others wait at most this long for the lock.
const CHUNK: usize = 256;

/// A batched message holds a chunk's objects, or fewer when they reach
/// about this many bytes: large enough to compress as well as a whole
/// state, small enough that a storm's streams, each holding one message
/// the client has not taken yet, stay small.
const BATCH_BYTES: usize = 64 << 10;

/// What joiners share an initial state by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Wanted {
    predicate: Predicate,
    projection: Option<Arc<Projection>>,
    batched: bool,
}

/// The initial states of one resource that joiners are reading.
pub struct InitialStates {
    /// Off: each watch encodes its own (the plain path, to measure against).
    share: bool,
    live: Mutex<Live>,
    metrics: ResourceMetrics,
}

#[derive(Default)]
struct Live {
    states: HashMap<Wanted, Weak<InitialState>>,
    /// How many entries there were after the last sweep of dropped ones:
    /// sweeping when the map has doubled keeps it linear.
    swept: usize,
}

impl InitialStates {
    pub fn new(share: bool, metrics: ResourceMetrics) -> Self {
        Self {
            share,
            live: Mutex::default(),
            metrics,
        }
    }

    /// Registers a watcher that starts with the state (as of `need` or
    /// later), and gives it the state to send first: one another joiner
    /// is reading when there is one recent enough, else a new one.
    pub fn join(
        &self,
        cache: &WatchCache,
        inbox: &Arc<Inbox>,
        wants: Wants,
        need: Revision,
        batched: bool,
        bookmarks: bool,
    ) -> Result<(Watcher, Arc<InitialState>), TooOld> {
        let wanted = Wanted {
            predicate: wants.predicate.clone(),
            projection: wants.projection.clone(),
            batched,
        };
        if let Some(shared) = self.find(&wanted, need) {
            // A window that no longer reaches it: start afresh.
            let from = WatchFrom::Revision(shared.snapshot.revision);
            if let Ok(start) = cache.watch(inbox, wants.clone(), from, bookmarks) {
                self.metrics.initial_snapshots_shared.inc();
                return Ok((start.watcher, shared));
            }
        }
        let start = cache.watch(inbox, wants.clone(), WatchFrom::State, bookmarks)?;
        let snapshot = match start.state {
            Some(snapshot) => snapshot,
            None => unreachable!("a watch from the state starts with it"),
        };
        let state = Arc::new(InitialState {
            solo: !self.share,
            batched,
            snapshot,
            resource: cache.resource.clone(),
            dispatcher: cache.dispatcher().clone(),
            wants,
            built: Mutex::default(),
            metrics: self.metrics.clone(),
        });
        self.metrics.initial_snapshots.inc();
        if self.share {
            let mut live = self.live.lock();
            live.states.insert(wanted, Arc::downgrade(&state));
            if live.states.len() > 2 * live.swept.max(16) {
                live.states.retain(|_, s| s.strong_count() > 0);
                live.swept = live.states.len();
            }
        }
        Ok((start.watcher, state))
    }

    fn find(&self, wanted: &Wanted, need: Revision) -> Option<Arc<InitialState>> {
        if !self.share {
            return None;
        }
        let live = self.live.lock();
        let state = live.states.get(wanted)?.upgrade()?;
        (state.snapshot.revision >= need).then_some(state)
    }
}

/// The initial state of the joiners that want the same objects of one
/// snapshot.
pub struct InitialState {
    /// Read by one watch only: each message is let go once it is read.
    solo: bool,
    /// Many objects per message (see [`BATCH_BYTES`]).
    batched: bool,
    snapshot: Snapshot,
    resource: Arc<Resource>,
    /// Cuts objects to the projection, once for every watch shown them.
    dispatcher: Arc<Dispatcher>,
    wants: Wants,
    built: Mutex<Built>,
    metrics: ResourceMetrics,
}

#[derive(Default)]
struct Built {
    /// The messages from the `first`th on.
    messages: VecDeque<Arc<Packed>>,
    first: usize,
    /// The last object encoded.
    after: Option<Arc<Object>>,
    done: bool,
    /// The bytes of the messages held, in `watchproxy_snapshot_bytes`.
    held: u64,
}

impl Drop for InitialState {
    fn drop(&mut self) {
        let held = self.built.get_mut().held;
        self.metrics.snapshot_bytes.dec_by(held as i64);
    }
}

impl InitialState {
    /// The revision of the state.
    pub fn revision(&self) -> Revision {
        self.snapshot.revision
    }

    /// Its `i`th message, encoding the next objects when no joiner has
    /// yet; none past the end.
    pub fn message(&self, i: usize) -> Option<Arc<Packed>> {
        let mut built = self.built.lock();
        while i >= built.first + built.messages.len() && !built.done {
            self.build_more(&mut built);
        }
        if self.solo {
            debug_assert_eq!(i, built.first, "a solo state is read in order");
            built.first += 1;
            let m = built.messages.pop_front()?;
            self.release(&mut built, m.encoded.size() as u64);
            return Some(m);
        }
        let at = i.checked_sub(built.first)?;
        built.messages.get(at).cloned()
    }

    fn build_more(&self, built: &mut Built) {
        let objects = (self.snapshot).select(
            &self.resource,
            &self.wants.predicate,
            built.after.as_ref().map(|o| o.key()),
        );
        let mut shown = Vec::with_capacity(CHUNK);
        for o in objects.take(CHUNK) {
            built.after = Some(o.clone());
            shown.push(self.dispatcher.show(&self.wants, o.clone()));
        }
        built.done = shown.len() < CHUNK;
        let messages: Vec<Encoded> = match self.batched {
            true => batches(&shown).map(encode_added_batch).collect(),
            false => (shown.iter()).map(|o| encode_initial(o)).collect(),
        };
        let bytes: usize = messages.iter().map(Encoded::size).sum();
        self.metrics.initial_snapshot_bytes.inc_by(bytes as u64);
        self.hold(built, bytes as u64);
        (built.messages).extend(messages.into_iter().map(|m| Arc::new(Packed::new(m))));
    }
}

impl InitialState {
    fn hold(&self, built: &mut Built, bytes: u64) {
        built.held += bytes;
        self.metrics.snapshot_bytes.inc_by(bytes as i64);
    }

    fn release(&self, built: &mut Built, bytes: u64) {
        built.held -= bytes;
        self.metrics.snapshot_bytes.dec_by(bytes as i64);
    }
}

/// `objects` in runs of about [`BATCH_BYTES`] each.
fn batches(objects: &[Arc<Object>]) -> impl Iterator<Item = &[Arc<Object>]> {
    let mut rest = objects;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let end = (rest.iter())
            .position(|o| {
                bytes += o.wire.len();
                bytes >= BATCH_BYTES
            })
            .map_or(rest.len(), |last| last + 1);
        let (batch, after) = rest.split_at(end);
        rest = after;
        Some(batch)
    })
}

/// Where one joiner is in its initial state.
pub struct InitialCursor {
    state: Arc<InitialState>,
    next: usize,
}

impl InitialCursor {
    pub fn new(state: Arc<InitialState>) -> Self {
        Self { state, next: 0 }
    }

    /// The next message, compressed with `codec` when given (by the
    /// first joiner that needs it); none at the end, when the joiner
    /// should drop the cursor so the state can go.
    pub fn next_message(&mut self, codec: Option<Codec>) -> Option<Arc<Packed>> {
        let m = self.state.message(self.next)?;
        self.next += 1;
        if let Some(codec) = codec {
            if let (Some(form), true) = m.compressed(codec) {
                let bytes = form.len() as u64;
                let state = &self.state;
                state
                    .metrics
                    .initial_snapshot_compressed_bytes
                    .inc_by(bytes);
                // A solo state let its message go; the compressed form
                // goes with the message, so it is not held past it.
                if !state.solo {
                    state.hold(&mut state.built.lock(), bytes);
                }
            }
        }
        Some(m)
    }
}
