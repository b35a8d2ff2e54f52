//! The boundary types every stage shares: the resource, its objects, change
//! events, and resource versions.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use crate::config::{ResourceConfig, ValueFormat};

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
            format: c.format,
            selectable_fields: c.selectable_fields.clone(),
            indexed_fields: c.indexed_fields.clone(),
        }
    }
}

/// Why a key/value pair could not become an [`Object`]. Such pairs are
/// skipped, logged and counted; they never stop the stream.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("key is not valid UTF-8")]
    KeyNotUtf8,
    #[error("key does not have the form {0}")]
    KeyShape(&'static str),
    #[error("value is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("value is JSON but not an object")]
    NotJsonObject,
    #[error("metadata.labels is not a map of strings")]
    BadLabels,
}

impl Resource {
    /// A namespaced JSON resource under `/p`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(selectable_fields: &[&str]) -> Self {
        Self {
            name: "pods".into(),
            prefix: "/p".into(),
            namespaced: true,
            format: ValueFormat::Json,
            selectable_fields: selectable_fields.iter().map(|f| f.to_string()).collect(),
            indexed_fields: vec![],
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
        if self.namespaced {
            format!("{}/{namespace}/{name}", self.prefix)
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The key prefix of one namespace (or of everything, if not namespaced
    /// or `namespace` is empty).
    pub fn namespace_prefix(&self, namespace: &str) -> String {
        if self.namespaced && !namespace.is_empty() {
            format!("{}/{namespace}/", self.prefix)
        } else {
            self.key_prefix()
        }
    }

    /// Reads a key/value pair from etcd into an object.
    pub fn decode(
        &self,
        key: &[u8],
        value: &[u8],
        revision: Revision,
    ) -> Result<Object, DecodeError> {
        let (namespace, name) = self.split_key(key)?;
        let (labels, fields) = match self.format {
            ValueFormat::Raw => (BTreeMap::new(), Box::default()),
            ValueFormat::Json => self.read_json(value)?,
        };
        let key = std::str::from_utf8(key).map_err(|_| DecodeError::KeyNotUtf8)?;
        let wire = crate::pb::Object {
            key: key.to_owned(),
            namespace: namespace.clone(),
            name: name.clone(),
            resource_version: revision.to_string(),
            labels: labels.clone(),
            value: Bytes::copy_from_slice(value),
        }
        .encode_to_vec();
        let wire = Bytes::from(wire);
        // The value is the last field written, so it is the end of `wire`.
        let value = wire.slice(wire.len() - value.len()..);
        Ok(Object {
            key: Arc::from(key),
            namespace,
            name,
            revision,
            labels,
            fields,
            value,
            wire,
        })
    }

    /// The namespace and name encoded in a key, for keys that hold no
    /// decodable value (deletions).
    pub fn split_key(&self, key: &[u8]) -> Result<(String, String), DecodeError> {
        let key = std::str::from_utf8(key).map_err(|_| DecodeError::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .ok_or(DecodeError::KeyShape(self.key_shape()))?;
        let mut parts = rest.split('/');
        let shape = (parts.next(), parts.next(), parts.next());
        match (self.namespaced, shape) {
            (true, (Some(ns), Some(name), None)) if !ns.is_empty() && !name.is_empty() => {
                Ok((ns.to_owned(), name.to_owned()))
            }
            (false, (Some(name), None, None)) if !name.is_empty() => {
                Ok((String::new(), name.to_owned()))
            }
            _ => Err(DecodeError::KeyShape(self.key_shape())),
        }
    }

    fn key_shape(&self) -> &'static str {
        if self.namespaced {
            "<prefix>/<namespace>/<name>"
        } else {
            "<prefix>/<name>"
        }
    }

    fn read_json(&self, value: &[u8]) -> Result<(Labels, Box<[String]>), DecodeError> {
        let doc: serde_json::Value = serde_json::from_slice(value).map_err(DecodeError::NotJson)?;
        if !doc.is_object() {
            return Err(DecodeError::NotJsonObject);
        }
        let labels = match doc.pointer("/metadata/labels") {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => map
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect::<Option<_>>()
                .ok_or(DecodeError::BadLabels)?,
            Some(_) => return Err(DecodeError::BadLabels),
        };
        let fields = self
            .selectable_fields
            .iter()
            .map(|path| field_string(path.split('.').try_fold(&doc, |v, step| v.get(step))))
            .collect();
        Ok((labels, fields))
    }
}

/// The end of the key range of `prefix`, which ends with '/': the same
/// prefix ending with '0', the byte after '/'.
pub fn range_end(prefix: &str) -> String {
    debug_assert!(prefix.ends_with('/'));
    format!("{}0", &prefix[..prefix.len() - 1])
}

/// A field's value as field selectors compare it: strings as they are,
/// other scalars in their JSON form, absent or null as "" (as Kubernetes).
fn field_string(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// One stored object. Shared by `Arc` between the store, the event window
/// and every watcher it is sent to; never copied per watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub key: Arc<str>,
    /// Empty for cluster-scoped resources.
    pub namespace: String,
    pub name: String,
    /// The etcd mod revision of the key.
    pub revision: Revision,
    pub labels: Labels,
    /// Values of the resource's selectable fields, in configured order.
    pub fields: Box<[String]>,
    /// The stored bytes; shares `wire`'s buffer.
    pub value: Bytes,
    /// The object as a `watchproxy.v1.Object` at its own revision, encoded
    /// once when it is read, so every event and initial state that shows
    /// this version sends these bytes instead of encoding it again.
    pub wire: Bytes,
}

/// What happened to a key, as etcd reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        })
    }
}

/// A change to one key at one revision. Carries the previous state too, so
/// each watcher can judge whether the object starts, keeps or stops matching
/// its selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub revision: Revision,
    pub kind: EventType,
    /// The new state; none for a deletion.
    pub object: Option<Arc<Object>>,
    /// The state before; none for a creation.
    pub prev: Option<Arc<Object>>,
}

