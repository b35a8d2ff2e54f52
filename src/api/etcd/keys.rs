//! Key ranges as etcd's API names them, and where they lie among the
//! served resources: a range inside one resource's prefix (and, where the
//! keys say, one namespace's) is that resource's query.

use std::fmt;

use super::super::error::ApiError;
use super::super::{Api, Served};
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

/// Where a range lies: a served resource, and the namespace whose keys
/// hold it all (empty: more than one, or a cluster-scoped resource).
pub struct Located<'a> {
    pub served: &'a Served,
    pub namespace: String,
}

impl Api {
    /// The served resource whose prefix holds all of `range`.
    pub(super) fn locate(&self, range: &KeyRange) -> Result<Located<'_>, ApiError> {
        for served in self.resources.values() {
            let resource = &served.cache.resource;
            let (start, end) = (resource.key_prefix(), resource.key_range_end());
            if range.within(start.as_bytes(), end.as_bytes()) {
                let namespace = namespace_of(resource, range).unwrap_or_default();
                return Ok(Located { served, namespace });
            }
        }
        let mut served: Vec<String> = (self.resources.values())
            .map(|s| s.cache.resource.key_prefix())
            .collect();
        served.sort_unstable();
        Err(ApiError::OutsideServedKeys {
            range: range.to_string(),
            served: served.join(", "),
        })
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
