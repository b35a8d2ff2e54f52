//! Projection: the parts of a JSON value a client asked for (dotted
//! paths such as `metadata` or `spec.nodeName`). Selectors still see the
//! whole object; only what is sent is cut. A projected value is a JSON
//! object with the same nesting, holding only those paths.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::Object;

/// At most this many paths, of at most this many bytes each.
pub const MAX_PATHS: usize = 64;
pub const MAX_PATH_LEN: usize = 256;

/// The paths to keep, sorted, none inside another.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Projection {
    paths: Vec<Vec<String>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProjectionError {
    #[error("field path {0:?} has an empty step")]
    EmptyStep(String),
    #[error("at most {MAX_PATHS} field paths")]
    TooMany,
    #[error("field path longer than {MAX_PATH_LEN} bytes")]
    TooLong,
}

impl Projection {
    /// The projection `fields` and `metadata_only` ask for (`metadata_only`
    /// adds `metadata` to the paths); none when they ask for the whole
    /// value.
    pub fn new(
        fields: &[String],
        metadata_only: bool,
    ) -> Result<Option<Projection>, ProjectionError> {
        if fields.len() > MAX_PATHS {
            return Err(ProjectionError::TooMany);
        }
        let mut paths = Vec::with_capacity(fields.len() + 1);
        for f in fields {
            if f.len() > MAX_PATH_LEN {
                return Err(ProjectionError::TooLong);
            }
            let steps: Vec<String> = f.split('.').map(String::from).collect();
            if steps.iter().any(String::is_empty) {
                return Err(ProjectionError::EmptyStep(f.clone()));
            }
            paths.push(steps);
        }
        if metadata_only {
            paths.push(vec!["metadata".to_owned()]);
        }
        if paths.is_empty() {
            return Ok(None);
        }
        // Sorted, a path inside another (`metadata.name` with `metadata`)
        // is dropped: equal asks are one projection.
        paths.sort();
        paths.dedup_by(|later, earlier| later.starts_with(earlier));
        Ok(Some(Projection { paths }))
    }

    /// The value cut to the paths; none for a value that is not a JSON
    /// object (raw resources refuse projections before this). The kept
    /// parts are copied as they are written, never parsed into a tree.
    pub fn cut(&self, value: &[u8]) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(value).ok()?;
        let paths: Vec<&[String]> = self.paths.iter().map(Vec::as_slice).collect();
        let mut out = Vec::with_capacity(value.len().min(1024));
        cut_object(text, &paths, &mut out)?;
        Some(out)
    }

    /// `o` with its value cut, encoded once as it will be sent.
    pub fn apply(&self, o: &Arc<Object>) -> Arc<Object> {
        let Some(value) = self.cut(o.value()) else {
            return o.clone();
        };
        let labels = o.labels();
        let head = super::Head {
            key: o.key(),
            namespace: o.namespace(),
            name: o.name(),
            revision: o.revision,
            labels: labels.iter(),
        };
        let wire = super::encode(head, &value);
        Arc::new(o.with_wire(wire, value.len()))
    }
}

