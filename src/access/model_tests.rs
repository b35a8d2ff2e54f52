//! Random rule sets, callers and requests: what the rules let a request
//! see equals a brute-force model of them, object for object.

use proptest::prelude::*;

use super::rules::Rules;
use super::Caller;
use crate::config::{RuleConfig, Verb};
use crate::object::{Object, Resource};

const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];
const NODES: [&str; 3] = ["n0", "n1", "n2"];
const APPS: [&str; 2] = ["web", "db"];
const VERBS: [Verb; 3] = [Verb::List, Verb::Get, Verb::Watch];

fn resource() -> Resource {
    Resource::for_tests(&["spec.nodeName"])
}

/// Every combination of namespace, node and app, once.
fn objects(r: &Resource) -> Vec<Object> {
    let mut out = Vec::new();
    for ns in NAMESPACES {
        for node in NODES {
            for app in APPS {
                let name = format!("{node}-{app}");
                let v = format!(
                    r#"{{"metadata":{{"labels":{{"app":"{app}"}}}},"spec":{{"nodeName":"{node}"}}}}"#
                );
                out.push(
                    r.decode(r.key(ns, &name).as_bytes(), v.as_bytes(), 1)
                        .unwrap(),
                );
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
struct ModelRule {
    everyone: bool,
    users: Vec<String>,
    groups: Vec<String>,
    all_resources: bool,
    namespaces: Option<Vec<&'static str>>,
    verbs: Vec<Verb>,
    /// None, or the app the label selector pins.
    app: Option<&'static str>,
    /// None, Some(None) for `{user}`, Some(Some(node)) for a node.
    node: Option<Option<&'static str>>,
}

impl ModelRule {
    fn config(&self) -> RuleConfig {
        let mut subjects: Vec<String> = self.users.iter().map(|u| format!("user:{u}")).collect();
        subjects.extend(self.groups.iter().map(|g| format!("group:{g}")));
        if self.everyone || subjects.is_empty() {
            subjects.push("*".into());
        }
        RuleConfig {
            subjects,
            resources: vec![if self.all_resources { "*" } else { "pods" }.into()],
            namespaces: match &self.namespaces {
                None => vec!["*".into()],
                Some(ns) => ns.iter().map(|n| n.to_string()).collect(),
            },
            verbs: self.verbs.clone(),
            label_selector: self.app.map(|a| format!("app={a}")).unwrap_or_default(),
            field_selector: match self.node {
                None => String::new(),
                Some(None) => "spec.nodeName={user}".into(),
                Some(Some(n)) => format!("spec.nodeName={n}"),
            },
        }
    }

    fn names(&self, c: &Caller) -> bool {
        self.everyone
            || (self.users.is_empty() && self.groups.is_empty())
            || self.users.contains(&c.user)
            || c.groups.iter().any(|g| self.groups.contains(g))
    }

    fn selects(&self, c: &Caller, o: &Object) -> bool {
        let app = o.labels().get("app");
        self.app.is_none_or(|a| app == Some(a))
            && match self.node {
                None => true,
                Some(None) => o.fields().get(0) == Some(c.user.as_str()),
                Some(Some(n)) => o.fields().get(0) == Some(n),
            }
    }
}

fn rule() -> impl Strategy<Value = ModelRule> {
    let names = prop::collection::vec(prop::sample::select(vec!["n0", "n1", "u"]), 0..2);
    let groups = prop::collection::vec(prop::sample::select(vec!["g0", "g1"]), 0..2);
    let namespaces = prop::option::of(prop::sample::subsequence(NAMESPACES.to_vec(), 1..3));
    let verbs = prop::sample::subsequence(VERBS.to_vec(), 1..4);
    let app = prop::option::of(prop::sample::select(APPS.to_vec()));
    let node = prop::option::of(prop::option::of(prop::sample::select(NODES.to_vec())));
    (
        any::<bool>(),
        names,
        groups,
        any::<bool>(),
        namespaces,
        verbs,
        app,
        node,
    )
        .prop_map(
            |(everyone, users, groups, all_resources, namespaces, verbs, app, node)| ModelRule {
                everyone: everyone && users.is_empty(),
                users: users.into_iter().map(String::from).collect(),
                groups: groups.into_iter().map(String::from).collect(),
                all_resources,
                namespaces,
                verbs,
                app,
                node,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn what_a_request_sees_is_what_the_rules_allow(
        rules in prop::collection::vec(rule(), 0..5),
        user in prop::sample::select(vec!["n0", "n1", "n2", "u"]),
        groups in prop::sample::subsequence(vec!["g0", "g1"], 0..3),
        verb in prop::sample::select(VERBS.to_vec()),
        namespace in prop::sample::select(vec!["", "ns0", "ns1", "ns2"]),
        app in prop::option::of(prop::sample::select(APPS.to_vec())),
        node in prop::option::of(prop::sample::select(NODES.to_vec())),
    ) {
        let r = resource();
        let configs: Vec<RuleConfig> = rules.iter().map(ModelRule::config).collect();
        let compiled = Rules::new(&configs, std::slice::from_ref(&r)).unwrap();
        let caller = Caller {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let (labels, fields) = (
            app.map(|a| format!("app={a}")).unwrap_or_default(),
            node.map(|n| format!("spec.nodeName={n}")).unwrap_or_default(),
        );
        let requested = |o: &Object| {
            (namespace.is_empty() || o.namespace() == namespace)
                && app.is_none_or(|a| o.labels().get("app") == Some(a))
                && node.is_none_or(|n| o.fields().get(0) == Some(n))
        };
        let allowing: Vec<&ModelRule> = rules
            .iter()
            .filter(|m| m.names(&caller) && m.verbs.contains(&verb))
            .filter(|m| match &m.namespaces {
                None => true,
                Some(ns) => !namespace.is_empty() && ns.contains(&namespace),
            })
            .collect();
        match compiled.authorize(&caller, verb, &r, namespace) {
            Err(_) => prop_assert!(allowing.is_empty(), "denied, but {allowing:?} allow it"),
            Ok(scope) => {
                prop_assert!(!allowing.is_empty(), "allowed without a rule");
                let p = scope.predicate(&r, namespace, "", &labels, &fields).unwrap();
                for o in objects(&r) {
                    let want = requested(&o) && allowing.iter().any(|m| m.selects(&caller, &o));
                    prop_assert_eq!(p.matches(&o), want, "{}", o.key());
                }
            }
        }
    }
}
