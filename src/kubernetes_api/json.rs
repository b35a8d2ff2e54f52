//! Kubernetes' JSON framing of what the caches hold: an object with its
//! `metadata.resourceVersion` (the apiserver stores objects without it),
//! written once per event and shared by every watcher; a watch event's
//! line (`{"type":…,"object":…}`), which frames those shared bytes; a
//! bookmark; and a list's envelope.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::object::Revision;

/// A JSON object's members in their order, values unparsed.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Each)
    }
}

fn write_members(members: &[(String, &RawValue)], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("a string is written to a Vec");
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
}

/// The stored object with `metadata.resourceVersion` set to `revision`
/// (added, or replacing one stored), `apiVersion` and `kind` added when it
/// lacks them, every other member as stored and in its order; none for a
/// value that is not a JSON object or whose `metadata` is not one.
pub fn object(stored: &[u8], revision: Revision, api_version: &str, kind: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(stored).ok()?;
    let Members(mut members) = serde_json::from_str(text).ok()?;
    let version = RawValue::from_string(format!("\"{revision}\"")).expect("a quoted number");
    let at = members.iter().position(|(k, _)| k == "metadata");
    let mut metadata = match at {
        Some(at) => serde_json::from_str::<Members>(members[at].1.get()).ok()?.0,
        None => Vec::new(),
    };
    match metadata.iter().position(|(k, _)| k == "resourceVersion") {
        Some(rv) => metadata[rv].1 = &version,
        None => metadata.push(("resourceVersion".to_owned(), &version)),
    }
    let mut metadata_out = Vec::new();
    write_members(&metadata, &mut metadata_out);
    let metadata_text = String::from_utf8(metadata_out).expect("JSON is UTF-8");
    let metadata = RawValue::from_string(metadata_text).ok()?;
    match at {
        Some(at) => members[at].1 = &metadata,
        None => members.push(("metadata".to_owned(), &metadata)),
    }
    let type_meta = [("kind", kind), ("apiVersion", api_version)];
    let quoted = type_meta.map(|(_, v)| serde_json::value::to_raw_value(v).expect("a string"));
    for ((name, _), value) in type_meta.iter().zip(&quoted) {
        if !members.iter().any(|(k, _)| k == name) {
            members.insert(0, ((*name).to_owned(), &**value));
        }
    }
    let mut out = Vec::with_capacity(stored.len() + 32);
    write_members(&members, &mut out);
    Some(out)
}

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    fn name(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
            Self::Bookmark => "BOOKMARK",
            Self::Error => "ERROR",
        }
    }
}

/// One line of a watch's response: the event's type and its object's
/// shared bytes, framed.
pub fn watch_line(kind: EventType, object: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.name().as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
}

/// A bookmark's object: only its kind and resource version, and, for the
/// one that ends a watch's initial events, the annotation that says so.
pub fn bookmark(
    api_version: &str,
    kind: &str,
    revision: Revision,
    initial_events_end: bool,
) -> Vec<u8> {
    let mut metadata = serde_json::json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = serde_json::json!({"k8s.io/initial-events-end": "true"});
    }
    let object = serde_json::json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
    serde_json::to_vec(&object).expect("plain data")
}

/// A list's head, up to its items' `[`: its kind (`PodList`), version,
/// resource version and continue token; [`list_tail`] closes it.
pub fn list_head(
    api_version: &str,
    kind: &str,
    revision: Revision,
    continue_token: &str,
) -> Vec<u8> {
    let mut metadata = serde_json::json!({"resourceVersion": revision.to_string()});
    if !continue_token.is_empty() {
        metadata["continue"] = serde_json::json!(continue_token);
    }
    let head = serde_json::json!({"kind": format!("{kind}List"), "apiVersion": api_version, "metadata": metadata});
    let mut out = serde_json::to_vec(&head).expect("plain data");
    out.pop();
    out.extend_from_slice(b",\"items\":[");
    out
}

/// Closes a list begun by [`list_head`], its items written between,
/// separated by commas.
pub fn list_tail(out: &mut Vec<u8>) {
    out.extend_from_slice(b"]}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parsed(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn an_object_gets_its_resource_version_and_keeps_the_rest_in_order() {
        let stored = br#"{"kind":"Widget","apiVersion":"example.com/v1","metadata":{"name":"w","namespace":"ns","labels":{"a":"b"}},"spec":{"size":3,"name":"\"q\""}}"#;
        let out = object(stored, 42, "v1", "Pod").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"kind":"Widget","apiVersion":"example.com/v1","metadata":{"name":"w","namespace":"ns","labels":{"a":"b"},"resourceVersion":"42"},"spec":{"size":3,"name":"\"q\""}}"#
        );
        // One stored by mistake is replaced; an object without metadata
        // gets one.
        let out = object(br#"{"metadata":{"resourceVersion":"7"}}"#, 9, "v1", "Pod").unwrap();
        assert_eq!(
            parsed(&out),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"resourceVersion": "9"}})
        );
        assert!(
            out.starts_with(br#"{"apiVersion":"v1","kind":"Pod","#),
            "the type first, as the apiserver writes it"
        );
        let out = object(br#"{"spec":{}}"#, 9, "v1", "Pod").unwrap();
        assert_eq!(parsed(&out)["metadata"]["resourceVersion"], "9");
        for not_an_object in [&b"[1]"[..], b"\"x\"", b"{\"metadata\":[]}", b"{", b"\xff"] {
            assert_eq!(object(not_an_object, 1, "v1", "Pod"), None);
        }
    }

    #[test]
    fn a_watch_line_frames_the_shared_object() {
        let mut out = Vec::new();
        watch_line(EventType::Added, br#"{"metadata":{"name":"w"}}"#, &mut out);
        watch_line(EventType::Deleted, br#"{}"#, &mut out);
        let lines: Vec<Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(parsed)
            .collect();
        assert_eq!(
            lines[0],
            json!({"type": "ADDED", "object": {"metadata": {"name": "w"}}})
        );
        assert_eq!(lines[1]["type"], "DELETED");
        assert!(out.ends_with(b"}\n"));
    }

    #[test]
    fn bookmarks_carry_only_the_version_and_the_end_of_initial_events() {
        assert_eq!(
            parsed(&bookmark("v1", "Pod", 12, false)),
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "12"}})
        );
        assert_eq!(
            parsed(&bookmark("v1", "Pod", 12, true))["metadata"]["annotations"],
            json!({"k8s.io/initial-events-end": "true"})
        );
    }

    #[test]
    fn a_list_is_its_head_the_items_and_its_tail() {
        let mut out = list_head("apps/v1", "Deployment", 30, "tok");
        out.extend_from_slice(br#"{"a":1},{"a":2}"#);
        list_tail(&mut out);
        assert_eq!(
            parsed(&out),
            json!({
                "kind": "DeploymentList", "apiVersion": "apps/v1",
                "metadata": {"resourceVersion": "30", "continue": "tok"},
                "items": [{"a": 1}, {"a": 2}]
            })
        );
        let mut empty = list_head("v1", "Pod", 5, "");
        list_tail(&mut empty);
        assert_eq!(parsed(&empty)["metadata"], json!({"resourceVersion": "5"}));
        assert_eq!(parsed(&empty)["items"], json!([]));
    }
}