/// Writes the JSON object `text` cut to `paths` (sorted, none inside
/// another) to `out`; none when `text` is not an object. A member's value
/// is read only as far as a path goes into it.
fn cut_object(text: &str, paths: &[&[String]], out: &mut Vec<u8>) -> Option<()> {
    // The last of repeated keys counts, as when the value is read whole.
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    out.push(b'{');
    let mut first = true;
    let mut rest = paths;
    while let Some(path) = rest.first() {
        let step = &path[0];
        let group = rest.iter().take_while(|p| &p[0] == step).count();
        let (same, next) = rest.split_at(group);
        rest = next;
        let Some(found) = members.get(step) else {
            continue;
        };
        let mark = out.len();
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(step).ok()?.as_bytes());
        out.push(b':');
        if same[0].len() == 1 {
            // The whole member (no other path can be inside it).
            out.extend_from_slice(found.get().as_bytes());
        } else {
            let inner: Vec<&[String]> = same.iter().map(|p| &p[1..]).collect();
            // A path goes on through objects only; through anything else,
            // or to nothing inside, it keeps nothing.
            let start = out.len();
            if cut_object(found.get(), &inner, out).is_none() || out.len() - start == 2 {
                out.truncate(mark);
                continue;
            }
        }
        first = false;
    }
    out.push(b'}');
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(fields: &[&str], metadata_only: bool) -> Option<Projection> {
        let fields: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        Projection::new(&fields, metadata_only).unwrap()
    }

    use proptest::prelude::*;
    use prost::Message;
    use serde_json::{Map, Value};

    fn cut(p: &Projection, v: serde_json::Value) -> serde_json::Value {
        serde_json::from_slice(&p.cut(v.to_string().as_bytes()).unwrap()).unwrap()
    }

    /// The cut as a whole value read into a tree says it: the oracle.
    fn cut_by_tree(p: &Projection, value: &[u8]) -> Option<Value> {
        fn keep(from: &Map<String, Value>, path: &[String], into: &mut Map<String, Value>) {
            let Some((step, rest)) = path.split_first() else {
                return;
            };
            let Some(found) = from.get(step) else { return };
            if rest.is_empty() {
                into.insert(step.clone(), found.clone());
                return;
            }
            if let Value::Object(inner) = found {
                let mut kept = match into.get(step) {
                    Some(Value::Object(had)) => had.clone(),
                    _ => Map::new(),
                };
                keep(inner, rest, &mut kept);
                if !kept.is_empty() {
                    into.insert(step.clone(), Value::Object(kept));
                }
            }
        }
        let Ok(Value::Object(whole)) = serde_json::from_slice::<Value>(value) else {
            return None;
        };
        let mut kept = Map::new();
        for path in &p.paths {
            keep(&whole, path, &mut kept);
        }
        Some(Value::Object(kept))
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_the_cut_against_a_whole_tree(
            doc in crate::fuzzing::bytes("json_value"),
            picks in proptest::collection::vec(0usize..8, 1..4),
        ) {
            let known = ["metadata", "metadata.name", "metadata.labels", "spec.nodeName",
                "status", "status.phase", "spec.containers.image", "a.b.c"];
            let fields: Vec<String> = picks.iter().map(|&i| known[i].to_owned()).collect();
            let p = Projection::new(&fields, false).unwrap().unwrap();
            let by_bytes = p.cut(&doc).map(|b| serde_json::from_slice::<Value>(&b).expect("the cut is JSON"));
            prop_assert_eq!(by_bytes, cut_by_tree(&p, &doc));
        }
    }

    #[test]
    fn keeps_only_the_paths_with_their_nesting() {
        let pod = serde_json::json!({
            "metadata": {"name": "a", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"image": "x"}]},
            "status": {"phase": "Running", "ip": "10.0.0.1"},
        });
        let p = paths(
            &[
                "metadata.name",
                "spec.nodeName",
                "status.phase",
                "spec.missing",
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            cut(&p, pod.clone()),
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
        );
        let meta = paths(&[], true).unwrap();
        assert_eq!(
            cut(&meta, pod.clone()),
            serde_json::json!({"metadata": pod["metadata"]})
        );
        // Through an array, a path keeps nothing; ending at one keeps it.
        let p = paths(&["spec.containers.image", "spec.containers"], false).unwrap();
        assert_eq!(
            cut(&p, pod.clone()),
            serde_json::json!({"spec": {"containers": pod["spec"]["containers"]}})
        );
        let p = paths(&["spec.containers.image"], false).unwrap();
        assert_eq!(cut(&p, pod), serde_json::json!({}));
    }

    #[test]
    fn equal_asks_are_one_projection_and_bad_paths_are_refused() {
        assert_eq!(paths(&[], false), None);
        assert_eq!(
            paths(&["metadata.name", "metadata"], false),
            paths(&[], true)
        );
        assert_eq!(paths(&["b", "a", "b"], false), paths(&["a", "b"], false));
        let bad = |f: &str| Projection::new(&[f.to_owned()], false).unwrap_err();
        assert_eq!(bad("spec..x"), ProjectionError::EmptyStep("spec..x".into()));
        assert_eq!(bad(""), ProjectionError::EmptyStep("".into()));
        assert_eq!(bad(&"x".repeat(300)), ProjectionError::TooLong);
        let many: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
        assert_eq!(
            Projection::new(&many, false).unwrap_err(),
            ProjectionError::TooMany
        );
    }

    #[test]
    fn a_projected_object_is_encoded_with_its_cut_value() {
        let r = crate::object::Resource::for_tests(&[]);
        let value = br#"{"metadata":{"name":"a"},"spec":{"big":"xxxxxxxx"}}"#;
        let o = r.decode(b"/p/ns/a", value, 7).unwrap();
        let p = paths(&[], true).unwrap().apply(&Arc::new(o.clone()));
        assert_eq!(p.value(), br#"{"metadata":{"name":"a"}}"#);
        let decoded = crate::pb::Object::decode(p.wire.clone()).unwrap();
        assert_eq!(decoded.value, p.value());
        assert_eq!(
            (decoded.name.as_str(), decoded.resource_version.as_str()),
            ("a", "7")
        );
        assert_eq!(p.labels().to_map(), o.labels().to_map());
    }
}
