//! Reading etcd's key/value pairs into objects: namespace and name from
//! the key; labels and selectable fields from a JSON value in one pass;
//! the object's own `watchproxy.v1.Object` encoding, made once.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{encode, Head, Labels, Meta, Object, Parts, Resource, Revision};
use crate::config::ValueFormat;

/// Why a key/value pair could not become an [`Object`]. Such pairs are
/// skipped, logged and counted; they never stop the stream.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("key is not valid UTF-8")]
    KeyNotUtf8,
    #[error("key does not have the form {0}")]
    KeyShape(String),
    #[error("value is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("value is JSON but not an object")]
    NotJsonObject,
    #[error("metadata.labels is not a map of strings")]
    BadLabels,
    #[error("value is encrypted at rest ({0}); watchproxy cannot read it")]
    Encrypted(String),
    #[error("value is neither Kubernetes protobuf nor JSON")]
    NotKubernetes,
    #[error("value is not Kubernetes protobuf: {0}")]
    NotProtobuf(String),
}

/// Where `part`, a slice of `key` (or empty), lies in it.
fn span(key: &str, part: &str) -> std::ops::Range<usize> {
    if part.is_empty() {
        return 0..0;
    }
    let start = part.as_ptr() as usize - key.as_ptr() as usize;
    start..start + part.len()
}

impl Resource {
    /// Reads a key/value pair from etcd into an object.
    pub fn decode(
        &self,
        key: &[u8],
        value: &[u8],
        revision: Revision,
    ) -> Result<Object, DecodeError> {
        let key = std::str::from_utf8(key).map_err(|_| DecodeError::KeyNotUtf8)?;
        let (namespace, name) = self.split(key)?;
        let (labels, fields, uid) = match self.format {
            ValueFormat::Raw => (BTreeMap::new(), Box::default(), String::new()),
            ValueFormat::Json => self.read_json(value)?,
            ValueFormat::Kubernetes => self.read_kubernetes(value)?,
        };
        let shard_hashes = self.shard_hashes(namespace, name, &uid, &fields);
        let head = Head {
            key,
            namespace,
            name,
            revision,
            labels: labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        };
        let wire = encode(head, value);
        let parts = Parts {
            revision,
            meta: Meta::new(&labels, &fields, &shard_hashes),
        };
        let (namespace, name) = (span(key, namespace), span(key, name));
        Object::new(namespace, name, parts, wire, value.len())
            .ok_or_else(|| DecodeError::KeyShape(self.layout.to_string()))
    }

    /// The namespace and name encoded in a key, for keys that hold no
    /// decodable value (deletions).
    pub fn split_key(&self, key: &[u8]) -> Result<(String, String), DecodeError> {
        let key = std::str::from_utf8(key).map_err(|_| DecodeError::KeyNotUtf8)?;
        let (namespace, name) = self.split(key)?;
        Ok((namespace.to_owned(), name.to_owned()))
    }

    fn split<'k>(&self, key: &'k str) -> Result<(&'k str, &'k str), DecodeError> {
        key.strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| self.layout.split(r))
            .ok_or_else(|| DecodeError::KeyShape(self.layout.to_string()))
    }

    /// Reads the labels and the selectable fields in one pass over the
    /// document that builds nothing else: a `serde_json::Value` of the
    /// whole object was most of the cost of reading a change. The result is
    /// the same as reading them from such a value (later duplicate keys
    /// win; a step into something other than an object finds nothing).
    pub(super) fn read_json(
        &self,
        value: &[u8],
    ) -> Result<(Labels, Box<[String]>, String), DecodeError> {
        let text = match std::str::from_utf8(value) {
            Ok(text) => text,
            Err(_) => {
                let e = serde_json::from_slice::<serde_json::Value>(value)
                    .err()
                    .unwrap_or_else(|| serde::de::Error::custom("value is not UTF-8"));
                return Err(DecodeError::NotJson(e));
            }
        };
        // The selectable fields, then the uid (for its shard hash).
        let paths: Vec<Vec<&str>> = (self.selectable_fields.iter().map(String::as_str))
            .chain(["metadata.uid"])
            .map(|f| f.split('.').collect())
            .collect();
        let wants: Vec<Want> = std::iter::once(Want {
            rest: &["metadata", "labels"],
            target: Target::Labels,
        })
        .chain(paths.iter().enumerate().map(|(i, p)| Want {
            rest: p,
            target: Target::Field(i),
        }))
        .collect();
        let mut found = Found {
            labels: None,
            fields: vec![None; paths.len()],
            object: false,
        };
        let mut de = serde_json::Deserializer::from_str(text);
        Level {
            wants: &wants,
            found: &mut found,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(DecodeError::NotJson)?;
        if !found.object {
            return Err(DecodeError::NotJsonObject);
        }
        let labels = match found.labels {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => map
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(v) => Some((k, v)),
                    _ => None,
                })
                .collect::<Option<_>>()
                .ok_or(DecodeError::BadLabels)?,
            Some(_) => return Err(DecodeError::BadLabels),
        };
        let mut fields: Vec<String> = (found.fields.iter())
            .map(|v| field_string(v.as_ref()))
            .collect();
        let uid = fields.pop().unwrap_or_default();
        Ok((labels, fields.into(), uid))
    }
}

