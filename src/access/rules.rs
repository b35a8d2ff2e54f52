//! Authorization rules: which callers may list, get and watch which
//! resources in which namespaces, and through which selectors. Rules add
//! up, as in RBAC: a request is allowed when some rule allows it, and the
//! caller then sees the union of what the allowing rules select.

use std::collections::HashSet;

use super::Caller;
use crate::config::{RuleConfig, Verb};
use crate::object::Resource;
use crate::selector::{Predicate, SelectorError};

/// What an allowed request may see beyond its own selectors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scope {
    /// (label selector, field selector) pairs; an object must match one.
    /// Empty: everything the request selects.
    pub alternatives: Vec<(String, String)>,
}

impl Scope {
    pub fn unrestricted() -> Self {
        Self::default()
    }

    /// Whether a request in `namespace` ("" for every one) under this
    /// scope sees the whole resource: every namespace, no selector forced.
    pub fn covers_whole(&self, namespace: &str) -> bool {
        namespace.is_empty() && self.alternatives.is_empty()
    }

    /// A request's own selectors within what this scope lets it see: the
    /// predicate every read and watch of the request is judged by.
    pub fn predicate(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        labels: &str,
        fields: &str,
    ) -> Result<Predicate, SelectorError> {
        let own = Predicate::new(resource, namespace, name, labels, fields)?;
        let alternatives = (self.alternatives.iter())
            .map(|(l, f)| Predicate::new(resource, "", "", l, f))
            .collect::<Result<_, _>>()?;
        Ok(own.within(alternatives))
    }
}

/// Why a request was denied, for the log and the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// No rule names this caller, verb, resource and namespace.
    NoRule,
    /// A rule names them only for a narrower namespace scope.
    TooWide,
}

struct Rule {
    everyone: bool,
    users: HashSet<String>,
    groups: HashSet<String>,
    resources: Option<HashSet<String>>,
    namespaces: Option<HashSet<String>>,
    verbs: HashSet<Verb>,
    label_selector: String,
    field_selector: String,
}

/// Characters a user name may have to stand in a selector: anything else
/// could change the selector's meaning.
fn selector_safe(user: &str) -> bool {
    !user.is_empty()
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b))
}

impl Rule {
    fn names(&self, caller: &Caller) -> bool {
        self.everyone
            || self.users.contains(&caller.user)
            || caller.groups.iter().any(|g| self.groups.contains(g))
    }

    /// The rule's selectors for `user`; none when they use `{user}` and the
    /// name cannot stand in a selector.
    fn selectors(&self, user: &str) -> Option<(String, String)> {
        let uses_user =
            self.label_selector.contains("{user}") || self.field_selector.contains("{user}");
        if uses_user && !selector_safe(user) {
            return None;
        }
        Some((
            self.label_selector.replace("{user}", user),
            self.field_selector.replace("{user}", user),
        ))
    }
}

pub struct Rules(Vec<Rule>);

