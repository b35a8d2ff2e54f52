//! Label and field selectors, and the predicate a watcher or list applies.
//!
//! Supported forms: labels `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (does
//! not exist); fields `f=v`, `f==v`, `f!=v` on `metadata.name`,
//! `metadata.namespace` and the resource's selectable fields. Requirements
//! are joined by commas (AND).

use crate::object::{Object, Resource};

/// A selector that cannot be parsed; the message points at the bad part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("label selector: {0}")]
    Label(String),
    #[error("field selector: {0}")]
    Field(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: Op,
    value: String,
}

/// Which part of an object a field requirement reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldRef {
    Name,
    Namespace,
    /// Index into the resource's selectable fields.
    Selectable(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: FieldRef,
    equals: bool,
    value: String,
}

/// Everything a request filters by: namespace, name and selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Predicate {
    namespace: Option<String>,
    name: Option<String>,
    labels: Vec<LabelRequirement>,
    fields: Vec<FieldRequirement>,
}

impl Predicate {
    /// Builds the predicate of a request; empty strings mean "no restriction".
    pub fn new(
        resource: &Resource,
        namespace: &str,
        name: &str,
        label_selector: &str,
        field_selector: &str,
    ) -> Result<Self, SelectorError> {
        Ok(Self {
            namespace: (resource.namespaced && !namespace.is_empty()).then(|| namespace.to_owned()),
            name: (!name.is_empty()).then(|| name.to_owned()),
            labels: parse_labels(label_selector)?,
            fields: parse_fields(field_selector, resource)?,
        })
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether the predicate filters by anything beyond namespace and name.
    pub fn has_selectors(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    pub fn matches(&self, o: &Object) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == o.namespace)
            && self.name.as_ref().is_none_or(|n| *n == o.name)
            && self.labels.iter().all(|r| {
                let v = o.labels.get(&r.key);
                match r.op {
                    Op::Equals => v == Some(&r.value),
                    // As in Kubernetes: a missing label is "not equal".
                    Op::NotEquals => v != Some(&r.value),
                    Op::Exists => v.is_some(),
                    Op::NotExists => v.is_none(),
                }
            })
            && self.fields.iter().all(|r| {
                let v = match r.field {
                    FieldRef::Name => o.name.as_str(),
                    FieldRef::Namespace => o.namespace.as_str(),
                    FieldRef::Selectable(i) => o.fields.get(i).map_or("", String::as_str),
                };
                (v == r.value) == r.equals
            })
    }
}

fn requirements(selector: &str) -> impl Iterator<Item = &str> {
    selector.split(',').map(str::trim)
}

/// Splits `k=v`, `k==v` or `k!=v` into key, equality and value.
fn split_comparison(part: &str) -> Option<(&str, bool, &str)> {
    if let Some((k, v)) = part.split_once("!=") {
        return Some((k.trim(), false, v.trim()));
    }
    let (k, v) = part.split_once('=')?;
    Some((k.trim(), true, v.strip_prefix('=').unwrap_or(v).trim()))
}

fn parse_labels(selector: &str) -> Result<Vec<LabelRequirement>, SelectorError> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    let err = |part: &str, why: &str| SelectorError::Label(format!("{part:?}: {why}"));
    let mut out = Vec::new();
    for part in requirements(selector) {
        if part.is_empty() {
            return Err(err(selector, "empty requirement (stray comma?)"));
        }
        let req = match split_comparison(part) {
            Some((key, equals, value)) => {
                check_label_key(key).map_err(|why| err(part, &why))?;
                check_label_value(value).map_err(|why| err(part, &why))?;
                let op = if equals { Op::Equals } else { Op::NotEquals };
                LabelRequirement {
                    key: key.to_owned(),
                    op,
                    value: value.to_owned(),
                }
            }
            None => {
                let (op, key) = match part.strip_prefix('!') {
                    Some(k) => (Op::NotExists, k.trim()),
                    None => (Op::Exists, part),
                };
                check_label_key(key).map_err(|why| err(part, &why))?;
                LabelRequirement {
                    key: key.to_owned(),
                    op,
                    value: String::new(),
                }
            }
        };
        out.push(req);
    }
    Ok(out)
}

/// A Kubernetes qualified name: optional DNS-subdomain prefix and '/', then
/// a name of up to 63 alphanumerics, '-', '_' or '.', starting and ending
/// alphanumeric.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!("key prefix {p:?} must be a DNS subdomain"));
        }
    }
    if name.is_empty() {
        return Err("key must not be empty".into());
    }
    check_name_chars(name).map_err(|why| format!("key name {name:?} {why}"))
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name_chars(value).map_err(|why| format!("value {value:?} {why}"))
}