/// A value the reader of a document looks for, by the keys still to follow.
#[derive(Clone, Copy)]
struct Want<'a> {
    rest: &'a [&'a str],
    target: Target,
}

#[derive(Clone, Copy)]
enum Target {
    Labels,
    Field(usize),
}

struct Found {
    labels: Option<serde_json::Value>,
    fields: Vec<Option<serde_json::Value>>,
    /// The document is an object (set by any object in it, and only
    /// objects are looked into).
    object: bool,
}

impl Found {
    fn set(&mut self, target: Target, v: Option<serde_json::Value>) {
        match target {
            Target::Labels => self.labels = v,
            Target::Field(i) => self.fields[i] = v,
        }
    }
}

/// One value of the document, with what is wanted below it: the keys that
/// lead to a wanted value are followed, every other value is only checked.
struct Level<'a, 'f> {
    wants: &'a [Want<'a>],
    found: &'f mut Found,
}

impl<'de> DeserializeSeed<'de> for Level<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Level<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.found.object = true;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let key = &*key.0;
            let mut here = self.wants.iter().filter(|w| w.rest[0] == key).peekable();
            if here.peek().is_none() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let (ends, deeper): (Vec<Want>, Vec<Want>) = here.partition(|w| w.rest.len() == 1);
            // A key seen again replaces what the first one held.
            for w in ends.iter().chain(&deeper) {
                self.found.set(w.target, None);
            }
            let deeper: Vec<Want> = deeper
                .into_iter()
                .map(|w| Want {
                    rest: &w.rest[1..],
                    target: w.target,
                })
                .collect();
            if ends.is_empty() {
                map.next_value_seed(Level {
                    wants: &deeper,
                    found: &mut *self.found,
                })?;
                continue;
            }
            let v: serde_json::Value = map.next_value()?;
            for w in &deeper {
                let at = w.rest.iter().try_fold(&v, |v, step| v.get(step));
                self.found.set(w.target, at.cloned());
            }
            for w in &ends {
                self.found.set(w.target, Some(v.clone()));
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// An object key, borrowed from the document unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
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
            (o.namespace(), o.name(), o.revision),
            ("default", "web-1", 7)
        );
        assert_eq!(o.labels().get("app"), Some("web"));
        assert_eq!(o.fields().iter().collect::<Vec<_>>(), ["node-1", "3"]);
    }

    #[test]
    fn absent_fields_read_as_empty() {
        let o = pods().decode(b"/p/a/b", b"{}", 1).unwrap();
        assert_eq!(o.fields().iter().collect::<Vec<_>>(), ["", ""]);
        assert!(o.labels().is_empty());
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

    /// Labels, fields and the uid read from a whole `serde_json::Value`, as the
    /// one-pass reader must read them.
    fn read_by_value(r: &Resource, value: &[u8]) -> Result<(Labels, Vec<String>), String> {
        let doc: serde_json::Value = serde_json::from_slice(value).map_err(|_| "not json")?;
        if !doc.is_object() {
            return Err("not an object".into());
        }
        let labels = match doc.pointer("/metadata/labels") {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => map
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect::<Option<_>>()
                .ok_or("bad labels")?,
            Some(_) => return Err("bad labels".into()),
        };
        let fields = (r.selectable_fields.iter().map(String::as_str))
            .chain(["metadata.uid"])
            .map(|path| field_string(path.split('.').try_fold(&doc, |v, step| v.get(step))))
            .collect();
        Ok((labels, fields))
    }

    /// [`read_by_value`]'s answer (the uid after the fields), from the
    /// one-pass reader.
    fn read_one_pass(r: &Resource, value: &[u8]) -> Result<(Labels, Vec<String>), String> {
        r.read_json(value)
            .map(|(labels, fields, uid)| (labels, [fields.into_vec(), vec![uid]].concat()))
            .map_err(|e| match e {
                DecodeError::NotJson(_) => "not json".to_string(),
                DecodeError::NotJsonObject => "not an object".into(),
                DecodeError::BadLabels => "bad labels".into(),
                other => other.to_string(),
            })
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_the_one_pass_reader_against_serde_json(doc in crate::fuzzing::bytes("json_value")) {
            let r = Resource::for_tests(&["spec.nodeName", "status.phase", "metadata.labels.app"]);
            proptest::prop_assert_eq!(read_one_pass(&r, &doc), read_by_value(&r, &doc));
        }

        #[test]
        fn fuzz_keys(key in crate::fuzzing::bytes("key")) {
            let r = pods();
            if let Ok((namespace, name)) = r.split_key(&key) {
                let again = r.key(&namespace, &name);
                proptest::prop_assert_eq!(again.as_bytes(), &key[..]);
            }
        }
    }

    #[test]
    fn the_one_pass_reader_reads_what_a_whole_value_holds() {
        let r = Resource::for_tests(&[
            "spec.nodeName",
            "spec",
            "spec.n.x",
            "metadata.labels",
            "metadata.labels.app",
            "status.phase",
            "a\"b",
        ]);
        let docs: &[&str] = &[
            r#"{}"#,
            r#"{"metadata":{"labels":{"app":"web","x":"y"}},"spec":{"nodeName":"n1"}}"#,
            r#"{"spec":{"nodeName":"n1"},"spec":{"other":1}}"#,
            r#"{"spec":{"nodeName":"n1"},"spec":null}"#,
            r#"{"spec":[{"nodeName":"n1"}],"status":{"phase":3.50}}"#,
            r#"{"spec":{"nodeName":{"deep":[1,true,null]},"n":{"x":"\u00e9\n"}}}"#,
            r#"{"metadata":{"labels":{"app":"a"}},"metadata":{"name":"b"}}"#,
            r#"{"metadata":{"labels":null}}"#,
            r#"{"metadata":[{"labels":{"a":"b"}}]}"#,
            r#"{"metadata":{"labels":{"a":1}}}"#,
            r#"{"metadata":{"labels":["a"]}}"#,
            r#"{"met\u0061data":{"l\u0061bels":{"k\"":"v\\"}},"a\"b":false}"#,
            r#"{"status":{"phase":12345678901234567890},"x":[[[{"spec":1}]]]}"#,
            r#"{"status":{"phase":-0.0e3},"spec":{"nodeName":""}}"#,
            r#"[{"metadata":{"labels":{"a":"b"}}}]"#,
            r#""{}""#,
            r#"null"#,
            r#"5"#,
            r#"{"a":1} x"#,
            r#"{"a":}"#,
            r#"{"spec":{"nodeName":"\ud800"}}"#,
        ];
        for doc in docs {
            let want = read_by_value(&r, doc.as_bytes());
            assert_eq!(read_one_pass(&r, doc.as_bytes()), want, "{doc}");
        }
        let not_utf8 = b"{\"a\":\"\xff\"}";
        assert!(matches!(
            r.read_json(not_utf8),
            Err(DecodeError::NotJson(_))
        ));
    }

    #[test]
    fn raw_values_are_kept_as_bytes() {
        let mut r = pods();
        r.format = ValueFormat::Raw;
        r.selectable_fields.clear();
        let o = r.decode(b"/p/a/b", b"\xff\x00", 3).unwrap();
        assert_eq!(o.value(), b"\xff\x00");
    }
}
