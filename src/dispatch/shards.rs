//! Shard watchers indexed by their hash ranges, so an event reaches the
//! watchers whose ranges hold its hash in logarithmic time, however many
//! shards there are.

use std::collections::{BTreeMap, HashMap};

/// The watchers (`T`, by id) of one shard field. The hash space is cut
/// into segments at every range's edges; each segment lists the watchers
/// whose ranges cover all of it.
#[derive(Debug)]
pub struct ShardSets<T> {
    watchers: HashMap<u64, T>,
    /// Each key starts a segment that runs to the next key; 0 always
    /// starts one. Ids are sorted.
    segments: BTreeMap<u64, Vec<u64>>,
}

impl<T> Default for ShardSets<T> {
    fn default() -> Self {
        Self {
            watchers: HashMap::new(),
            segments: BTreeMap::from([(0, Vec::new())]),
        }
    }
}

impl<T> ShardSets<T> {
    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    /// Adds watcher `id` covering `ranges` (inclusive, apart).
    pub fn insert(&mut self, id: u64, ranges: &[(u64, u64)], watcher: T) {
        for &(first, last) in ranges {
            self.split(first);
            if let Some(after) = last.checked_add(1) {
                self.split(after);
            }
            for ids in self.segments.range_mut(first..=last).map(|(_, ids)| ids) {
                if let Err(at) = ids.binary_search(&id) {
                    ids.insert(at, id);
                }
            }
        }
        self.watchers.insert(id, watcher);
    }

    /// Takes watcher `id`, which covered `ranges`, out.
    pub fn remove(&mut self, id: u64, ranges: &[(u64, u64)]) -> Option<T> {
        let watcher = self.watchers.remove(&id)?;
        for &(first, last) in ranges {
            for ids in self.segments.range_mut(first..=last).map(|(_, ids)| ids) {
                if let Ok(at) = ids.binary_search(&id) {
                    ids.remove(at);
                }
            }
            self.join(first);
            if let Some(after) = last.checked_add(1) {
                self.join(after);
            }
        }
        Some(watcher)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.watchers.get_mut(&id)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.watchers.values()
    }

    pub fn into_values(self) -> impl Iterator<Item = T> {
        self.watchers.into_values()
    }

    /// Calls `f` once for each watcher whose ranges hold `now` or
    /// `before` (the hashes of an object's new and previous state).
    pub fn for_each_holding(
        &mut self,
        now: Option<u64>,
        before: Option<u64>,
        mut f: impl FnMut(u64, &mut T),
    ) {
        let Self { watchers, segments } = self;
        let segment = |h: u64| segments.range(..=h).next_back();
        let first = now.or(before).and_then(segment);
        let second = before.filter(|_| now.is_some()).and_then(segment);
        let second = second.filter(|(start, _)| Some(*start) != first.map(|(s, _)| s));
        if let Some((_, ids)) = first {
            for id in ids {
                if let Some(w) = watchers.get_mut(id) {
                    f(*id, w);
                }
            }
        }
        if let (Some((_, ids)), Some((_, seen))) = (second, first) {
            for id in ids.iter().filter(|id| seen.binary_search(id).is_err()) {
                if let Some(w) = watchers.get_mut(id) {
                    f(*id, w);
                }
            }
        }
    }

    /// Starts a segment at `at`, holding what the segment it cuts held.
    fn split(&mut self, at: u64) {
        if self.segments.contains_key(&at) {
            return;
        }
        let ids = match self.segments.range(..at).next_back() {
            Some((_, ids)) => ids.clone(),
            None => Vec::new(),
        };
        self.segments.insert(at, ids);
    }

    /// Joins the segment at `at` to the one before when they hold the same
    /// watchers.
    fn join(&mut self, at: u64) {
        if at == 0 {
            return;
        }
        let same = match (
            self.segments.range(..at).next_back(),
            self.segments.get(&at),
        ) {
            (Some((_, before)), Some(here)) => before == here,
            _ => false,
        };
        if same {
            self.segments.remove(&at);
        }
    }

