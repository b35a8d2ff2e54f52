//! What an object's selectors read, kept in one allocation: its labels,
//! its field values and its shard hashes. A `BTreeMap` of labels took a
//! node of 544 bytes and one allocation per key and value, about 700 bytes
//! an object, more than half of what a 1 KiB object costs beside its own
//! bytes; a string per field value and a box of hashes took one allocation
//! each.

use std::fmt;

use super::Labels;

/// The layout: how many labels, field values and hashes (three 32-bit
/// words); where each label key, label value and field value ends in the
/// text (a word each); the hashes (eight bytes each); then the text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Meta(Box<[u8]>);

const COUNTS: usize = 3;

impl Meta {
    /// `labels` in key order, as a map gives them.
    pub fn new(labels: &Labels, fields: &[impl AsRef<str>], hashes: &[u64]) -> Self {
        let texts = || {
            (labels.iter())
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .chain(fields.iter().map(AsRef::as_ref))
        };
        let (ends, text) = texts().fold((0, 0), |(n, t), s| (n + 1, t + s.len()));
        if ends == 0 && hashes.is_empty() {
            return Self::default();
        }
        let mut buf = Vec::with_capacity(4 * (COUNTS + ends) + 8 * hashes.len() + text);
        for count in [labels.len(), fields.len(), hashes.len()] {
            buf.extend_from_slice(&(count as u32).to_le_bytes());
        }
        let mut end = 0u32;
        for item in texts() {
            end += item.len() as u32;
            buf.extend_from_slice(&end.to_le_bytes());
        }
        hashes
            .iter()
            .for_each(|h| buf.extend_from_slice(&h.to_le_bytes()));
        texts().for_each(|item| buf.extend_from_slice(item.as_bytes()));
        Self(buf.into())
    }

    pub fn labels(&self) -> LabelSet<'_> {
        LabelSet(self)
    }

    pub fn fields(&self) -> FieldValues<'_> {
        FieldValues(self)
    }

    /// The `i`th shard hash.
    pub fn hash(&self, i: usize) -> Option<u64> {
        if i >= self.count(2) {
            return None;
        }
        let at = 4 * (COUNTS + self.ends()) + 8 * i;
        let b = self.0.get(at..at + 8)?;
        Some(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    /// The bytes of its allocation.
    pub fn heap_bytes(&self) -> usize {
        self.0.len()
    }

    fn word(&self, i: usize) -> usize {
        (self.0.get(4 * i..4 * i + 4))
            .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    }

    /// How many labels (0), field values (1) or hashes (2).
    fn count(&self, which: usize) -> usize {
        self.word(which)
    }

    /// How many strings: two per label, one per field value.
    fn ends(&self) -> usize {
        2 * self.count(0) + self.count(1)
    }

    /// The `i`th string's bytes.
    fn bytes(&self, i: usize) -> Option<&[u8]> {
        let n = self.ends();
        if i >= n {
            return None;
        }
        let text = 4 * (COUNTS + n) + 8 * self.count(2);
        let start = if i == 0 { 0 } else { self.word(COUNTS + i - 1) };
        self.0.get(text + start..text + self.word(COUNTS + i))
    }

    /// Built from `str`s and cut at their ends, so always UTF-8.
    fn text(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.bytes(i)?).ok()
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hashes: Vec<u64> = (0..self.count(2)).filter_map(|i| self.hash(i)).collect();
        f.debug_struct("Meta")
            .field("labels", &self.labels())
            .field("fields", &self.fields())
            .field("hashes", &hashes)
            .finish()
    }
}

/// An object's labels, in key order.
#[derive(Clone, Copy)]
pub struct LabelSet<'a>(&'a Meta);

impl<'a> LabelSet<'a> {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&'a str> {
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
                std::cmp::Ordering::Equal => return self.0.text(2 * mid + 1),
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.0.count(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (key, value) in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + Clone + 'a {
        let meta = self.0;
        (0..self.len()).map(move |i| {
            let text = |j| meta.text(j).unwrap_or_default();
            (text(2 * i), text(2 * i + 1))
        })
    }

    /// As the map the protocol carries.
    pub fn to_map(&self) -> Labels {
        (self.iter())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

impl fmt::Debug for LabelSet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The values of a resource's selectable fields, in configured order.
#[derive(Clone, Copy)]
pub struct FieldValues<'a>(&'a Meta);

impl<'a> FieldValues<'a> {
    pub fn get(&self, i: usize) -> Option<&'a str> {
        (i < self.len())
            .then(|| self.0.text(2 * self.0.count(0) + i))
            .flatten()
    }

    pub fn len(&self) -> usize {
        self.0.count(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a str> + 'a {
        let fields = *self;
        (0..fields.len()).filter_map(move |i| fields.get(i))
    }
}

impl fmt::Debug for FieldValues<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<const N: usize> From<[(&str, &str); N]> for Meta {
    /// Labels alone.
    fn from(labels: [(&str, &str); N]) -> Self {
        let map: Labels = (labels.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::new(&map, &[] as &[&str], &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn meta_holds_what_it_was_made_of(
            map in proptest::collection::btree_map("[a-c]{0,3}", "\\PC{0,3}", 0..6),
            values in proptest::collection::vec("\\PC{0,5}", 0..5),
            hashes in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..6),
            probe in "[a-c]{0,3}",
        ) {
            let meta = Meta::new(&map, &values, &hashes);
            let (labels, fields) = (meta.labels(), meta.fields());
            proptest::prop_assert_eq!(labels.len(), map.len());
            proptest::prop_assert_eq!(labels.to_map(), map.clone());
            proptest::prop_assert_eq!(labels.get(&probe), map.get(&probe).map(String::as_str));
            proptest::prop_assert_eq!(fields.iter().collect::<Vec<_>>(), values.iter().map(String::as_str).collect::<Vec<_>>());
            proptest::prop_assert_eq!(fields.get(values.len()), None);
            let read: Vec<u64> = (0..=hashes.len()).filter_map(|i| meta.hash(i)).collect();
            proptest::prop_assert_eq!(read, hashes.clone());
            let empty = map.is_empty() && values.is_empty() && hashes.is_empty();
            proptest::prop_assert_eq!(meta.heap_bytes() == 0, empty, "no allocation when empty");
        }
    }
}
