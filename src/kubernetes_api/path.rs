//! A request's path, read as the apiserver routes it: the group and
//! version, then a collection (`pods`, `namespaces/{ns}/pods`) or one
//! object in it (`.../{name}`).

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path<'a> {
    /// `/version`.
    Version,
    /// `/api`: the legacy group's versions.
    LegacyVersions,
    /// `/apis`: the groups.
    Groups,
    /// `/api/v1`, `/apis/{group}/{version}`: the resources of a version.
    Resources(GroupVersion<'a>),
    /// `/apis/{group}`: the versions of a group.
    GroupVersions(&'a str),
    /// A collection or an object in it.
    Resource(Target<'a>),
}

/// A group and version; the legacy (core) group is "".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupVersion<'a> {
    pub group: &'a str,
    pub version: &'a str,
}

/// A collection of a resource, or one object of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub group_version: GroupVersion<'a>,
    /// The resource's plural name.
    pub plural: &'a str,
    /// Set for `namespaces/{ns}/...` paths; none across namespaces (or
    /// for a cluster-scoped resource).
    pub namespace: Option<&'a str>,
    /// Set for one object.
    pub name: Option<&'a str>,
}

impl<'a> Path<'a> {
    /// Reads a path (without its query); `None` for a path the apiserver
    /// does not serve in this shape (a subresource, a deprecated
    /// `watch/` prefix, an empty segment), which is answered 404.
    pub fn parse(path: &'a str) -> Option<Self> {
        let path = path.strip_suffix('/').unwrap_or(path);
        let mut segments = path.strip_prefix('/')?.split('/');
        let first = segments.next()?;
        let rest: Vec<&str> = segments.collect();
        if rest.iter().any(|s| s.is_empty()) {
            return None;
        }
        let (group_version, rest) = match (first, rest.as_slice()) {
            ("version", []) => return Some(Self::Version),
            ("api", []) => return Some(Self::LegacyVersions),
            ("apis", []) => return Some(Self::Groups),
            ("apis", [group]) => return Some(Self::GroupVersions(group)),
            ("api", [version, rest @ ..]) => (GroupVersion { group: "", version }, rest),
            ("apis", [group, version, rest @ ..]) => (GroupVersion { group, version }, rest),
            _ => return None,
        };
        let target = |plural, namespace, name| {
            Some(Self::Resource(Target {
                group_version,
                plural,
                namespace,
                name,
            }))
        };
        match *rest {
            [] => Some(Self::Resources(group_version)),
            ["watch", ..] => None,
            ["namespaces", ns, plural] => target(plural, Some(ns), None),
            ["namespaces", ns, plural, name] => target(plural, Some(ns), Some(name)),
            [plural] => target(plural, None, None),
            [plural, name] => target(plural, None, Some(name)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str) -> Target<'_> {
        match Path::parse(path) {
            Some(Path::Resource(t)) => t,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(Path::parse("/version"), Some(Path::Version));
        assert_eq!(Path::parse("/api"), Some(Path::LegacyVersions));
        assert_eq!(Path::parse("/apis/"), Some(Path::Groups));
        assert_eq!(Path::parse("/apis/apps"), Some(Path::GroupVersions("apps")));
        let core = GroupVersion {
            group: "",
            version: "v1",
        };
        assert_eq!(Path::parse("/api/v1"), Some(Path::Resources(core)));
        let apps = GroupVersion {
            group: "apps",
            version: "v1",
        };
        assert_eq!(Path::parse("/apis/apps/v1/"), Some(Path::Resources(apps)));
    }

    #[test]
    fn collections_and_objects_with_and_without_a_namespace() {
        let t = target("/api/v1/pods");
        assert_eq!((t.plural, t.namespace, t.name), ("pods", None, None));
        let t = target("/api/v1/namespaces/ns-1/pods");
        assert_eq!(
            (t.plural, t.namespace, t.name),
            ("pods", Some("ns-1"), None)
        );
        let t = target("/api/v1/namespaces/ns-1/pods/web-0");
        assert_eq!(
            (t.plural, t.namespace, t.name),
            ("pods", Some("ns-1"), Some("web-0"))
        );
        let t = target("/apis/apps/v1/namespaces/a/deployments");
        assert_eq!((t.group_version.group, t.plural), ("apps", "deployments"));
        // A cluster-scoped object, and the namespaces themselves.
        let t = target("/api/v1/nodes/node-1");
        assert_eq!(
            (t.plural, t.namespace, t.name),
            ("nodes", None, Some("node-1"))
        );
        let t = target("/api/v1/namespaces/ns-1");
        assert_eq!(
            (t.plural, t.namespace, t.name),
            ("namespaces", None, Some("ns-1"))
        );
        assert_eq!(target("/api/v1/namespaces").plural, "namespaces");
    }

    #[test]
    fn what_the_apiserver_routes_elsewhere_is_not_read() {
        for path in [
            "",
            "/",
            "/healthz",
            "/api/v1/namespaces/a/pods/web-0/status",
            "/api/v1/watch/pods",
            "/api/v1//pods",
            "/apis/apps/v1/namespaces/a/deployments/d/scale",
            "api/v1/pods",
        ] {
            assert_eq!(Path::parse(path), None, "{path}");
        }
    }
}
