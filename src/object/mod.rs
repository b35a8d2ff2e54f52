//! The boundary types every stage shares: the resource, its objects, change
//! events, and resource versions.

mod decode;
mod encoding;
mod event;
mod key;
mod kubernetes;
mod labels;
mod projection;
mod shard;

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;

use crate::config::{KeyLayout, ResourceConfig, ValueFormat};
pub use decode::DecodeError;
use encoding::key_in;
pub(crate) use encoding::{encode, Head};
pub use event::{Event, EventType};
pub use kubernetes::{pod_as_stored, storage_encoding};
pub use labels::{FieldValues, LabelSet, Meta};
pub use projection::{Projection, ProjectionError};
pub use shard::shard_hash;

/// `metadata.labels` of an object.
pub type Labels = BTreeMap<String, String>;

/// An etcd revision. etcd never hands out 0, so 0 means "none yet".
pub type Revision = u64;

/// A configured resource: an etcd key prefix and how its keys and values
/// are read.
#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    /// Without the trailing '/'.
    pub prefix: String,
    pub namespaced: bool,
    /// Where its keys hold the namespace and name.
    pub layout: KeyLayout,
    /// The most its cache may hold: objects, and the window's events.
    pub max_bytes: Option<u64>,
    pub format: ValueFormat,
    /// Dotted JSON paths; an object's `fields` hold their values in this order.
    pub selectable_fields: Vec<String>,
    pub indexed_fields: Vec<String>,
}

impl From<&ResourceConfig> for Resource {
    fn from(c: &ResourceConfig) -> Self {
        Self {
            name: c.name.clone(),
            prefix: c.prefix.clone(),
            namespaced: c.namespaced,
            layout: c.layout(),
            max_bytes: c.max_bytes,
            format: c.format,
            selectable_fields: c.selectable_fields.clone(),
            indexed_fields: c.indexed_fields.clone(),
        }
    }
}

impl Resource {
    /// A namespaced JSON resource under `prefix`, keyed
    /// `<prefix>/<namespace>/<name>`, with no memory budget: Kubernetes'
    /// pods, as the benchmarks and tests write them.
    pub fn namespaced_json(
        name: &str,
        prefix: &str,
        selectable_fields: &[&str],
        indexed_fields: &[&str],
    ) -> Self {
        let owned = |fields: &[&str]| fields.iter().map(|f| f.to_string()).collect();
        Self {
            name: name.into(),
            prefix: prefix.into(),
            namespaced: true,
            layout: KeyLayout::standard(true),
            max_bytes: None,
            format: ValueFormat::Json,
            selectable_fields: owned(selectable_fields),
            indexed_fields: owned(indexed_fields),
        }
    }

    /// Pods under `/p`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(selectable_fields: &[&str]) -> Self {
        Self::namespaced_json("pods", "/p", selectable_fields, &[])
    }

    /// Opaque values under `/p`, for unit tests of what does not read them.
    #[cfg(test)]
    pub(crate) fn raw_for_tests() -> Self {
        Self {
            format: ValueFormat::Raw,
            ..Self::for_tests(&[])
        }
    }

    /// Positions of the indexed fields among the selectable fields.
    pub fn indexed_positions(&self) -> Vec<usize> {
        self.indexed_fields
            .iter()
            .filter_map(|f| self.selectable_fields.iter().position(|s| s == f))
            .collect()
    }

    /// The key of a single-object request: a name, plus a namespace when
    /// the resource is namespaced.
    pub fn single_key(&self, namespace: Option<&str>, name: Option<&str>) -> Option<String> {
        match (name, namespace) {
            (Some(name), Some(ns)) => Some(self.key(ns, name)),
            (Some(name), None) if !self.namespaced => Some(self.key("", name)),
            _ => None,
        }
    }

    /// The watched range: every key under `<prefix>/`.
    pub fn key_prefix(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// The first key after every key of the prefix, for range requests.
    pub fn key_range_end(&self) -> String {
        range_end(&self.key_prefix())
    }

    /// The key of an object; `namespace` is ignored for cluster-scoped
    /// resources.
    pub fn key(&self, namespace: &str, name: &str) -> String {
        self.layout.key(&self.prefix, namespace, name)
    }

    /// The key prefix of one namespace: of everything, if not namespaced,
    /// `namespace` is empty, or the key layout puts the namespace after
    /// the name.
    pub fn namespace_prefix(&self, namespace: &str) -> String {
        (self.namespaced && !namespace.is_empty())
            .then(|| self.layout.namespace_prefix(&self.prefix, namespace))
            .flatten()
            .unwrap_or_else(|| self.key_prefix())
    }
}

