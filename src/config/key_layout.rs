//! `key_layout`: where a resource's keys, after its prefix, hold the
//! object's namespace and name. Kubernetes' own keys are
//! `{namespace}/{name}` (or `{name}`); other stores nest them under fixed
//! segments (`tenants/{namespace}/items/{name}`) or let the name run to
//! the end of the key (`{namespace}/{name...}`). Read here; applied to
//! keys by the object stage.

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Namespace,
    Name,
    /// The name is the rest of the key, slashes and all.
    NameRest,
}

/// A resource's key layout.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct KeyLayout {
    pub segments: Box<[Segment]>,
}

impl TryFrom<String> for KeyLayout {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text)
    }
}

impl KeyLayout {
    /// Kubernetes' layout: `{namespace}/{name}`, or `{name}` for a
    /// cluster-scoped resource.
    pub fn standard(namespaced: bool) -> Self {
        let segments = if namespaced {
            vec![Segment::Namespace, Segment::Name]
        } else {
            vec![Segment::Name]
        };
        Self {
            segments: segments.into(),
        }
    }

    /// Whether keys of this layout hold a namespace.
    pub fn namespaced(&self) -> bool {
        self.segments.contains(&Segment::Namespace)
    }

    /// Reads a layout such as `tenants/{namespace}/items/{name}`: segments
    /// joined by '/', each fixed text, `{namespace}` (at most once),
    /// `{name}` (exactly once), or `{name...}` last, for a name that runs
    /// to the end of the key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim_matches('/');
        let mut segments = Vec::new();
        for (i, s) in text.split('/').enumerate() {
            let segment = match s {
                "" => return Err(format!("segment {} is empty", i + 1)),
                "{namespace}" => Segment::Namespace,
                "{name}" => Segment::Name,
                "{name...}" => Segment::NameRest,
                _ if s.contains(['{', '}']) => {
                    return Err(format!(
                    "{s:?} is neither fixed text nor one of {{namespace}}, {{name}}, {{name...}}"
                ))
                }
                _ => Segment::Literal(s.to_owned()),
            };
            segments.push(segment);
        }
        let count = |f: fn(&Segment) -> bool| segments.iter().filter(|s| f(s)).count();
        if count(|s| matches!(s, Segment::Name | Segment::NameRest)) != 1 {
            return Err("must hold the name once, as {name} or {name...}".into());
        }
        if segments[..segments.len() - 1].contains(&Segment::NameRest) {
            return Err("{name...} runs to the end of the key, so it comes last".into());
        }
        if count(|s| *s == Segment::Namespace) > 1 {
            return Err("holds {namespace} more than once".into());
        }
        Ok(Self {
            segments: segments.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_layouts_say_what_is_wrong() {
        for (text, why) in [
            ("{namespace}", "the name once"),
            ("{name}/{name}", "the name once"),
            ("{name...}/x", "comes last"),
            ("{namespace}/{namespace}/{name}", "more than once"),
            ("a//{name}", "segment 2 is empty"),
            ("{nam}", "neither fixed text"),
            ("x{name}", "neither fixed text"),
        ] {
            let e = KeyLayout::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        assert_eq!(
            KeyLayout::parse("/{namespace}/{name}/").unwrap(),
            KeyLayout::standard(true)
        );
        assert!(!KeyLayout::parse("x/{name...}").unwrap().namespaced());
    }
}
