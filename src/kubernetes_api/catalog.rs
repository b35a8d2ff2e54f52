//! Which resources Kubernetes' API serves, and as what: each configured
//! resource's group, version, kind and plural, from its `kubernetes`
//! section or, where that leaves them out, from where the apiserver
//! stores it ([`kinds`](super::kinds)).

use std::collections::HashMap;

use anyhow::bail;

use super::kinds::{self, ApiKind};
use crate::config::{ResourceConfig, ValueFormat};

/// A resource served on Kubernetes' API.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The resource's name in the read core.
    pub resource: String,
    pub kind: ApiKind,
    /// `v1`, `apps/v1`: what its objects' `apiVersion` says.
    pub api_version: String,
    pub format: ValueFormat,
}

/// Every resource served on Kubernetes' API, found by its path.
#[derive(Debug, Default)]
pub struct Catalog {
    entries: Vec<Entry>,
    kinds: Vec<ApiKind>,
    by_path: HashMap<(String, String, String), usize>,
}

impl Catalog {
    /// The catalog of `resources`, and the names of those it leaves out
    /// (raw values, or a prefix that names no kind without a
    /// `kubernetes` section). Fails, naming the field, for a section that
    /// leaves a name unknown, or two resources at one path.
    pub fn new(resources: &[ResourceConfig]) -> anyhow::Result<(Self, Vec<String>)> {
        let mut catalog = Self::default();
        let mut left_out = Vec::new();
        for (i, r) in resources.iter().enumerate() {
            let Some(kind) = api_kind(i, r)? else {
                left_out.push(r.name.clone());
                continue;
            };
            let path = (
                kind.group.clone(),
                kind.version.clone(),
                kind.plural.clone(),
            );
            if let Some(&other) = catalog.by_path.get(&path) {
                bail!(
                    "resources[{i}].kubernetes: {} and {} are both {}/{} {}: give one a kubernetes section of its own",
                    catalog.entries[other].resource,
                    r.name,
                    path.0,
                    path.1,
                    path.2
                );
            }
            catalog.by_path.insert(path, catalog.entries.len());
            let api_version = match kind.group.as_str() {
                "" => kind.version.clone(),
                group => format!("{group}/{}", kind.version),
            };
            catalog.kinds.push(kind.clone());
            catalog.entries.push(Entry {
                resource: r.name.clone(),
                kind,
                api_version,
                format: r.format,
            });
        }
        Ok((catalog, left_out))
    }

    /// The resource served at `group`/`version`/`plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&Entry> {
        let key = (group.to_owned(), version.to_owned(), plural.to_owned());
        self.by_path.get(&key).map(|&i| &self.entries[i])
    }

    /// A resource served as `group`/`plural`, in any version.
    pub fn plural(&self, group: &str, plural: &str) -> Option<&Entry> {
        (self.entries.iter()).find(|e| e.kind.group == group && e.kind.plural == plural)
    }

    /// What discovery lists.
    pub fn kinds(&self) -> &[ApiKind] {
        &self.kinds
    }
}