/// The end of the key range of `prefix`, which ends with '/': the same
/// prefix ending with '0', the byte after '/'.
pub fn range_end(prefix: &str) -> String {
    debug_assert!(prefix.ends_with('/'));
    format!("{}0", &prefix[..prefix.len() - 1])
}

/// One stored object. Shared by `Arc` between the store, the event window
/// and every watcher it is sent to; never copied per watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Where its namespace and name lie in its key: start and end of each.
    spans: [u32; 4],
    /// The etcd mod revision of the key.
    pub revision: Revision,
    /// The rest of what etcd keeps of the key, for its own API.
    pub stored: KvMeta,
    /// Its labels, the values of the resource's selectable fields (in
    /// configured order) and the hashes of its shard fields
    /// ([`Resource::shard_fields`]).
    meta: Meta,
    /// Where the stored bytes start in `wire`; they run to its end.
    value_at: u32,
    /// The object as a `watchproxy.v1.Object` at its own revision, encoded
    /// once when it is read, so every event and initial state that shows
    /// this version sends these bytes instead of encoding it again. Its
    /// key is read from here, its first field, rather than kept apart.
    pub wire: Bytes,
}

/// What etcd keeps of a key besides its value and mod revision, shown on
/// etcd's own API as etcd shows it. Zero when the object came from a
/// core tier, whose API does not carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMeta {
    pub create_revision: Revision,
    /// Writes to the key since its creation (1 for the first).
    pub version: i64,
    pub lease: i64,
}

/// What an object is made of besides its key and encoding.
pub struct Parts {
    pub revision: Revision,
    pub meta: Meta,
}

impl Object {
    /// An object whose namespace and name lie at `namespace` and `name` in
    /// the key `wire` starts with (none when they do not, or it holds no
    /// key), with `wire` ending in its value of `value_len` bytes.
    pub fn new(
        namespace: Range<usize>,
        name: Range<usize>,
        parts: Parts,
        wire: Bytes,
        value_len: usize,
    ) -> Option<Self> {
        let key = std::str::from_utf8(key_in(&wire)).ok()?;
        key.get(namespace.clone())?;
        key.get(name.clone())?;
        Some(Self {
            spans: [namespace.start, namespace.end, name.start, name.end].map(|i| i as u32),
            revision: parts.revision,
            stored: KvMeta::default(),
            meta: parts.meta,
            value_at: wire.len().checked_sub(value_len)? as u32,
            wire,
        })
    }

    /// This object with what etcd keeps of its key besides the value.
    pub fn stored_as(self, stored: KvMeta) -> Self {
        Self { stored, ..self }
    }

    /// Its etcd key, as the store orders objects.
    pub fn key_bytes(&self) -> &[u8] {
        key_in(&self.wire)
    }

    /// Its etcd key (checked UTF-8 when it was read).
    pub fn key(&self) -> &str {
        std::str::from_utf8(self.key_bytes()).unwrap_or_default()
    }

    /// An object with an empty encoding, for tests of what reads only its
    /// key, labels and fields; `namespace` and `name` must be in `key`.
    #[cfg(test)]
    pub(crate) fn bare(
        key: &str,
        namespace: &str,
        name: &str,
        revision: Revision,
        labels: &[(&str, &str)],
        fields: &[&str],
    ) -> Self {
        let labels: Labels = (labels.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let parts = Parts {
            revision,
            meta: Meta::new(&labels, fields, &[]),
        };
        let head = Head {
            key,
            namespace,
            name,
            revision,
            labels: std::iter::empty(),
        };
        let at = |part: &str, found: Option<usize>| {
            let start = if part.is_empty() {
                0
            } else {
                found.expect("in the key")
            };
            start..start + part.len()
        };
        let (namespace, name) = (
            at(namespace, key.find(namespace)),
            at(name, key.rfind(name)),
        );
        Self::new(namespace, name, parts, encode(head, &[]), 0).expect("a key")
    }

    pub fn labels(&self) -> LabelSet<'_> {
        self.meta.labels()
    }

