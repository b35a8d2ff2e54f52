//! What a watcher asks for, judged on etcd's raw keys and values, apart
//! from watchproxy's own selector code, so that a mistake there shows.

use rand::Rng;
use serde_json::Value;

use crate::history::{Change, History, State};

/// Namespaces, names, labels and nodes the writer draws from.
pub const NAMESPACES: usize = 4;
pub const NAMES: usize = 12;
pub const APPS: usize = 4;
pub const NODES: usize = 4;

/// One watcher's selection: the forms Kubernetes clients use most.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `app=<value>`.
    pub app: Option<String>,
    /// `spec.nodeName=<value>`.
    pub node: Option<String>,
    /// The node an authorization rule narrows the caller to: not asked
    /// for, but applied by the server all the same.
    pub allowed_node: Option<String>,
}

impl Selection {
    /// A random selection: everything, a namespace, one object, a label or
    /// a node, and sometimes two of them together.
    pub fn random(rng: &mut impl Rng) -> Self {
        let ns = |rng: &mut dyn rand::RngCore| format!("ns-{}", rng.random_range(0..NAMESPACES));
        let mut s = Self::default();
        match rng.random_range(0..6) {
            0 => {}
            1 => s.namespace = Some(ns(rng)),
            2 => {
                s.namespace = Some(ns(rng));
                s.name = Some(format!("obj-{}", rng.random_range(0..NAMES)));
            }
            3 => s.app = Some(format!("a-{}", rng.random_range(0..APPS))),
            4 => s.node = Some(format!("node-{}", rng.random_range(0..NODES))),
            _ => {
                s.namespace = Some(ns(rng));
                s.app = Some(format!("a-{}", rng.random_range(0..APPS)));
            }
        }
        s
    }

    /// A random selection a key range makes: everything, a namespace or
    /// one object.
    pub fn random_keys(rng: &mut impl Rng) -> Self {
        let mut s = Self::default();
        let pick = rng.random_range(0..3);
        if pick > 0 {
            s.namespace = Some(format!("ns-{}", rng.random_range(0..NAMESPACES)));
        }
        if pick > 1 {
            s.name = Some(format!("obj-{}", rng.random_range(0..NAMES)));
        }
        s
    }

    pub fn label_selector(&self) -> String {
        self.app
            .as_ref()
            .map_or(String::new(), |a| format!("app={a}"))
    }

    pub fn field_selector(&self) -> String {
        self.node
            .as_ref()
            .map_or(String::new(), |n| format!("spec.nodeName={n}"))
    }

    /// Whether the key is in the namespace and name asked for.
    pub fn scopes(&self, prefix: &str, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
            return false;
        };
        let (ns, name) = rest.split_once('/').unwrap_or(("", rest));
        self.namespace.as_deref().is_none_or(|n| n == ns)
            && self.name.as_deref().is_none_or(|n| n == name)
    }

    /// Whether the object stored at `key` with `value` is selected.
    pub fn selects(&self, prefix: &str, key: &str, value: &[u8]) -> bool {
        if !self.scopes(prefix, key) {
            return false;
        }
        if self.app.is_none() && self.node.is_none() && self.allowed_node.is_none() {
            return true;
        }
        let Ok(json) = serde_json::from_slice::<Value>(value) else {
            return false;
        };
        let app = json.pointer("/metadata/labels/app").and_then(Value::as_str);
        let node = json.pointer("/spec/nodeName").and_then(Value::as_str);
        self.app.as_deref().is_none_or(|a| app == Some(a))
            && self.node.as_deref().is_none_or(|n| node == Some(n))
            && self.allowed_node.as_deref().is_none_or(|n| node == Some(n))
    }

    /// The selected part of a state.
    pub fn filter(&self, prefix: &str, state: &State) -> State {
        state
            .iter()
            .filter(|(k, v)| self.selects(prefix, k, v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// An event as a watcher must see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Expected {
    pub kind: Kind,
    pub key: String,
    pub revision: u64,
    /// The new value; none for a deletion (which shows the last state the
    /// watcher saw).
    pub value: Option<Vec<u8>>,
}

/// `Added /p/ns/a@7`: the value would only bury the change in a message.
impl std::fmt::Debug for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}@{}", self.kind, self.key, self.revision)
    }
}

impl Expected {
    /// Whether `other` is the same change, whatever value it carries.
    pub fn same_change(&self, other: &Expected) -> bool {
        (self.kind, &self.key, self.revision) == (other.kind, &other.key, other.revision)
    }
}

/// The events a watcher of `selection` must get after `after`: each change
/// as the selection's transition from the key's previous state.
pub fn expected_after(
    history: &History,
    prefix: &str,
    selection: &Selection,
    after: u64,
) -> Vec<Expected> {
    let mut state = history.state_at(after);
    let mut out = Vec::new();
    for c in history.changes_after(after) {
        if let Some(kind) = transition(prefix, selection, state.get(&c.key), c) {
            out.push(Expected {
                kind,
                key: c.key.clone(),
                revision: c.revision,
                value: (kind != Kind::Deleted).then(|| c.value.clone()).flatten(),
            });
        }
        crate::history::apply(&mut state, c);
    }
    out
}

fn transition(prefix: &str, s: &Selection, before: Option<&Vec<u8>>, c: &Change) -> Option<Kind> {
    let was = before.is_some_and(|v| s.selects(prefix, &c.key, v));
    let is = c
        .value
        .as_ref()
        .is_some_and(|v| s.selects(prefix, &c.key, v));
    match (was, is) {
        (false, true) => Some(Kind::Added),
        (true, true) => Some(Kind::Modified),
        (true, false) => Some(Kind::Deleted),
        (false, false) => None,
    }
}

/// A value the writer stores: labels and a node, as a pod's.
pub fn value(app: usize, node: usize, generation: u64) -> Vec<u8> {
    format!(
        r#"{{"metadata":{{"labels":{{"app":"a-{app}"}}}},"spec":{{"nodeName":"node-{node}"}},"generation":{generation}}}"#
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_selection() {
        let history = History {
            start: 1,
            initial: State::new(),
            initial_versions: Default::default(),
            changes: vec![
                Change {
                    revision: 2,
                    key: "/p/ns-0/obj-1".into(),
                    value: Some(value(1, 0, 1)),
                },
                Change {
                    revision: 3,
                    key: "/p/ns-0/obj-1".into(),
                    value: Some(value(2, 0, 2)),
                },
                Change {
                    revision: 4,
                    key: "/p/ns-0/obj-1".into(),
                    value: Some(value(1, 0, 3)),
                },
                Change {
                    revision: 5,
                    key: "/p/ns-0/obj-1".into(),
                    value: None,
                },
                Change {
                    revision: 6,
                    key: "/p/ns-1/obj-1".into(),
                    value: Some(value(1, 0, 1)),
                },
            ],
        };
        let s = Selection {
            namespace: Some("ns-0".into()),
            app: Some("a-1".into()),
            ..Selection::default()
        };
        let got: Vec<(Kind, u64)> = expected_after(&history, "/p", &s, 1)
            .into_iter()
            .map(|e| (e.kind, e.revision))
            .collect();
        assert_eq!(
            got,
            [
                (Kind::Added, 2),
                (Kind::Deleted, 3),
                (Kind::Added, 4),
                (Kind::Deleted, 5)
            ]
        );
        assert_eq!(expected_after(&history, "/p", &s, 4).len(), 1);
    }
}