impl Rules {
    /// Compiles the rules, checking every selector against every resource
    /// its rule names.
    pub fn new(rules: &[RuleConfig], resources: &[Resource]) -> anyhow::Result<Self> {
        let set = |v: &[String]| -> Option<HashSet<String>> {
            (!v.iter().any(|s| s == "*")).then(|| v.iter().cloned().collect())
        };
        let mut compiled = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let rule = Rule {
                everyone: r.subjects.iter().any(|s| s == "*"),
                users: r
                    .subjects
                    .iter()
                    .filter_map(|s| s.strip_prefix("user:").map(str::to_owned))
                    .collect(),
                groups: r
                    .subjects
                    .iter()
                    .filter_map(|s| s.strip_prefix("group:").map(str::to_owned))
                    .collect(),
                resources: set(&r.resources),
                namespaces: set(&r.namespaces),
                verbs: r.verbs.iter().copied().collect(),
                label_selector: r.label_selector.clone(),
                field_selector: r.field_selector.clone(),
            };
            let (labels, fields) = rule.selectors("user").expect("a safe name");
            for resource in resources {
                if rule
                    .resources
                    .as_ref()
                    .is_some_and(|s| !s.contains(&resource.name))
                {
                    continue;
                }
                Predicate::new(resource, "", "", &labels, &fields).map_err(|e| {
                    anyhow::anyhow!("authorization.rules[{i}]: {e} (for {})", resource.name)
                })?;
            }
            compiled.push(rule);
        }
        Ok(Self(compiled))
    }

    /// Whether a rule lets `caller` `verb` some of `resource` (in some
    /// namespace, through some selector): what a refusal may name to it.
    pub fn reaches(&self, caller: &Caller, verb: Verb, resource: &str) -> bool {
        self.0.iter().any(|rule| {
            rule.names(caller)
                && rule.verbs.contains(&verb)
                && rule.resources.as_ref().is_none_or(|r| r.contains(resource))
        })
    }

    /// Whether a rule lets `caller` `verb` every resource in every
    /// namespace without a selector: what reading keys of no resource
    /// takes, which no narrower rule can name.
    pub fn allows_everything(&self, caller: &Caller, verb: Verb) -> bool {
        self.0.iter().any(|rule| {
            rule.names(caller)
                && rule.verbs.contains(&verb)
                && rule.resources.is_none()
                && rule.namespaces.is_none()
                && rule.label_selector.is_empty()
                && rule.field_selector.is_empty()
        })
    }

    /// Whether `caller` may `verb` `resource` in `namespace` ("" for every
    /// namespace), and through which selectors.
    pub fn authorize(
        &self,
        caller: &Caller,
        verb: Verb,
        resource: &Resource,
        namespace: &str,
    ) -> Result<Scope, Denial> {
        let wide = !resource.namespaced || namespace.is_empty();
        let mut denial = Denial::NoRule;
        let mut alternatives = Vec::new();
        let mut everything = false;
        for rule in &self.0 {
            let applies = rule.names(caller)
                && rule.verbs.contains(&verb)
                && rule
                    .resources
                    .as_ref()
                    .is_none_or(|s| s.contains(&resource.name));
            if !applies {
                continue;
            }
            let in_scope = match &rule.namespaces {
                None => true,
                Some(set) => !wide && set.contains(namespace),
            };
            if !in_scope {
                if wide {
                    denial = Denial::TooWide;
                }
                continue;
            }
            let Some(selectors) = rule.selectors(&caller.user) else {
                continue;
            };
            if selectors.0.is_empty() && selectors.1.is_empty() {
                everything = true;
            } else if !alternatives.contains(&selectors) {
                alternatives.push(selectors);
            }
        }
        match (everything, alternatives.is_empty()) {
            (true, _) => Ok(Scope::unrestricted()),
            (false, false) => Ok(Scope { alternatives }),
            (false, true) => Err(denial),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> Rules {
        let rules: Vec<RuleConfig> = serde_yaml_ng::from_str(yaml).unwrap();
        Rules::new(&rules, &[Resource::for_tests(&["spec.nodeName"])]).unwrap()
    }

    fn caller(user: &str, groups: &[&str]) -> Caller {
        Caller {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn rules_allow_by_subject_verb_resource_and_namespace_scope() {
        let r = rules(
            r#"
- {subjects: ["group:tenant-a"], resources: [pods], namespaces: [tenant-a], verbs: [list, watch]}
- {subjects: ["user:node-7"], resources: ["*"], namespaces: ["*"], verbs: [list, get, watch], field_selector: "spec.nodeName={user}"}
"#,
        );
        let pods = Resource::for_tests(&["spec.nodeName"]);
        let alice = caller("alice", &["tenant-a"]);
        assert_eq!(
            r.authorize(&alice, Verb::List, &pods, "tenant-a"),
            Ok(Scope::unrestricted())
        );
        assert_eq!(
            r.authorize(&alice, Verb::Get, &pods, "tenant-a"),
            Err(Denial::NoRule)
        );
        assert_eq!(
            r.authorize(&alice, Verb::List, &pods, "tenant-b"),
            Err(Denial::NoRule)
        );
        assert_eq!(
            r.authorize(&alice, Verb::List, &pods, ""),
            Err(Denial::TooWide),
            "all namespaces when the rule names one"
        );
        let node = caller("node-7", &[]);
        assert_eq!(
            r.authorize(&node, Verb::Watch, &pods, ""),
            Ok(Scope {
                alternatives: vec![(String::new(), "spec.nodeName=node-7".into())]
            })
        );
        let sneaky = caller("x,metadata.name!=y", &[]);
        assert_eq!(
            r.authorize(&sneaky, Verb::List, &pods, ""),
            Err(Denial::NoRule)
        );
    }

    #[test]
    fn keys_of_no_resource_take_a_rule_over_everything_without_a_selector() {
        let r = rules(
            r#"
- {subjects: ["user:root"], resources: ["*"], namespaces: ["*"], verbs: [list, watch]}
- {subjects: ["user:node-7"], resources: ["*"], namespaces: ["*"], verbs: [list], field_selector: "spec.nodeName={user}"}
- {subjects: ["user:alice"], resources: [pods], namespaces: ["*"], verbs: [list]}
- {subjects: ["user:bob"], resources: ["*"], namespaces: [ns-1], verbs: [list]}
"#,
        );
        let may = |user: &str, verb| r.allows_everything(&caller(user, &[]), verb);
        assert!(may("root", Verb::List) && may("root", Verb::Watch));
        assert!(!may("root", Verb::Get), "another verb");
        assert!(!may("node-7", Verb::List), "a selector");
        assert!(!may("alice", Verb::List), "one resource");
        assert!(!may("bob", Verb::List), "one namespace");
    }

    #[test]
    fn several_allowing_rules_give_the_union_of_their_selectors() {
        let r = rules(
            r#"
- {subjects: ["*"], resources: [pods], namespaces: ["*"], verbs: [list], label_selector: "app=web"}
- {subjects: ["group:ops"], resources: [pods], namespaces: ["*"], verbs: [list], label_selector: "app=db"}
- {subjects: ["user:root"], resources: [pods], namespaces: ["*"], verbs: [list]}
"#,
        );
        let pods = Resource::for_tests(&["spec.nodeName"]);
        let scope = r
            .authorize(&caller("o", &["ops"]), Verb::List, &pods, "")
            .unwrap();
        assert_eq!(scope.alternatives.len(), 2);
        assert_eq!(
            r.authorize(&caller("root", &["ops"]), Verb::List, &pods, ""),
            Ok(Scope::unrestricted()),
            "a rule without selectors allows everything"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_rules_text_is_compiled_or_refused_without_a_panic(
            text in "[\\[\\]{}:,\"a-z*= !()\n-]{0,160}",
            selector in "[ -~]{0,40}",
        ) {
            let resources = [Resource::for_tests(&["spec.nodeName"])];
            if let Ok(rules) = serde_yaml_ng::from_str::<Vec<RuleConfig>>(&text) {
                let _ = Rules::new(&rules, &resources);
            }
            let rule = RuleConfig {
                subjects: vec!["*".into()],
                resources: vec!["*".into()],
                namespaces: vec!["*".into()],
                verbs: vec![Verb::List],
                label_selector: selector.clone(),
                field_selector: selector,
            };
            if let Ok(rules) = Rules::new(&[rule], &resources) {
                let caller = Caller { user: "u".into(), groups: vec![] };
                let _ = rules.authorize(&caller, Verb::List, &resources[0], "");
            }
        }
    }

    #[test]
    fn a_rule_whose_selector_does_not_parse_is_refused_at_start() {
        let rules: Vec<RuleConfig> = serde_yaml_ng::from_str(
            r#"[{subjects: ["*"], resources: [pods], namespaces: ["*"], verbs: [list], field_selector: "spec.color=red"}]"#,
        )
        .unwrap();
        let err = Rules::new(&rules, &[Resource::for_tests(&["spec.nodeName"])])
            .err()
            .unwrap();
        assert!(err.to_string().contains("authorization.rules[0]"), "{err}");
    }
}
