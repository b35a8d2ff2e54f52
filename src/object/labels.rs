//! An object's labels and field values as the cache keeps them, in two
//! allocations each. A `BTreeMap` of labels took a node of 544 bytes and
//! one allocation per key and value, about 700 bytes an object, more than
//! half of what a 1 KiB object costs beside its own bytes; a string per
//! field value took one allocation each.

use std::fmt;

use super::Labels;

/// Strings one after the other in one allocation, and where each ends
/// in another.
#[derive(Clone, Default, PartialEq, Eq)]
struct Strings {
    text: Box<str>,
    ends: Box<[u32]>,
}

impl Strings {
    fn new<'a>(items: impl Iterator<Item = &'a str> + Clone) -> Self {
        let mut text = String::with_capacity(items.clone().map(str::len).sum());
        let mut ends = Vec::with_capacity(items.clone().count());
        for item in items {
            text.push_str(item);
            ends.push(text.len() as u32);
        }
        Self {
            text: text.into(),
            ends: ends.into(),
        }
    }

    fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p] as usize);
        Some(&self.text[start..end])
    }

    fn heap_bytes(&self) -> usize {
        self.text.len() + 4 * self.ends.len()
    }
}

/// Labels: every key and value, one after the other, keys in order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LabelSet(Strings);

/// The values of a resource's selectable fields, in configured order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FieldValues(Strings);

impl FieldValues {
    pub fn get(&self, i: usize) -> Option<&str> {
        self.0.get(i)
    }

    pub fn len(&self) -> usize {
        self.0.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The bytes of its two allocations.
    pub fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
}

impl<S: AsRef<str>> From<&[S]> for FieldValues {
    fn from(values: &[S]) -> Self {
        Self(Strings::new(values.iter().map(AsRef::as_ref)))
    }
}

impl<S: AsRef<str>, const N: usize> From<[S; N]> for FieldValues {
    fn from(values: [S; N]) -> Self {
        Self::from(&values[..])
    }
}

impl fmt::Debug for FieldValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
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
        self.0.ends.len() / 2
    }

    /// The bytes of its two allocations.
    pub fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.0.ends.is_empty()
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

    fn key(&self, i: usize) -> &str {
        self.0.get(2 * i).unwrap_or_default()
    }

    fn value(&self, i: usize) -> &str {
        self.0.get(2 * i + 1).unwrap_or_default()
    }
}

impl From<&Labels> for LabelSet {
    fn from(labels: &Labels) -> Self {
        let items = labels.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]);
        Self(Strings::new(items))
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
