//! The window of recent events that watches resume from.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::object::{Event, Revision, TooOld};

/// Recent events in revision order, covering the revisions
/// `(start, newest]`: every event after `start` is here, so a watch from any
/// revision `>= start` can be replayed exactly.
///
/// The capacity adapts between bounds: when the window is full and its
/// oldest event is younger than `freshness`, it doubles instead of evicting
/// (a burst must not expire watchers that are only seconds behind); when
/// even its newest quarter is older than `freshness`, it halves.
#[derive(Debug)]
pub struct EventRing {
    events: VecDeque<(Instant, Arc<Event>)>,
    capacity: usize,
    min: usize,
    max: usize,
    freshness: Duration,
    start: Revision,
    /// Ranges `(from, to)` of lost history that a resync spans: its events
    /// stand at `to`, shown at `from`. No resume is exact strictly inside.
    lost: VecDeque<(Revision, Revision)>,
    /// What its events cost ([`Event::cost`]).
    bytes: u64,
}

impl EventRing {
    pub fn new(min: usize, max: usize, freshness: Duration) -> Self {
        Self {
            events: VecDeque::new(),
            capacity: min,
            min,
            max,
            freshness,
            start: 0,
            lost: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Empties the window; it now covers only revisions after `start`.
    pub fn reset(&mut self, start: Revision) {
        self.events.clear();
        self.lost.clear();
        self.start = start;
        self.bytes = 0;
    }

    /// Records that the history in `(from, to)` is lost: the events pushed
    /// at `to` are a resync's difference.
    pub fn lose(&mut self, from: Revision, to: Revision) {
        self.lost.push_back((from, to));
    }

    /// Whether a watch can resume exactly from `revision`: not inside a
    /// lost range (the end of it, once it is gone from the window, else).
    pub fn check_resume(&self, revision: Revision) -> Result<(), TooOld> {
        if revision < self.start {
            return Err(TooOld { oldest: self.start });
        }
        match self
            .lost
            .iter()
            .find(|(from, to)| *from < revision && revision < *to)
        {
            Some(&(_, to)) => Err(TooOld { oldest: to }),
            None => Ok(()),
        }
    }

    /// The oldest revision a watch can resume from.
    pub fn oldest(&self) -> Revision {
        self.start
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Evicts the oldest events, whatever the lower bound, until the window
    /// costs at most `limit`; how many left.
    pub fn shed(&mut self, limit: u64) -> usize {
        let mut shed = 0;
        while self.bytes > limit && !self.events.is_empty() {
            self.evict_oldest();
            shed += 1;
        }
        shed
    }

    /// Appends an event; revisions must not decrease.
    pub fn push(&mut self, event: Arc<Event>, now: Instant) {
        debug_assert!(self
            .events
            .back()
            .is_none_or(|(_, e)| e.revision <= event.revision));
        if self.events.len() >= self.capacity {
            self.resize(now);
        }
        while self.events.len() >= self.capacity {
            self.evict_oldest();
        }
        self.bytes += event.cost();
        self.events.push_back((now, event));
    }

    fn resize(&mut self, now: Instant) {
        let age_at = |i: usize| now.saturating_duration_since(self.events[i].0);
        if age_at(0) < self.freshness {
            self.capacity = (self.capacity * 2).min(self.max);
        } else if age_at(self.events.len() - self.events.len().div_ceil(4)) > self.freshness {
            self.capacity = (self.capacity / 2).max(self.min);
            self.events.shrink_to(self.capacity);
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((_, e)) = self.events.pop_front() {
            self.bytes -= e.cost();
            // Other events of the same revision may remain, so a resume
            // from just before it is no longer exact: the window now starts
            // at the evicted revision itself.
            self.start = e.revision;
            while self.lost.front().is_some_and(|(_, to)| *to <= self.start) {
                self.lost.pop_front();
            }
        }
    }

    /// Every event after `revision`, in order.
    pub fn since(&self, revision: Revision) -> Result<Vec<Arc<Event>>, TooOld> {
        self.read(revision, usize::MAX)
    }

    /// The events after `revision`, in order: at least `max` of them (or all
    /// there are), and then the rest of the last one's revision, so a reader
    /// can go on from that revision without splitting a transaction.
    pub fn read(&self, revision: Revision, max: usize) -> Result<Vec<Arc<Event>>, TooOld> {
        if revision < self.start {
            return Err(TooOld { oldest: self.start });
        }
        let first = self.events.partition_point(|(_, e)| e.revision <= revision);
        let mut end = first.saturating_add(max).min(self.events.len());
        if let Some(last) = end.checked_sub(1).filter(|&l| l >= first) {
            let through = self.events[last].1.revision;
            while end < self.events.len() && self.events[end].1.revision == through {
                end += 1;
            }
        }
        Ok(self
            .events
            .range(first..end)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Object;

    fn ev(revision: Revision) -> Arc<Event> {
        let (key, name) = (format!("/k/{revision}"), revision.to_string());
        let o = Arc::new(Object::bare(
            &key,
            "",
            &name,
            revision,
            Default::default(),
            &[],
        ));
        Arc::new(Event::added(revision, o))
    }

    fn revisions(r: &EventRing, from: Revision) -> Vec<Revision> {
        r.since(from).unwrap().iter().map(|e| e.revision).collect()
    }

    #[test]
    fn since_returns_exactly_the_later_events() {
        let mut r = EventRing::new(8, 8, Duration::ZERO);
        r.reset(10);
        let t = Instant::now();
        for rev in [11, 12, 12, 15] {
            r.push(ev(rev), t);
        }
        assert_eq!(revisions(&r, 10), [11, 12, 12, 15]);
        assert_eq!(revisions(&r, 11), [12, 12, 15]);
        assert_eq!(revisions(&r, 13), [15]);
        assert_eq!(revisions(&r, 15), Vec::<Revision>::new());
        assert_eq!(revisions(&r, 99), Vec::<Revision>::new());
        assert_eq!(r.since(9), Err(TooOld { oldest: 10 }));
    }

    #[test]
    fn reads_end_on_a_whole_revision() {
        let mut r = EventRing::new(8, 8, Duration::ZERO);
        r.reset(10);
        let t = Instant::now();
        for rev in [11, 12, 12, 12, 15] {
            r.push(ev(rev), t);
        }
        let read = |from, max| -> Vec<Revision> {
            r.read(from, max)
                .unwrap()
                .iter()
                .map(|e| e.revision)
                .collect()
        };
        assert_eq!(read(10, 1), [11]);
        assert_eq!(read(10, 2), [11, 12, 12, 12]);
        assert_eq!(read(11, 1), [12, 12, 12]);
        assert_eq!(read(12, 1), [15]);
        assert_eq!(read(15, 1), Vec::<Revision>::new());
        assert_eq!(read(10, 0), Vec::<Revision>::new());
        assert_eq!(r.read(9, 1), Err(TooOld { oldest: 10 }));
    }

    #[test]
    fn eviction_moves_the_start_to_the_evicted_revision() {
        let mut r = EventRing::new(2, 2, Duration::ZERO);
        r.reset(1);
        let t = Instant::now() + Duration::from_secs(1);
        for rev in [2, 3, 3] {
            r.push(ev(rev), t);
        }
        // 2 was evicted: a watch from 2 is still exact, one from 1 is not.
        assert_eq!(revisions(&r, 2), [3, 3]);
        assert_eq!(r.since(1), Err(TooOld { oldest: 2 }));
        r.push(ev(4), t);
        // One of the two events at 3 is gone, so resuming from 2 is too old.
        assert_eq!(r.since(2), Err(TooOld { oldest: 3 }));
        assert_eq!(revisions(&r, 3), [4]);
    }

    #[test]
    fn a_fresh_window_grows_instead_of_evicting() {
        let mut r = EventRing::new(2, 8, Duration::from_secs(60));
        let t = Instant::now();
        for rev in 1..=8 {
            r.push(ev(rev), t);
        }
        assert_eq!(r.capacity(), 8);
        assert_eq!(r.len(), 8);
        r.push(ev(9), t);
        assert_eq!(r.len(), 8, "the upper bound holds");
        assert_eq!(r.oldest(), 1);
    }

    #[test]
    fn an_old_window_shrinks_to_the_lower_bound() {
        let mut r = EventRing::new(2, 8, Duration::from_secs(60));
        let t = Instant::now();
        for rev in 1..=8 {
            r.push(ev(rev), t);
        }
        let later = t + Duration::from_secs(120);
        r.push(ev(9), later);
        assert_eq!(r.capacity(), 4);
        assert_eq!(r.oldest(), 5);
        assert_eq!(revisions(&r, 5), [6, 7, 8, 9]);
        r.push(ev(10), later + Duration::from_secs(120));
        assert_eq!(r.capacity(), 2);
        assert_eq!(revisions(&r, r.oldest()), [9, 10]);
    }
}