    #[cfg(test)]
    fn segments(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn holding(s: &mut ShardSets<()>, now: Option<u64>, before: Option<u64>) -> Vec<u64> {
        let mut ids = Vec::new();
        s.for_each_holding(now, before, |id, _| ids.push(id));
        ids.sort_unstable();
        ids
    }

    #[test]
    fn tiles_find_one_watcher_each() {
        let mut s = ShardSets::default();
        let step = u64::MAX / 16 + 1;
        for i in 0..16u64 {
            s.insert(i, &[(i * step, (i * step).wrapping_add(step - 1))], ());
        }
        assert_eq!(s.segments(), 16);
        assert_eq!(holding(&mut s, Some(0), None), [0]);
        assert_eq!(holding(&mut s, Some(u64::MAX), None), [15]);
        assert_eq!(holding(&mut s, Some(step * 3), Some(step * 3 + 5)), [3]);
        assert_eq!(holding(&mut s, Some(step * 3), Some(step * 9)), [3, 9]);
        assert_eq!(holding(&mut s, None, Some(step * 9)), [9]);
        for i in 0..16u64 {
            let range = (i * step, (i * step).wrapping_add(step - 1));
            assert!(s.remove(i, &[range]).is_some());
        }
        assert_eq!(s.segments(), 1);
        assert!(s.is_empty());
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        /// After any inserts and removals, the watchers found for a pair
        /// of hashes are exactly those whose ranges hold one of them, and
        /// no segment outlives the edges that made it.
        #[test]
        fn finds_what_a_scan_of_every_range_finds(
            watchers in proptest::collection::vec(
                proptest::collection::vec((0u64..64, 0u64..64), 1..4), 1..12),
            leave in proptest::collection::vec(any::<bool>(), 12),
            probes in proptest::collection::vec((0u64..70, proptest::option::of(0u64..70)), 24),
        ) {
            // Small hashes, so ranges meet and overlap often; a range
            // reaching 63 runs to the top of the space.
            let ranges: Vec<Vec<(u64, u64)>> = watchers
                .iter()
                .map(|rs| {
                    let mut rs: Vec<(u64, u64)> = rs
                        .iter()
                        .map(|&(a, b)| (a.min(b), if a.max(b) == 63 { u64::MAX } else { a.max(b) }))
                        .collect();
                    rs.sort_unstable();
                    rs.dedup_by(|b, a| b.0 <= a.1.saturating_add(1) && { a.1 = a.1.max(b.1); true });
                    rs
                })
                .collect();
            let mut s = ShardSets::default();
            for (id, rs) in ranges.iter().enumerate() {
                s.insert(id as u64, rs, ());
            }
            let mut live = vec![true; ranges.len()];
            for (id, rs) in ranges.iter().enumerate() {
                if leave[id] {
                    prop_assert!(s.remove(id as u64, rs).is_some());
                    live[id] = false;
                }
            }
            for (now, before) in probes {
                let holds = |h: u64| move |rs: &Vec<(u64, u64)>| rs.iter().any(|&(a, b)| a <= h && h <= b);
                let want: Vec<u64> = (0..ranges.len())
                    .filter(|&id| live[id])
                    .filter(|&id| holds(now)(&ranges[id]) || before.is_some_and(|b| holds(b)(&ranges[id])))
                    .map(|id| id as u64)
                    .collect();
                prop_assert_eq!(holding(&mut s, Some(now), before), want);
            }
            let edges: std::collections::BTreeSet<u64> = (0..ranges.len())
                .filter(|&id| live[id])
                .flat_map(|id| ranges[id].iter().flat_map(|&(a, b)| [Some(a), b.checked_add(1)]))
                .flatten()
                .chain([0])
                .collect();
            prop_assert!(s.segments() <= edges.len());
        }
    }
}
