//! Shard selectors: the objects whose shard field hashes into one of a
//! set of ranges ([`crate::object::shard_hash`]).

use crate::object::{Object, Resource};

/// The most ranges one selector may list.
pub const MAX_RANGES: usize = 256;

/// A shard: hash ranges over one shard field, ORed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shard {
    /// The field's position among the resource's shard fields.
    field: usize,
    /// Inclusive `(first, last)`, sorted, neither overlapping nor touching.
    ranges: Vec<(u64, u64)>,
}

/// A shard selector that cannot be served; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("{field:?} is not a shard field of {resource}; use one of: {known}")]
    UnknownField {
        field: String,
        resource: String,
        known: String,
    },
    #[error("a shard needs at least one range")]
    NoRanges,
    #[error("a shard takes at most {MAX_RANGES} ranges, not {0}")]
    TooManyRanges(usize),
    #[error("range [{start}, {end}) is empty: start must be below end (end 0 means 2^64)")]
    EmptyRange { start: u64, end: u64 },
}

impl Shard {
    /// The shard of `field` covering `ranges`, each `[start, end)` with
    /// `end` 0 meaning 2^64.
    pub fn new(
        resource: &Resource,
        field: &str,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<Self, ShardError> {
        let at = resource
            .shard_field(field)
            .ok_or_else(|| ShardError::UnknownField {
                field: field.to_owned(),
                resource: resource.name.clone(),
                known: resource.shard_fields().collect::<Vec<_>>().join(", "),
            })?;
        let mut inclusive = Vec::new();
        for (start, end) in ranges {
            if end != 0 && start >= end {
                return Err(ShardError::EmptyRange { start, end });
            }
            inclusive.push((start, end.wrapping_sub(1)));
        }
        match inclusive.len() {
            0 => return Err(ShardError::NoRanges),
            n if n > MAX_RANGES => return Err(ShardError::TooManyRanges(n)),
            _ => {}
        }
        inclusive.sort_unstable();
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(inclusive.len());
        for (first, last) in inclusive {
            match ranges.last_mut() {
                Some(prev) if prev.1 == u64::MAX || first <= prev.1 + 1 => {
                    prev.1 = prev.1.max(last)
                }
                _ => ranges.push((first, last)),
            }
        }
        Ok(Self { field: at, ranges })
    }

    /// The shard field's position among the resource's shard fields.
    pub fn field(&self) -> usize {
        self.field
    }

    /// The ranges, inclusive, sorted and apart.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// The ranges as requests write them: `[start, end)`, `end` 0 for 2^64.
    pub fn half_open(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (self.ranges.iter()).map(|&(first, last)| (first, last.wrapping_add(1)))
    }

    pub fn contains(&self, hash: u64) -> bool {
        let at = self.ranges.partition_point(|&(_, last)| last < hash);
        self.ranges.get(at).is_some_and(|&(first, _)| first <= hash)
    }

    pub fn matches(&self, o: &Object) -> bool {
        self.contains(o.shard_hash(self.field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shard(ranges: &[(u64, u64)]) -> Result<Shard, ShardError> {
        Shard::new(
            &Resource::for_tests(&["spec.nodeName"]),
            "metadata.name",
            ranges.iter().copied(),
        )
    }

    #[test]
    fn ranges_are_half_open_and_end_zero_is_the_top() {
        let s = shard(&[(10, 20), (1 << 63, 0)]).unwrap();
        for (h, want) in [(9, false), (10, true), (19, true), (20, false)] {
            assert_eq!(s.contains(h), want, "{h}");
        }
        assert!(s.contains(u64::MAX) && s.contains(1 << 63) && !s.contains((1 << 63) - 1));
        assert!(shard(&[(0, 0)]).unwrap().contains(0));
        assert_eq!(
            shard(&[(0, 0)]).unwrap().half_open().collect::<Vec<_>>(),
            [(0, 0)]
        );
    }

    #[test]
    fn overlapping_and_touching_ranges_merge() {
        let s = shard(&[(30, 40), (5, 10), (10, 20), (35, 50)]).unwrap();
        assert_eq!(s.ranges(), [(5, 19), (30, 49)]);
        assert_eq!(s.half_open().collect::<Vec<_>>(), [(5, 20), (30, 50)]);
        let top = shard(&[(5, 0), (u64::MAX, 0), (2, 6)]).unwrap();
        assert_eq!(top.ranges(), [(2, u64::MAX)]);
    }

    #[test]
    fn bad_shards_say_what_is_wrong() {
        assert_eq!(shard(&[]), Err(ShardError::NoRanges));
        assert_eq!(
            shard(&[(7, 7)]),
            Err(ShardError::EmptyRange { start: 7, end: 7 })
        );
        assert!(matches!(
            shard(&[(9, 3)]),
            Err(ShardError::EmptyRange { .. })
        ));
        let many: Vec<(u64, u64)> = (0..=MAX_RANGES as u64).map(|i| (i, i + 1)).collect();
        assert!(matches!(shard(&many), Err(ShardError::TooManyRanges(_))));
        let r = Resource::for_tests(&["spec.nodeName"]);
        let e = Shard::new(&r, "spec.color", [(0, 0)]).unwrap_err();
        assert!(e.to_string().contains("metadata.uid, spec.nodeName"), "{e}");
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        /// A hash is in the shard exactly when one of the requested ranges
        /// holds it.
        #[test]
        fn contains_is_the_union_of_the_ranges(
            ranges in proptest::collection::vec((any::<u64>(), any::<u64>()), 1..8),
            probes in proptest::collection::vec(any::<u64>(), 16),
        ) {
            let ranges: Vec<(u64, u64)> = ranges
                .into_iter()
                .map(|(a, b)| match (a, b) {
                    _ if a < b || b == 0 => (a, b),
                    _ if a > b => (b, a),
                    _ => (a, 0),
                })
                .collect();
            let s = shard(&ranges).unwrap();
            let edges = ranges.iter().flat_map(|&(a, b)| [a, b, a.wrapping_sub(1), b.wrapping_sub(1)]);
            for h in probes.into_iter().chain(edges) {
                let want = ranges.iter().any(|&(a, b)| h >= a && (b == 0 || h < b));
                prop_assert_eq!(s.contains(h), want, "{} in {:?}", h, ranges);
            }
        }
    }
}
