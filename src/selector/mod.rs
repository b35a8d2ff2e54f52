//! Label and field selectors, and the predicate a watcher or list applies.
//!
//! Labels use the Kubernetes grammar (`k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k`, `!k`); fields are `f=v`, `f==v`, `f!=v` on
//! `metadata.name`, `metadata.namespace` and the resource's selectable
//! fields. Requirements are joined by commas (AND).

mod field;
mod label;
mod shard;

use crate::object::{Object, Resource};
pub use field::FieldRef;
use field::FieldRequirement;
use label::LabelRequirement;
pub use shard::{Shard, ShardError, MAX_RANGES};

/// The longest selector accepted, in bytes: parsing one costs a multiple
/// of its length, before any rule has looked at the request.
pub const MAX_SELECTOR_BYTES: usize = 4096;
/// The most terms one selector may have (a requirement, or each value of an
/// `in`/`notin` set): every event is matched against each of them.
pub const MAX_SELECTOR_TERMS: usize = 100;

/// A selector that cannot be parsed; the message points at the bad part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("label selector: {0}")]
    Label(String),
    #[error("field selector: {0}")]
    Field(String),
}

/// Everything a request filters by: namespace, name and selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Predicate {
    namespace: Option<String>,
    name: Option<String>,
    labels: Vec<LabelRequirement>,
    fields: Vec<FieldRequirement>,
    /// What the caller is allowed to see, when authorization rules allow
    /// it through several selectors: an object must match one of them too.
    any_of: Vec<Predicate>,
    shard: Option<Shard>,
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
        let too_long = |selector: &str| {
            (selector.len() > MAX_SELECTOR_BYTES).then(|| {
                format!(
                    "{} bytes, over the limit of {MAX_SELECTOR_BYTES} bytes",
                    selector.len()
                )
            })
        };
        let too_many = |terms: usize| {
            (terms > MAX_SELECTOR_TERMS)
                .then(|| format!("{terms} terms, over the limit of {MAX_SELECTOR_TERMS} terms"))
        };
        if let Some(e) = too_long(label_selector) {
            return Err(SelectorError::Label(e));
        }
        if let Some(e) = too_long(field_selector) {
            return Err(SelectorError::Field(e));
        }
        let labels = label::parse(label_selector)?;
        let terms = labels.iter().map(LabelRequirement::terms).sum();
        if let Some(e) = too_many(terms) {
            return Err(SelectorError::Label(e));
        }
        let fields = field::parse(field_selector, resource)?;
        if let Some(e) = too_many(fields.len()) {
            return Err(SelectorError::Field(e));
        }
        Ok(Self {
            namespace: (resource.namespaced && !namespace.is_empty()).then(|| namespace.to_owned()),
            name: (!name.is_empty()).then(|| name.to_owned()),
            labels,
            fields,
            any_of: Vec::new(),
            shard: None,
        })
    }

    /// This predicate, narrowed to one shard.
    pub fn in_shard(self, shard: Option<Shard>) -> Self {
        Self { shard, ..self }
    }

    pub fn shard(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    /// This predicate, narrowed to objects that also match one of
    /// `alternatives` (none: no narrowing). A single alternative joins its
    /// requirements to this predicate's, so that a field it pins still
    /// finds the watcher through the trigger index.
    pub fn within(mut self, mut alternatives: Vec<Predicate>) -> Self {
        match alternatives.len() {
            1 => {
                let only = alternatives.remove(0);
                debug_assert!(only.namespace.is_none() && only.name.is_none());
                self.labels.extend(only.labels);
                self.fields.extend(only.fields);
                self.any_of.extend(only.any_of);
            }
            _ => self.any_of = alternatives,
        }
        self
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether the predicate filters by anything beyond namespace and name.
    pub fn has_selectors(&self) -> bool {
        !self.labels.is_empty()
            || !self.fields.is_empty()
            || !self.any_of.is_empty()
            || self.shard.is_some()
    }

    /// The selectable fields this predicate pins to one value by equality:
    /// (index into the resource's selectable fields, value). Only objects
    /// with that value can match.
    pub fn pinned_fields(&self) -> impl Iterator<Item = (usize, &str)> {
        self.fields.iter().filter_map(|r| match r.field {
            FieldRef::Selectable(i) if r.equals => Some((i, r.value.as_str())),
            _ => None,
        })
    }

    /// Whether the predicate is exactly "selectable field `field` equals
    /// some value", so an object's value of that field decides alone.
    pub fn is_only_field_pin(&self, field: usize) -> bool {
        self.namespace.is_none()
            && self.name.is_none()
            && self.labels.is_empty()
            && self.any_of.is_empty()
            && self.shard.is_none()
            && matches!(&self.fields[..], [r] if r.equals && r.field == FieldRef::Selectable(field))
    }

    /// Whether the predicate is only a name (and namespace), so an object's
    /// key decides alone.
    pub fn is_only_name(&self) -> bool {
        self.name.is_some() && !self.has_selectors()
    }

    pub fn matches(&self, o: &Object) -> bool {
        self.namespace.as_ref().is_none_or(|ns| ns == o.namespace())
            && self.name.as_ref().is_none_or(|n| n == o.name())
            && self.labels.iter().all(|r| r.matches(o.labels()))
            && self.fields.iter().all(|r| {
                let v = match r.field {
                    FieldRef::Name => o.name(),
                    FieldRef::Namespace => o.namespace(),
                    FieldRef::Selectable(i) => o.fields().get(i).unwrap_or_default(),
                };
                (v == r.value) == r.equals
            })
            && (self.any_of.is_empty() || self.any_of.iter().any(|p| p.matches(o)))
            && self.shard.as_ref().is_none_or(|s| s.matches(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn pods() -> Resource {
        Resource::for_tests(&["spec.nodeName"])
    }

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], node: &str) -> Object {
        Object::bare(&format!("/p/{ns}/{name}"), ns, name, 1, labels, &[node])
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
    fn parse_errors_say_which_selector_is_wrong() {
        let e = Predicate::new(&pods(), "", "", "app in (a", "").unwrap_err();
        assert!(matches!(e, SelectorError::Label(_)), "{e}");
        let e = Predicate::new(&pods(), "", "", "", "spec.color=red").unwrap_err();
        assert!(matches!(e, SelectorError::Field(_)), "{e}");
    }

    #[test]
    fn selectors_over_their_size_or_term_limit_are_refused_naming_it() {
        let long = format!("app={}", "x".repeat(MAX_SELECTOR_BYTES));
        let e = Predicate::new(&pods(), "", "", &long, "").unwrap_err();
        assert!(matches!(e, SelectorError::Label(_)), "{e}");
        assert!(e.to_string().contains("4096 bytes"), "{e}");
        let many: Vec<String> = (0..=MAX_SELECTOR_TERMS).map(|i| format!("k{i}")).collect();
        let e = Predicate::new(&pods(), "", "", &many.join(","), "").unwrap_err();
        assert!(e.to_string().contains("terms"), "{e}");
        let set = format!("app in ({})", many.join(","));
        let e = Predicate::new(&pods(), "", "", &set, "").unwrap_err();
        assert!(e.to_string().contains("terms"), "{e}");
        let fields: Vec<String> = (0..=MAX_SELECTOR_TERMS)
            .map(|i| format!("metadata.name!=n{i}"))
            .collect();
        let e = Predicate::new(&pods(), "", "", "", &fields.join(",")).unwrap_err();
        assert!(matches!(e, SelectorError::Field(_)), "{e}");
        let at_limit = many[..MAX_SELECTOR_TERMS].join(",");
        assert!(Predicate::new(&pods(), "", "", &at_limit, "").is_ok());
    }

    #[test]
    fn only_equalities_on_selectable_fields_are_pinned() {
        let p = pred("", "spec.nodeName=n1,metadata.name=a,spec.nodeName!=n2");
        assert_eq!(p.pinned_fields().collect::<Vec<_>>(), [(0, "n1")]);
    }
}