impl Event {
    pub fn key(&self) -> &str {
        match (&self.object, &self.prev) {
            (Some(o), _) | (None, Some(o)) => &o.key,
            (None, None) => unreachable!("an event has an object or a previous object"),
        }
    }
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

    fn pods() -> Resource {
        Resource::for_tests(&["spec.nodeName", "spec.replicas"])
    }

    #[test]
    fn decode_reads_key_labels_and_fields() {
        let v =
            br#"{"metadata":{"labels":{"app":"web"}},"spec":{"nodeName":"node-1","replicas":3}}"#;
        let o = pods().decode(b"/p/default/web-1", v, 7).unwrap();
        assert_eq!(
            (o.namespace.as_str(), o.name.as_str(), o.revision),
            ("default", "web-1", 7)
        );
        assert_eq!(o.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(&*o.fields, ["node-1".to_string(), "3".to_string()]);
    }

    #[test]
    fn absent_fields_read_as_empty() {
        let o = pods().decode(b"/p/a/b", b"{}", 1).unwrap();
        assert_eq!(&*o.fields, [String::new(), String::new()]);
        assert!(o.labels.is_empty());
    }

    #[test]
    fn bad_keys_and_values_are_errors() {
        let r = pods();
        assert!(matches!(
            r.decode(b"/p/a", b"{}", 1),
            Err(DecodeError::KeyShape(_))
        ));
        assert!(matches!(
            r.decode(b"/p/a/b/c", b"{}", 1),
            Err(DecodeError::KeyShape(_))
        ));
        assert!(matches!(
            r.decode(b"/px/a/b", b"{}", 1),
            Err(DecodeError::KeyShape(_))
        ));
        assert!(matches!(
            r.decode(b"/p/a/b", b"{nope", 1),
            Err(DecodeError::NotJson(_))
        ));
        assert!(matches!(
            r.decode(b"/p/a/b", b"[1]", 1),
            Err(DecodeError::NotJsonObject)
        ));
        let bad_labels = br#"{"metadata":{"labels":{"a":1}}}"#;
        assert!(matches!(
            r.decode(b"/p/a/b", bad_labels, 1),
            Err(DecodeError::BadLabels)
        ));
    }

    #[test]
    fn raw_values_are_kept_as_bytes() {
        let mut r = pods();
        r.format = ValueFormat::Raw;
        r.selectable_fields.clear();
        let o = r.decode(b"/p/a/b", b"\xff\x00", 3).unwrap();
        assert_eq!(&o.value[..], b"\xff\x00");
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
}
