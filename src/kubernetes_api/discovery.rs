//! The discovery documents of the served resources, as the apiserver's
//! legacy discovery writes them: `/api` (the core group's versions),
//! `/apis` (the other groups), `/apis/<group>` and each version's
//! resources, with the verbs watchproxy serves (get, list, watch).
//! Clients that ask for aggregated discovery take these instead, as they
//! do from an apiserver without it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::kinds::ApiKind;

/// What is served of every resource.
const VERBS: [&str; 3] = ["get", "list", "watch"];

/// `/version`: the Kubernetes version whose API is served, and this
/// build's.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": concat!("v1.33.0+watchproxy-", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// The machine's architecture as Go names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `/api`: the core group's versions.
pub fn legacy_versions(served: &[ApiKind]) -> Value {
    let versions: Vec<&str> = versions_of(served, "");
    json!({
        "kind": "APIVersions",
        "versions": versions,
        "serverAddressByClientCIDRs": [],
    })
}

/// `/apis`: every group but the core one, in name order.
pub fn groups(served: &[ApiKind]) -> Value {
    let names: BTreeMap<&str, ()> = served
        .iter()
        .filter(|k| !k.group.is_empty())
        .map(|k| (k.group.as_str(), ()))
        .collect();
    let groups: Vec<Value> = names.keys().map(|g| group_body(served, g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`; none for a group not served.
pub fn group(served: &[ApiKind], name: &str) -> Option<Value> {
    if name.is_empty() || !served.iter().any(|k| k.group == name) {
        return None;
    }
    let mut body = group_body(served, name);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Some(body)
}

/// `/api/<version>` (group "") or `/apis/<group>/<version>`; none for a
/// version not served.
pub fn resources(served: &[ApiKind], group: &str, version: &str) -> Option<Value> {
    let resources: Vec<Value> = served
        .iter()
        .filter(|k| k.group == group && k.version == version)
        .map(|k| {
            let mut resource = json!({
                "name": k.plural,
                "singularName": k.kind.to_lowercase(),
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": VERBS,
            });
            if !k.short_names.is_empty() {
                resource["shortNames"] = json!(k.short_names);
            }
            if !k.categories.is_empty() {
                resource["categories"] = json!(k.categories);
            }
            resource
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

fn group_version(group: &str, version: &str) -> String {
    match group {
        "" => version.to_owned(),
        g => format!("{g}/{version}"),
    }
}

/// A group's versions, in the order the served resources name them.
fn versions_of<'a>(served: &'a [ApiKind], group: &str) -> Vec<&'a str> {
    let mut versions: Vec<&str> = Vec::new();
    for k in served.iter().filter(|k| k.group == group) {
        if !versions.contains(&k.version.as_str()) {
            versions.push(&k.version);
        }
    }
    versions
}

fn group_body(served: &[ApiKind], name: &str) -> Value {
    let versions: Vec<Value> = versions_of(served, name)
        .into_iter()
        .map(|v| json!({"groupVersion": group_version(name, v), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": versions, "preferredVersion": preferred})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> ApiKind {
        ApiKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
        }
    }

    fn served() -> Vec<ApiKind> {
        vec![
            kind("", "v1", "Pod", "pods", true),
            kind("", "v1", "Node", "nodes", false),
            kind("apps", "v1", "Deployment", "deployments", true),
            kind("example.com", "v1beta1", "Widget", "widgets", true),
        ]
    }

    #[test]
    fn the_core_group_lists_its_resources_with_the_verbs_served() {
        assert_eq!(
            legacy_versions(&served()),
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        );
        let v1 = resources(&served(), "", "v1").unwrap();
        assert_eq!(v1["groupVersion"], "v1");
        assert_eq!(
            v1["resources"][0],
            json!({
                "name": "pods", "singularName": "pod", "namespaced": true,
                "kind": "Pod", "verbs": ["get", "list", "watch"]
            })
        );
        assert_eq!(v1["resources"][1]["namespaced"], false);
        let mut pods = served();
        pods[0].short_names = vec!["po".into()];
        pods[0].categories = vec!["all".into()];
        let v1 = resources(&pods, "", "v1").unwrap();
        assert_eq!(v1["resources"][0]["shortNames"], json!(["po"]));
        assert_eq!(v1["resources"][0]["categories"], json!(["all"]));
        assert_eq!(resources(&served(), "", "v2"), None);
    }

    #[test]
    fn other_groups_are_listed_by_name_with_their_preferred_version() {
        let all = groups(&served());
        let names: Vec<&str> = all["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["apps", "example.com"]);
        let widgets = group(&served(), "example.com").unwrap();
        assert_eq!(widgets["kind"], "APIGroup");
        assert_eq!(
            widgets["preferredVersion"],
            json!({"groupVersion": "example.com/v1beta1", "version": "v1beta1"})
        );
        let list = resources(&served(), "example.com", "v1beta1").unwrap();
        assert_eq!(list["groupVersion"], "example.com/v1beta1");
        assert_eq!(group(&served(), "batch"), None);
        assert_eq!(group(&served(), ""), None);
    }
}
