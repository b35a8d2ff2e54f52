//! Key ranges as etcd's API names them, and where they lie among the
//! served resources: a range inside one resource's prefix (and, where the
//! keys say, one namespace's) is that resource's query.

use std::fmt;
use std::ops::Bound;

use super::EtcdApi;
use crate::api::error::ApiError;
use crate::api::Served;
use crate::config::Outside;
use crate::object::{range_end, Resource};

/// `[start, end)` of etcd's key space, as a request's `key` and
/// `range_end` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: End,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `range_end` empty: the key alone.
    Key,
    /// `range_end` "\0": every key from `start` on.
    Unbounded,
    Before(Vec<u8>),
}

impl KeyRange {
    /// The range etcd reads for `key` and `range_end`; `key` empty is
    /// refused, as etcd refuses it for a read.
    pub fn parse(key: &[u8], range_end: &[u8]) -> Result<Self, ApiError> {
        if key.is_empty() {
            return Err(ApiError::invalid("key", "etcdserver: key is not provided"));
        }
        Ok(Self::of(key, range_end))
    }

    /// The range etcd watches: an empty key means the smallest one, "\0".
    pub fn watched(key: &[u8], range_end: &[u8]) -> Self {
        match key.is_empty() {
            true => Self::of(&[0], range_end),
            false => Self::of(key, range_end),
        }
    }

    fn of(key: &[u8], range_end: &[u8]) -> Self {
        let end = match range_end {
            [] => End::Key,
            [0] => End::Unbounded,
            end => End::Before(end.to_vec()),
        };
        Self {
            start: key.to_vec(),
            end,
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match &self.end {
            End::Key => key == self.start,
            End::Unbounded => key >= &self.start[..],
            End::Before(end) => key >= &self.start[..] && key < &end[..],
        }
    }

    /// Its keys as bounds of a key-ordered map.
    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let end = match &self.end {
            End::Key => Bound::Included(self.start.as_slice()),
            End::Unbounded => Bound::Unbounded,
            End::Before(end) => Bound::Excluded(end.as_slice()),
        };
        (Bound::Included(self.start.as_slice()), end)
    }

    /// Whether no key outside `[start, end)` is in it.
    fn within(&self, start: &[u8], end: &[u8]) -> bool {
        self.start.as_slice() >= start
            && match &self.end {
                End::Key => self.start.as_slice() < end,
                End::Unbounded => false,
                End::Before(e) => e.as_slice() <= end,
            }
    }

    pub fn is_key(&self) -> bool {
        self.end == End::Key
    }

    /// Whether every key of `resource` is in it.
    pub fn covers(&self, resource: &Resource) -> bool {
        let (start, end) = (resource.key_prefix(), resource.key_range_end());
        self.start.as_slice() <= start.as_bytes()
            && self
                .end_key()
                .is_none_or(|e| e.as_slice() >= end.as_bytes())
    }

    /// The first key after the range; none when it runs to the end of
    /// the key space.
    pub fn end_key(&self) -> Option<Vec<u8>> {
        match &self.end {
            End::Key => Some([&self.start[..], &[0]].concat()),
            End::Unbounded => None,
            End::Before(end) => Some(end.clone()),
        }
    }

    /// The part of the range inside `[start, end)`, if any key is.
    fn clip(&self, start: &[u8], end: &[u8]) -> Option<KeyRange> {
        if self.within(start, end) {
            return Some(self.clone());
        }
        let from = self.start.as_slice().max(start);
        let to = match self.end_key() {
            Some(e) => e.min(end.to_vec()),
            None => end.to_vec(),
        };
        (from < to.as_slice()).then(|| KeyRange {
            start: from.to_vec(),
            end: End::Before(to),
        })
    }