fn check_name_chars(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    let inner_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(
            "must use only alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
                .into(),
        )
    }
}

fn parse_fields(
    selector: &str,
    resource: &Resource,
) -> Result<Vec<FieldRequirement>, SelectorError> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    let err = |part: &str, why: String| SelectorError::Field(format!("{part:?}: {why}"));
    let mut out = Vec::new();
    for part in requirements(selector) {
        let Some((name, equals, value)) = split_comparison(part) else {
            return Err(err(
                part,
                "expected field=value, field==value or field!=value".into(),
            ));
        };
        let field = match name {
            "metadata.name" => FieldRef::Name,
            "metadata.namespace" => FieldRef::Namespace,
            _ => match resource.selectable_fields.iter().position(|f| f == name) {
                Some(i) => FieldRef::Selectable(i),
                None => {
                    let mut allowed = vec!["metadata.name", "metadata.namespace"];
                    allowed.extend(resource.selectable_fields.iter().map(String::as_str));
                    return Err(err(
                        part,
                        format!(
                            "field {name:?} is not selectable for {}; allowed: {}",
                            resource.name,
                            allowed.join(", ")
                        ),
                    ));
                }
            },
        };
        out.push(FieldRequirement {
            field,
            equals,
            value: value.to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn pods() -> Resource {
        Resource::for_tests(&["spec.nodeName"])
    }

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], node: &str) -> Object {
        Object {
            key: Arc::from(format!("/p/{ns}/{name}")),
            namespace: ns.into(),
            name: name.into(),
            revision: 1,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            fields: vec![node.to_string()].into(),
            value: Default::default(),
        }
    }

    fn pred(labels: &str, fields: &str) -> Predicate {
        Predicate::new(&pods(), "", "", labels, fields).unwrap()
    }

    #[test]
    fn label_operators_match_like_kubernetes() {
        let web = pod("a", "w", &[("app", "web"), ("tier", "fe")], "");
        let bare = pod("a", "b", &[], "");
        let cases = [
            ("app=web", true, false),
            ("app==web", true, false),
            (" app = web ", true, false),
            ("app!=web", false, true),
            ("app!=db", true, true),
            ("app", true, false),
            ("!app", false, true),
            ("app=web,tier=fe", true, false),
            ("app=web,tier=be", false, false),
            ("example.com/team=x", false, false),
        ];
        for (sel, on_web, on_bare) in cases {
            let p = pred(sel, "");
            assert_eq!(p.matches(&web), on_web, "{sel} on web");
            assert_eq!(p.matches(&bare), on_bare, "{sel} on bare");
        }
    }

    #[test]
    fn field_selectors_read_metadata_and_selectable_fields() {
        let o = pod("ns1", "p1", &[], "node-7");
        let cases = [
            ("spec.nodeName=node-7", true),
            ("spec.nodeName!=node-7", false),
            ("spec.nodeName==node-8", false),
            ("metadata.name=p1", true),
            ("metadata.namespace=ns2", false),
            ("metadata.namespace=ns1,spec.nodeName=node-7", true),
            ("spec.nodeName=", false),
        ];
        for (sel, want) in cases {
            assert_eq!(pred("", sel).matches(&o), want, "{sel}");
        }
        assert!(pred("", "spec.nodeName=").matches(&pod("a", "b", &[], "")));
    }

    #[test]
    fn namespace_and_name_scope_the_predicate() {
        let p = Predicate::new(&pods(), "ns1", "p1", "", "").unwrap();
        assert!(p.matches(&pod("ns1", "p1", &[], "")));
        assert!(!p.matches(&pod("ns2", "p1", &[], "")));
        assert!(!p.matches(&pod("ns1", "p2", &[], "")));
    }

    #[test]
    fn malformed_selectors_name_the_bad_part() {
        let cases = [
            ("app=web,,x=y", "", "stray comma"),
            ("-app=web", "", "\"-app=web\""),
            ("app=we b", "", "\"app=we b\""),
            ("Bad_Prefix/app=x", "", "DNS subdomain"),
            (&*format!("app={}", "x".repeat(64)), "", "63"),
            ("!", "", "must not be empty"),
            (
                "",
                "spec.color=red",
                "allowed: metadata.name, metadata.namespace, spec.nodeName",
            ),
            ("", "spec.nodeName", "expected field=value"),
        ];
        for (labels, fields, needle) in cases {
            let err = Predicate::new(&pods(), "", "", labels, fields)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{labels:?}/{fields:?}: {err}");
        }
    }
}
