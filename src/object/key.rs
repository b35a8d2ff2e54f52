//! A resource's keys read and built by its `key_layout`.

use std::fmt;

use crate::config::{KeyLayout, Segment};

impl KeyLayout {
    /// The namespace ("" when there is none) and name in `rest`, a key
    /// with its prefix and the '/' after it taken off.
    pub fn split<'k>(&self, rest: &'k str) -> Option<(&'k str, &'k str)> {
        let (mut namespace, mut name) = ("", None);
        let mut rest = Some(rest);
        for segment in self.segments.iter() {
            let here = rest?;
            if *segment == Segment::NameRest {
                name = Some(here).filter(|n| !n.is_empty());
                rest = None;
                break;
            }
            let (part, after) = match here.split_once('/') {
                Some((part, after)) => (part, Some(after)),
                None => (here, None),
            };
            rest = after;
            match segment {
                _ if part.is_empty() => return None,
                Segment::Literal(text) if text != part => return None,
                Segment::Literal(_) => {}
                Segment::Namespace => namespace = part,
                Segment::Name => name = Some(part),
                Segment::NameRest => unreachable!("handled above"),
            }
        }
        match rest {
            None => Some((namespace, name?)),
            Some(_) => None,
        }
    }

    /// The key of `name` in `namespace` under `prefix`.
    pub fn key(&self, prefix: &str, namespace: &str, name: &str) -> String {
        let mut key = String::with_capacity(prefix.len() + namespace.len() + name.len() + 16);
        key.push_str(prefix);
        for segment in self.segments.iter() {
            key.push('/');
            key.push_str(match segment {
                Segment::Literal(text) => text,
                Segment::Namespace => namespace,
                Segment::Name | Segment::NameRest => name,
            });
        }
        key
    }

    /// The prefix every key of `namespace` starts with, when the layout
    /// puts the namespace before anything that varies.
    pub fn namespace_prefix(&self, prefix: &str, namespace: &str) -> Option<String> {
        let mut out = format!("{prefix}/");
        for segment in self.segments.iter() {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Namespace => {
                    out.push_str(namespace);
                    out.push('/');
                    return Some(out);
                }
                Segment::Name | Segment::NameRest => return None,
            }
            out.push('/');
        }
        None
    }
}

impl fmt::Display for KeyLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<prefix>")?;
        for segment in self.segments.iter() {
            match segment {
                Segment::Literal(text) => write!(f, "/{text}")?,
                Segment::Namespace => f.write_str("/<namespace>")?,
                Segment::Name => f.write_str("/<name>")?,
                Segment::NameRest => f.write_str("/<name...>")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(text: &str) -> KeyLayout {
        KeyLayout::parse(text).unwrap()
    }

    #[test]
    fn the_standard_layouts_are_kubernetes_keys() {
        let ns = KeyLayout::standard(true);
        assert_eq!(ns, layout("{namespace}/{name}"));
        assert_eq!(ns.split("default/web"), Some(("default", "web")));
        assert_eq!(ns.split("default"), None);
        assert_eq!(ns.split("default/web/x"), None);
        assert_eq!(ns.split("/web"), None);
        assert_eq!(ns.split("default/"), None);
        assert_eq!(ns.key("/p", "default", "web"), "/p/default/web");
        assert_eq!(
            ns.namespace_prefix("/p", "default").as_deref(),
            Some("/p/default/")
        );
        assert_eq!(ns.to_string(), "<prefix>/<namespace>/<name>");
        let cluster = KeyLayout::standard(false);
        assert_eq!(cluster.split("node-1"), Some(("", "node-1")));
        assert_eq!(cluster.split("a/b"), None);
        assert_eq!(cluster.namespace_prefix("/p", ""), None);
    }

    #[test]
    fn fixed_segments_and_a_name_to_the_end() {
        let l = layout("/tenants/{namespace}/items/{name...}/");
        assert_eq!(l.split("tenants/a/items/x"), Some(("a", "x")));
        assert_eq!(l.split("tenants/a/items/x/y/z"), Some(("a", "x/y/z")));
        assert_eq!(l.split("tenants/a/items/"), None);
        assert_eq!(l.split("tenants/a/other/x"), None);
        assert_eq!(l.split("tenant/a/items/x"), None);
        assert_eq!(l.key("/r", "a", "x/y"), "/r/tenants/a/items/x/y");
        assert_eq!(
            l.namespace_prefix("/r", "a").as_deref(),
            Some("/r/tenants/a/")
        );
        assert_eq!(
            l.to_string(),
            "<prefix>/tenants/<namespace>/items/<name...>"
        );
        // A namespace after the name pins no prefix.
        let late = layout("{name}/{namespace}");
        assert_eq!(late.split("x/a"), Some(("a", "x")));
        assert_eq!(late.namespace_prefix("/r", "a"), None);
        // Fixed text after the name: other keys under the prefix are not
        // this resource's.
        let spec = layout("{name}/spec");
        assert_eq!(spec.split("x/spec"), Some(("", "x")));
        assert_eq!(spec.split("x/status"), None);
        assert_eq!(spec.split("x"), None);
    }

    proptest::proptest! {
        #[test]
        fn a_split_key_is_built_again_from_its_parts(
            rest in "[a-c/]{0,12}",
            which in 0usize..4,
        ) {
            let text = ["{namespace}/{name}", "a/{namespace}/{name...}", "{name}/b", "{name...}"][which];
            let l = layout(text);
            let key = format!("/p/{rest}");
            if let Some((namespace, name)) = l.split(&rest) {
                proptest::prop_assert_eq!(l.key("/p", namespace, name), key.clone());
                if let Some(prefix) = l.namespace_prefix("/p", namespace) {
                    proptest::prop_assert!(key.starts_with(&prefix));
                }
            }
        }
    }
}