    /// What of the range lies outside `parts`, which are inside it, in key
    /// order and apart.
    fn gaps<'a>(&self, parts: impl Iterator<Item = &'a KeyRange>) -> Vec<KeyRange> {
        let mut gaps = Vec::new();
        let mut cursor = Some(self.start.clone());
        let end = self.end_key();
        for part in parts {
            let Some(from) = cursor.take() else { break };
            if from < part.start {
                gaps.push(KeyRange {
                    start: from,
                    end: End::Before(part.start.clone()),
                });
            }
            cursor = part.end_key();
        }
        match (cursor, end) {
            (Some(from), None) => gaps.push(KeyRange {
                start: from,
                end: End::Unbounded,
            }),
            (Some(from), Some(end)) if from < end => gaps.push(KeyRange {
                start: from,
                end: End::Before(end),
            }),
            _ => {}
        }
        // A single key no resource holds is its own gap, as asked.
        if self.is_key() && gaps.len() == 1 {
            return vec![self.clone()];
        }
        gaps
    }

    /// `key` and `range_end` as etcd's requests name the range.
    pub fn etcd_bounds(&self) -> (Vec<u8>, Vec<u8>) {
        let end = match &self.end {
            End::Key => Vec::new(),
            End::Unbounded => vec![0],
            End::Before(end) => end.clone(),
        };
        (self.start.clone(), end)
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match &self.end {
            End::Key => write!(f, "{:?}", text(&self.start)),
            End::Unbounded => write!(f, "[{:?}, end of keys)", text(&self.start)),
            End::Before(end) => write!(f, "[{:?}, {:?})", text(&self.start), text(end)),
        }
    }
}

/// etcd's revision as far as the cache of `s` is known to follow it: the
/// revision etcd's headers name.
pub fn current(s: &Served) -> crate::object::Revision {
    let p = s.cache.progress();
    p.revision.max(p.valid_through)
}

/// A part of a range inside one served resource's prefix, and the
/// namespace whose keys hold it all (empty: more than one, or a
/// cluster-scoped resource).
pub struct Located<'a> {
    pub served: &'a Served,
    pub namespace: String,
    pub range: KeyRange,
}

/// Where a range's keys are served from, in key order: its parts inside
/// the served resources' prefixes, and the gaps no resource holds (read
/// from etcd, with `etcd_api.outside: forward`).
pub struct Placement<'a> {
    pub parts: Vec<Located<'a>>,
    pub gaps: Vec<KeyRange>,
}

impl Placement<'_> {
    /// The resource that holds all of the range, if one does.
    pub fn whole(&self) -> Option<&Located<'_>> {
        match (&self.parts[..], self.gaps.is_empty()) {
            ([one], true) => Some(one),
            _ => None,
        }
    }

    /// The names of the resources it reads.
    pub fn resources(&self) -> Vec<String> {
        (self.parts.iter())
            .map(|p| p.served.cache.resource.name.clone())
            .collect()
    }
}

impl EtcdApi {
    /// Where the keys of `range` are served from; a range that reaches
    /// outside the served prefixes is refused unless gaps are forwarded,
    /// naming the prefixes of the resources `readable` says its caller
    /// may read, and only those.
    pub(super) fn place(
        &self,
        range: &KeyRange,
        readable: impl Fn(&Resource) -> bool,
    ) -> Result<Placement<'_>, ApiError> {
        let mut parts: Vec<Located<'_>> = Vec::new();
        for served in self.core.all_served() {
            let resource = &served.cache.resource;
            let (start, end) = (resource.key_prefix(), resource.key_range_end());
            if let Some(part) = range.clip(start.as_bytes(), end.as_bytes()) {
                let namespace = namespace_of(resource, &part).unwrap_or_default();
                parts.push(Located {
                    served,
                    namespace,
                    range: part,
                });
            }
        }
        parts.sort_by(|a, b| a.range.start.cmp(&b.range.start));
        let gaps = range.gaps(parts.iter().map(|p| &p.range));
        if !gaps.is_empty() && self.outside == Outside::Refuse {
            let mut served: Vec<String> = (self.core.all_served())
                .map(|s| &s.cache.resource)
                .filter(|r| readable(r))
                .map(|r| r.key_prefix())
                .collect();
            served.sort_unstable();
            let served = match served.is_empty() {
                true => "none this caller may read".to_owned(),
                false => served.join(", "),
            };
            return Err(ApiError::OutsideServedKeys {
                range: range.to_string(),
                served,
            });
        }
        Ok(Placement { parts, gaps })
    }
}

