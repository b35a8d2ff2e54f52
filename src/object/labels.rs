//! An object's labels and field values as the cache keeps them, in one
//! allocation each. A `BTreeMap` of labels took a node of 544 bytes and
//! one allocation per key and value, about 700 bytes an object, more than
//! half of what a 1 KiB object costs beside its own bytes; a string per
//! field value took one allocation each.

use std::fmt;

use super::Labels;

/// Strings in one allocation: how many there are, where each ends, then
/// their text one after the other. None: no allocation.
#[derive(Clone, Default, PartialEq, Eq)]
struct Strings(Box<[u8]>);

impl Strings {
    fn new<'a>(items: impl Iterator<Item = &'a str> + Clone) -> Self {
        let (count, text) = items.clone().fold((0, 0), |(n, t), s| (n + 1, t + s.len()));
        if count == 0 {
            return Self::default();
        }
        let mut buf = Vec::with_capacity(4 + 4 * count + text);
        buf.extend_from_slice(&(count as u32).to_le_bytes());
        let mut end = 0u32;
        for item in items.clone() {
            end += item.len() as u32;
            buf.extend_from_slice(&end.to_le_bytes());
        }
        items.for_each(|item| buf.extend_from_slice(item.as_bytes()));
        Self(buf.into())
    }

    fn len(&self) -> usize {
        self.word(0)
    }

    /// The `i`th 32-bit word: the count, then the ends.
    fn word(&self, i: usize) -> usize {
        (self.0.get(4 * i..4 * i + 4))
            .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    }

    fn bytes(&self, i: usize) -> Option<&[u8]> {
        let n = self.len();
        if i >= n {
            return None;
        }
        let text = 4 + 4 * n;
        let start = if i == 0 { 0 } else { self.word(i) };
        self.0.get(text + start..text + self.word(i + 1))
    }

    /// Built from `str`s and cut at their ends, so always UTF-8.
    fn get(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.bytes(i)?).ok()
    }

    fn heap_bytes(&self) -> usize {
        self.0.len()
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
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The bytes of its allocation.
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
            match self
                .0
                .bytes(2 * mid)
                .unwrap_or_default()
                .cmp(key.as_bytes())
            {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.value(mid)),
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.0.len() / 2
    }

    /// The bytes of its allocation.
    pub fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
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

        #[test]
        fn field_values_hold_what_they_were_made_of(
            values in proptest::collection::vec("\\PC{0,5}", 0..5),
        ) {
            let fields = FieldValues::from(&values[..]);
            proptest::prop_assert_eq!(fields.len(), values.len());
            proptest::prop_assert_eq!(fields.iter().collect::<Vec<_>>(), values.iter().map(String::as_str).collect::<Vec<_>>());
            proptest::prop_assert_eq!(fields.get(values.len()), None);
            let empty = values.is_empty();
            proptest::prop_assert_eq!(fields.heap_bytes() == 0, empty, "no allocation when empty");
        }
    }
}
