//! An object's labels as the cache keeps them: sorted by key, in two
//! allocations. A `BTreeMap` of them took a node of 544 bytes and one
//! allocation per key and value, about 700 bytes an object, more than half
//! of what a 1 KiB object costs beside its own bytes.

use std::fmt;

use super::Labels;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct LabelSet {
    /// Every key and value, one after the other, keys in order.
    text: Box<str>,
    /// Where each key and each value ends in `text`.
    ends: Box<[u32]>,
}

impl LabelSet {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.value(mid)),
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// The bytes of its two allocations.
    pub fn heap_bytes(&self) -> usize {
        self.text.len() + 4 * self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// (key, value) in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        (0..self.len()).map(|i| (self.key(i), self.value(i)))
    }

    /// As the map the protocol carries.
    pub fn to_map(&self) -> Labels {
        (self.iter())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn start(&self, at: usize) -> usize {
        at.checked_sub(1).map_or(0, |p| self.ends[p] as usize)
    }

    fn key(&self, i: usize) -> &str {
        &self.text[self.start(2 * i)..self.ends[2 * i] as usize]
    }

    fn value(&self, i: usize) -> &str {
        &self.text[self.start(2 * i + 1)..self.ends[2 * i + 1] as usize]
    }
}

impl From<&Labels> for LabelSet {
    fn from(labels: &Labels) -> Self {
        let mut text = String::with_capacity(labels.iter().map(|(k, v)| k.len() + v.len()).sum());
        let mut ends = Vec::with_capacity(2 * labels.len());
        for (k, v) in labels {
            text.push_str(k);
            ends.push(text.len() as u32);
            text.push_str(v);
            ends.push(text.len() as u32);
        }
        Self {
            text: text.into(),
            ends: ends.into(),
        }
    }
}

impl<const N: usize> From<[(&str, &str); N]> for LabelSet {
    fn from(labels: [(&str, &str); N]) -> Self {
        let map: Labels = (labels.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::from(&map)
    }
}

impl fmt::Debug for LabelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn a_label_set_holds_what_its_map_holds(
            map in proptest::collection::btree_map("[a-c]{0,3}", "[x-z]{0,3}", 0..6),
            probe in "[a-c]{0,3}",
        ) {
            let set = LabelSet::from(&map);
            proptest::prop_assert_eq!(set.len(), map.len());
            proptest::prop_assert_eq!(set.to_map(), map.clone());
            proptest::prop_assert_eq!(set.get(&probe), map.get(&probe).map(String::as_str));
        }
    }
}