    /// The values of the resource's selectable fields, in configured order.
    pub fn fields(&self) -> FieldValues<'_> {
        self.meta.fields()
    }

    /// Empty for cluster-scoped resources.
    pub fn namespace(&self) -> &str {
        self.key_part(self.spans[0], self.spans[1])
    }

    pub fn name(&self) -> &str {
        self.key_part(self.spans[2], self.spans[3])
    }

    fn key_part(&self, start: u32, end: u32) -> &str {
        let part = self.key_bytes().get(start as usize..end as usize);
        part.and_then(|p| std::str::from_utf8(p).ok())
            .unwrap_or_default()
    }

    /// The stored bytes, as read from etcd.
    pub fn value(&self) -> &[u8] {
        &self.wire[self.value_at as usize..]
    }

    /// The stored bytes, sharing the encoding's buffer.
    pub fn value_bytes(&self) -> Bytes {
        self.wire.slice(self.value_at as usize..)
    }

    /// This object with another encoding (a projection's), ending in its
    /// value of `value_len` bytes.
    pub fn with_wire(&self, wire: Bytes, value_len: usize) -> Self {
        Self {
            value_at: wire.len().saturating_sub(value_len) as u32,
            wire,
            ..self.clone()
        }
    }
    /// About the memory this version takes: its encoding, the strings
    /// read from it, the object itself, allocation headers and its entries
    /// in the store and index maps. What a cache's byte budget counts.
    pub fn cost(&self) -> u64 {
        /// Allocation headers and rounding, and the entries in the store
        /// and index maps: what 100k pods of 1 KiB added to the process's
        /// RSS beyond the rest of this sum (`start-time`, docs/benchmarks.md).
        const OVERHEAD: usize = 160;
        (self.wire.len() + self.meta.heap_bytes() + std::mem::size_of::<Object>() + OVERHEAD) as u64
    }
}

/// A resource version older than the event window reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    /// The oldest revision the window still follows.
    pub oldest: Revision,
}

/// A resource version as a client asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestedVersion {
    /// Unset: the most recent state, consistent with etcd.
    Latest,
    /// "0": whatever the cache holds now.
    Any,
    /// "N".
    At(Revision),
}

/// A resource version that is not a decimal revision.
#[derive(Debug, thiserror::Error)]
#[error("invalid resource version {0:?}: expected a decimal number")]
pub struct BadVersion(pub String);

impl RequestedVersion {
    pub fn parse(s: &str) -> Result<Self, BadVersion> {
        match s {
            "" => Ok(Self::Latest),
            "0" => Ok(Self::Any),
            _ if s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0') => s
                .parse()
                .map(Self::At)
                .map_err(|_| BadVersion(s.to_owned())),
            _ => Err(BadVersion(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every object the cache holds pays for this struct in its `Arc`: a
    /// field added here costs 100k objects as much memory.
    #[test]
    fn an_object_stays_small() {
        assert!(std::mem::size_of::<Object>() <= 128);
        let o = Object::bare("/p/ns/a", "ns", "a", 1, &[("l", "v")], &["n"]);
        assert_eq!(o.labels().get("l"), Some("v"));
        assert_eq!(
            (o.namespace(), o.name(), o.fields().get(0)),
            ("ns", "a", Some("n"))
        );
    }

    #[test]
    fn the_wire_is_the_messages_own_encoding_with_the_value_at_its_end() {
        use prost::Message;
        let r = Resource::raw_for_tests();
        for value in [&b""[..], b"v", &[7u8; 300]] {
            let o = r.decode(b"/p/ns/a", value, 42).unwrap();
            let whole = crate::pb::Object {
                key: "/p/ns/a".into(),
                namespace: "ns".into(),
                name: "a".into(),
                resource_version: "42".into(),
                labels: Labels::new(),
                value: Bytes::copy_from_slice(value),
            };
            assert_eq!(o.wire, whole.encode_to_vec());
            assert_eq!(o.value(), value);
            assert_eq!(crate::pb::Object::decode(o.wire.clone()).unwrap(), whole);
        }
    }

    #[test]
    fn resource_versions_parse_like_kubernetes() {
        assert_eq!(
            RequestedVersion::parse("").unwrap(),
            RequestedVersion::Latest
        );
        assert_eq!(RequestedVersion::parse("0").unwrap(), RequestedVersion::Any);
        assert_eq!(
            RequestedVersion::parse("42").unwrap(),
            RequestedVersion::At(42)
        );
        for bad in ["-1", "abc", "007", "1.5", " 1", "99999999999999999999999"] {
            assert!(RequestedVersion::parse(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_resource_versions(s in crate::fuzzing::text("resource_version")) {
            match RequestedVersion::parse(&s) {
                Ok(RequestedVersion::At(n)) => proptest::prop_assert_eq!(n.to_string(), s),
                Ok(RequestedVersion::Any) => proptest::prop_assert_eq!(s, "0"),
                Ok(RequestedVersion::Latest) => proptest::prop_assert_eq!(s, ""),
                Err(_) => {}
            }
        }
    }
}