/// The namespace whose key prefix holds all of `range`, where the
/// resource's keys name one first.
fn namespace_of(resource: &Resource, range: &KeyRange) -> Option<String> {
    let prefix = resource.key_prefix();
    let rest = range.start.get(prefix.len()..)?;
    let namespace = std::str::from_utf8(&rest[..rest.iter().position(|&b| b == b'/')?]).ok()?;
    let own = resource.namespace_prefix(namespace);
    (!namespace.is_empty() && own != prefix)
        .then(|| range.within(own.as_bytes(), range_end(&own).as_bytes()))?
        .then(|| namespace.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_a_key_a_prefix_or_everything_after_a_key() {
        let key = KeyRange::parse(b"/p/ns/a", b"").unwrap();
        assert!(key.contains(b"/p/ns/a") && !key.contains(b"/p/ns/ab"));
        let prefix = KeyRange::parse(b"/p/", b"/p0").unwrap();
        assert!(prefix.contains(b"/p/x") && !prefix.contains(b"/p0"));
        let after = KeyRange::parse(b"/p/b", b"\0").unwrap();
        assert!(after.contains(b"/z") && !after.contains(b"/p/a"));
        assert!(KeyRange::parse(b"", b"").is_err());
        assert!(KeyRange::watched(b"", b"\0").contains(b"\0"));
    }

    #[test]
    fn a_range_lies_in_a_namespace_only_when_all_its_keys_do() {
        let r = Resource::for_tests(&[]);
        let ns = |key: &[u8], end: &[u8]| namespace_of(&r, &KeyRange::parse(key, end).unwrap());
        assert_eq!(ns(b"/p/ns/a", b""), Some("ns".into()));
        assert_eq!(ns(b"/p/ns/", b"/p/ns0"), Some("ns".into()));
        assert_eq!(ns(b"/p/ns/w", b"/p/ns/x"), Some("ns".into()));
        // Reaches into the next namespace.
        assert_eq!(ns(b"/p/ns/", b"/p/nt"), None);
        assert_eq!(ns(b"/p/", b"/p0"), None);
        assert_eq!(ns(b"/p/ns", b"/p/nt"), None);
    }

    #[test]
    fn a_range_over_several_prefixes_is_their_parts_and_the_gaps_between() {
        let range = KeyRange::parse(b"/r/", b"/r0").unwrap();
        let a = range.clip(b"/r/a/", b"/r/a0").unwrap();
        let b = range.clip(b"/r/b/", b"/r/b0").unwrap();
        assert!(range.clip(b"/s/", b"/s0").is_none());
        assert_eq!(a, KeyRange::parse(b"/r/a/", b"/r/a0").unwrap());
        let gaps = range.gaps([&a, &b].into_iter());
        let expect = [
            (&b"/r/"[..], &b"/r/a/"[..]),
            (b"/r/a0", b"/r/b/"),
            (b"/r/b0", b"/r0"),
        ]
        .map(|(k, e)| KeyRange::parse(k, e).unwrap());
        assert_eq!(gaps, expect);
        // A range inside one prefix is that part whole, with no gap.
        let inside = KeyRange::parse(b"/r/a/x", b"").unwrap();
        let part = inside.clip(b"/r/a/", b"/r/a0").unwrap();
        assert_eq!(part, inside);
        assert!(inside.gaps([&part].into_iter()).is_empty());
        // Everything from a key on: the gap after the last part is open.
        let after = KeyRange::parse(b"/r/b/x", b"\0").unwrap();
        let part = after.clip(b"/r/b/", b"/r/b0").unwrap();
        let gaps = after.gaps([&part].into_iter());
        assert_eq!(gaps, [KeyRange::parse(b"/r/b0", b"\0").unwrap()]);
        // A key no resource holds is itself the gap.
        let key = KeyRange::parse(b"/s/k", b"").unwrap();
        assert_eq!(key.gaps(std::iter::empty()), std::slice::from_ref(&key));
        // Whether a watch must look at each key its caches show.
        let p = Resource::for_tests(&[]);
        assert!(KeyRange::parse(b"/p/", b"/p0").unwrap().covers(&p));
        assert!(KeyRange::parse(b"/", b"\0").unwrap().covers(&p));
        assert!(!KeyRange::parse(b"/p/ns/", b"/p/ns0").unwrap().covers(&p));
        assert!(!KeyRange::parse(b"/p/", b"").unwrap().covers(&p));
    }

    #[test]
    fn a_range_within_a_prefix_holds_no_key_outside_it() {
        let within =
            |key: &[u8], end: &[u8]| KeyRange::parse(key, end).unwrap().within(b"/p/", b"/p0");
        assert!(within(b"/p/", b"/p0"));
        assert!(within(b"/p/a", b""));
        assert!(!within(b"/p", b"/q"));
        assert!(!within(b"/p/", b"\0"));
        assert!(!within(b"/o", b""));
    }
}
