//! Kubernetes field selectors: `f=v`, `f==v`, `f!=v` joined by commas.
//! Values may escape `\`, `,` and `=` with a backslash, as Kubernetes'
//! `fields.EscapeValue` does.

use super::SelectorError;
use crate::object::Resource;

/// Which part of an object a field requirement reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldRef {
    Name,
    Namespace,
    /// Index into the resource's selectable fields.
    Selectable(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: FieldRef,
    pub equals: bool,
    pub value: String,
}

/// Splits on commas that are not escaped.
fn terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Finds the operator of a term: the first unescaped `!=`, `==` or `=`.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    let b = term.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'!' if b.get(i + 1) == Some(&b'=') => {
                return Some((&term[..i], false, &term[i + 2..]))
            }
            b'=' if b.get(i + 1) == Some(&b'=') => return Some((&term[..i], true, &term[i + 2..])),
            b'=' => return Some((&term[..i], true, &term[i + 1..])),
            _ => {}
        }
        i += 1;
    }
    None
}

fn unescape(v: &str) -> Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence \\{e}")),
                None => return Err("value ends with a lone backslash".into()),
            },
            ',' | '=' => return Err(format!("unescaped {c:?} in value; write \\{c}")),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Parses a field selector against the fields `resource` allows.
pub fn parse(selector: &str, resource: &Resource) -> Result<Vec<FieldRequirement>, SelectorError> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    let err = |term: &str, why: String| SelectorError::Field(format!("{:?}: {why}", term.trim()));
    let mut out = Vec::new();
    for term in terms(selector) {
        let Some((name, equals, value)) = split_term(term) else {
            return Err(err(
                term,
                "expected field=value, field==value or field!=value".into(),
            ));
        };
        let name = name.trim();
        let field = match name {
            "metadata.name" => FieldRef::Name,
            "metadata.namespace" => FieldRef::Namespace,
            _ => match resource.selectable_fields.iter().position(|f| f == name) {
                Some(i) => FieldRef::Selectable(i),
                None => {
                    let mut allowed = vec!["metadata.name", "metadata.namespace"];
                    allowed.extend(resource.selectable_fields.iter().map(String::as_str));
                    let why = format!(
                        "field {name:?} is not selectable for {}; allowed: {}",
                        resource.name,
                        allowed.join(", ")
                    );
                    return Err(err(term, why));
                }
            },
        };
        let value = unescape(value.trim()).map_err(|why| err(term, why))?;
        out.push(FieldRequirement {
            field,
            equals,
            value,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pods() -> Resource {
        Resource::for_tests(&["spec.nodeName", "status.phase"])
    }

    fn fr(field: FieldRef, equals: bool, value: &str) -> FieldRequirement {
        FieldRequirement {
            field,
            equals,
            value: value.into(),
        }
    }

    #[test]
    fn every_operator_and_escape_parses() {
        let cases = [
            (
                "spec.nodeName=n1",
                vec![fr(FieldRef::Selectable(0), true, "n1")],
            ),
            (
                "spec.nodeName==n1",
                vec![fr(FieldRef::Selectable(0), true, "n1")],
            ),
            (
                "status.phase!=Running",
                vec![fr(FieldRef::Selectable(1), false, "Running")],
            ),
            (
                " metadata.name = a , metadata.namespace!=b ",
                vec![
                    fr(FieldRef::Name, true, "a"),
                    fr(FieldRef::Namespace, false, "b"),
                ],
            ),
            (
                "spec.nodeName=",
                vec![fr(FieldRef::Selectable(0), true, "")],
            ),
            (
                r"metadata.name=a\,b\=c\\d",
                vec![fr(FieldRef::Name, true, r"a,b=c\d")],
            ),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s, &pods()).unwrap(), want, "{s:?}");
        }
    }

    #[test]
    fn every_error_class_is_reported() {
        let cases = [
            ("spec.nodeName", "expected field=value"),
            (
                "spec.color=red",
                "allowed: metadata.name, metadata.namespace, spec.nodeName, status.phase",
            ),
            ("metadata.name=a=b", "unescaped '='"),
            (r"metadata.name=a\x", "invalid escape"),
            (r"metadata.name=a\", "lone backslash"),
            ("metadata.name=a,", "expected field=value"),
        ];
        for (s, needle) in cases {
            let e = parse(s, &pods()).unwrap_err().to_string();
            assert!(e.contains(needle), "{s:?}: {e}");
        }
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_field_selectors(s in crate::fuzzing::text("field_selector")) {
            if let Ok(requirements) = parse(&s, &pods()) {
                prop_assert!(requirements.len() <= s.split(',').count());
            }
        }
    }
}