/// What resource `i` is to Kubernetes' API: its section's names, the rest
/// from its prefix; none when it is not served there.
fn api_kind(i: usize, r: &ResourceConfig) -> anyhow::Result<Option<ApiKind>> {
    if r.format == ValueFormat::Raw {
        return Ok(None);
    }
    let built_in = kinds::built_in(&r.prefix);
    let custom = kinds::custom(&r.prefix);
    let section = r.kubernetes.clone().unwrap_or_default();
    let from_prefix = |f: fn(&ApiKind) -> &String| built_in.as_ref().map(|k| f(k).clone());
    let group = (section.group.clone())
        .or_else(|| from_prefix(|k| &k.group))
        .or_else(|| custom.map(|c| c.0.to_owned()));
    let plural = (section.plural.clone())
        .or_else(|| from_prefix(|k| &k.plural))
        .or_else(|| custom.map(|c| c.1.to_owned()))
        .or_else(|| r.kubernetes.as_ref().map(|_| r.name.clone()));
    let version = section
        .version
        .clone()
        .or_else(|| from_prefix(|k| &k.version));
    let kind = section.kind.clone().or_else(|| from_prefix(|k| &k.kind));
    let (Some(group), Some(version), Some(kind), Some(plural)) = (group, version, kind, plural)
    else {
        if r.kubernetes.is_none() {
            return Ok(None);
        }
        let missing = [
            (
                "group",
                section.group.is_none() && built_in.is_none() && custom.is_none(),
            ),
            ("version", section.version.is_none()),
            ("kind", section.kind.is_none()),
        ];
        let missing: Vec<&str> = (missing.iter()).filter(|m| m.1).map(|m| m.0).collect();
        bail!(
            "resources[{i}].kubernetes: {} of {} cannot be taken from its prefix {}: name {}",
            missing.join(" and "),
            r.name,
            r.prefix,
            missing.join(", ")
        );
    };
    // Short names and categories are the built-in's only where it is the
    // same kind.
    let same = (built_in.as_ref()).filter(|b| b.group == group && b.plural == plural);
    Ok(Some(ApiKind {
        short_names: same.map(|b| b.short_names.clone()).unwrap_or_default(),
        categories: same.map(|b| b.categories.clone()).unwrap_or_default(),
        group,
        version,
        kind,
        plural,
        namespaced: r.namespaced,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn catalog(resources: &str) -> anyhow::Result<(Catalog, Vec<String>)> {
        let yaml = format!("etcd: {{endpoints: [http://127.0.0.1:2379]}}\nresources:\n{resources}");
        Catalog::new(&Config::from_yaml(&yaml).unwrap().resources)
    }

    #[test]
    fn built_ins_and_custom_resources_take_their_names_from_their_prefix() {
        let (c, left_out) = catalog(
            "- {name: pods, prefix: /registry/pods}
- {name: nodes, prefix: /registry/minions, namespaced: false}
- {name: widgets, prefix: /registry/example.com/widgets, kubernetes: {version: v1beta1, kind: Widget}}
- {name: gadgets, prefix: /registry/example.com/gadgets}
- {name: blobs, prefix: /blobs, format: raw}
- {name: things, prefix: /things, kubernetes: {group: example.com, version: v1, kind: Thing}}
",
        )
        .unwrap();
        assert_eq!(left_out, ["gadgets", "blobs"]);
        let pods = c.find("", "v1", "pods").unwrap();
        assert_eq!(
            (pods.resource.as_str(), pods.api_version.as_str()),
            ("pods", "v1")
        );
        assert_eq!(pods.kind.short_names, ["po"]);
        let nodes = c.find("", "v1", "nodes").unwrap();
        assert!(!nodes.kind.namespaced);
        let widgets = c.find("example.com", "v1beta1", "widgets").unwrap();
        assert_eq!(widgets.kind.kind, "Widget");
        assert_eq!(widgets.api_version, "example.com/v1beta1");
        let things = c.find("example.com", "v1", "things").unwrap();
        assert_eq!(things.resource, "things", "the plural defaults to its name");
        assert!(c.find("", "v1", "gadgets").is_none());
        assert_eq!(c.kinds().len(), 4);
    }

    #[test]
    fn a_section_that_leaves_a_name_unknown_or_a_path_taken_twice_is_refused() {
        let e = catalog("- {name: widgets, prefix: /registry/example.com/widgets, kubernetes: {kind: Widget}}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources[0].kubernetes: version of widgets"),
            "{e}"
        );
        let e = catalog(
            "- {name: pods, prefix: /registry/pods}\n- {name: pods2, prefix: /other, kubernetes: {group: '', version: v1, kind: Pod, plural: pods}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("resources[1].kubernetes: pods and pods2 are both /v1 pods"),
            "{e}"
        );
    }
}
