//! Where the apiserver stores its built-in resources, and what each is to
//! its API (group, version, kind, plural, scope), so that a resource
//! configured by its etcd prefix alone is served at the apiserver's paths.
//! Custom resources are stored under `/registry/<group>/<plural>`; their
//! kind and version come from the configuration.

/// A resource as Kubernetes' API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKind {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// The names kubectl also resolves (`kubectl get po`).
    pub short_names: Vec<String>,
    /// The categories it is listed in (`kubectl get all`).
    pub categories: Vec<String>,
}

/// The built-ins: storage prefix (after `/registry/`), group, version,
/// kind, plural, namespaced. The prefix is the plural but for nodes
/// (`minions`), services and endpoints (under `services/`) and ingresses
/// (`ingress`).
#[rustfmt::skip]
const BUILT_INS: &[(&str, &str, &str, &str, &str, bool)] = &[
    ("pods", "", "v1", "Pod", "pods", true),
    ("minions", "", "v1", "Node", "nodes", false),
    ("services/specs", "", "v1", "Service", "services", true),
    ("services/endpoints", "", "v1", "Endpoints", "endpoints", true),
    ("configmaps", "", "v1", "ConfigMap", "configmaps", true),
    ("secrets", "", "v1", "Secret", "secrets", true),
    ("namespaces", "", "v1", "Namespace", "namespaces", false),
    ("serviceaccounts", "", "v1", "ServiceAccount", "serviceaccounts", true),
    ("persistentvolumes", "", "v1", "PersistentVolume", "persistentvolumes", false),
    ("persistentvolumeclaims", "", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true),
    ("events", "", "v1", "Event", "events", true),
    ("limitranges", "", "v1", "LimitRange", "limitranges", true),
    ("resourcequotas", "", "v1", "ResourceQuota", "resourcequotas", true),
    ("deployments", "apps", "v1", "Deployment", "deployments", true),
    ("replicasets", "apps", "v1", "ReplicaSet", "replicasets", true),
    ("statefulsets", "apps", "v1", "StatefulSet", "statefulsets", true),
    ("daemonsets", "apps", "v1", "DaemonSet", "daemonsets", true),
    ("controllerrevisions", "apps", "v1", "ControllerRevision", "controllerrevisions", true),
    ("jobs", "batch", "v1", "Job", "jobs", true),
    ("cronjobs", "batch", "v1", "CronJob", "cronjobs", true),
    ("endpointslices", "discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true),
    ("ingress", "networking.k8s.io", "v1", "Ingress", "ingresses", true),
    ("networkpolicies", "networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true),
    ("ingressclasses", "networking.k8s.io", "v1", "IngressClass", "ingressclasses", false),
    ("leases", "coordination.k8s.io", "v1", "Lease", "leases", true),
    ("roles", "rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    ("rolebindings", "rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true),
    ("clusterroles", "rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false),
    ("clusterrolebindings", "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false),
    ("storageclasses", "storage.k8s.io", "v1", "StorageClass", "storageclasses", false),
    ("priorityclasses", "scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", false),
    ("poddisruptionbudgets", "policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", true),
    ("horizontalpodautoscalers", "autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
    ("apiextensions.k8s.io/customresourcedefinitions", "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false),
];

/// The built-ins' short names, as the apiserver advertises them.
const SHORT_NAMES: &[(&str, &[&str])] = &[
    ("pods", &["po"]),
    ("nodes", &["no"]),
    ("services", &["svc"]),
    ("endpoints", &["ep"]),
    ("configmaps", &["cm"]),
    ("namespaces", &["ns"]),
    ("serviceaccounts", &["sa"]),
    ("persistentvolumes", &["pv"]),
    ("persistentvolumeclaims", &["pvc"]),
    ("events", &["ev"]),
    ("limitranges", &["limits"]),
    ("resourcequotas", &["quota"]),
    ("deployments", &["deploy"]),
    ("replicasets", &["rs"]),
    ("statefulsets", &["sts"]),
    ("daemonsets", &["ds"]),
    ("cronjobs", &["cj"]),
    ("ingresses", &["ing"]),
    ("networkpolicies", &["netpol"]),
    ("storageclasses", &["sc"]),
    ("priorityclasses", &["pc"]),
    ("poddisruptionbudgets", &["pdb"]),
    ("horizontalpodautoscalers", &["hpa"]),
    ("customresourcedefinitions", &["crd", "crds"]),
];

/// The built-ins in the `all` category.
const ALL: &[&str] = &[
    "pods",
    "services",
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "jobs",
    "cronjobs",
    "horizontalpodautoscalers",
];

/// The built-in resource the apiserver stores under `prefix` (as
/// configured: `/registry/pods` or `/registry/pods/`), if it is one.
pub fn built_in(prefix: &str) -> Option<ApiKind> {
    let stored = prefix.strip_prefix("/registry/")?.trim_end_matches('/');
    BUILT_INS.iter().find(|b| b.0 == stored).map(
        |&(_, group, version, kind, plural, namespaced)| ApiKind {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced,
            short_names: (SHORT_NAMES.iter())
                .find(|s| s.0 == plural)
                .map_or(&[][..], |s| s.1)
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            categories: match ALL.contains(&plural) {
                true => vec!["all".to_owned()],
                false => Vec::new(),
            },
        },
    )
}

/// Whether `group`/`plural` is a built-in resource's, served here or not.
pub fn is_built_in(group: &str, plural: &str) -> bool {
    BUILT_INS.iter().any(|b| b.1 == group && b.4 == plural)
}

/// The group and plural of a custom resource's prefix,
/// `/registry/<group>/<plural>`: a group has a dot, as a custom
/// resource's must.
pub fn custom(prefix: &str) -> Option<(&str, &str)> {
    let stored = prefix.strip_prefix("/registry/")?.trim_end_matches('/');
    let (group, plural) = stored.split_once('/')?;
    let valid = |s: &str| !s.is_empty() && !s.contains('/');
    (group.contains('.') && valid(group) && valid(plural)).then_some((group, plural))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_are_found_by_where_the_apiserver_stores_them() {
        let pods = built_in("/registry/pods/").unwrap();
        assert_eq!(
            (
                pods.group.as_str(),
                pods.version.as_str(),
                pods.kind.as_str()
            ),
            ("", "v1", "Pod")
        );
        assert!(pods.namespaced);
        let nodes = built_in("/registry/minions").unwrap();
        assert_eq!((nodes.plural.as_str(), nodes.namespaced), ("nodes", false));
        assert_eq!(
            built_in("/registry/services/specs/").unwrap().kind,
            "Service"
        );
        assert_eq!(
            built_in("/registry/services/endpoints").unwrap().kind,
            "Endpoints"
        );
        let ingresses = built_in("/registry/ingress/").unwrap();
        assert_eq!(
            (ingresses.group.as_str(), ingresses.plural.as_str()),
            ("networking.k8s.io", "ingresses")
        );
        let deployments = built_in("/registry/deployments/").unwrap();
        assert_eq!(deployments.group, "apps");
        assert_eq!(
            (deployments.short_names, deployments.categories),
            (vec!["deploy".to_owned()], vec!["all".to_owned()])
        );
        assert!(built_in("/registry/secrets")
            .unwrap()
            .short_names
            .is_empty());
        for not_built_in in [
            "/registry/nodes",
            "/registry/services",
            "/pods",
            "/registry/widgets",
        ] {
            assert_eq!(built_in(not_built_in), None, "{not_built_in}");
        }
    }

    #[test]
    fn every_built_in_is_stored_under_one_prefix_and_named_once() {
        let mut prefixes: Vec<_> = BUILT_INS.iter().map(|b| b.0).collect();
        let mut plurals: Vec<_> = BUILT_INS.iter().map(|b| (b.1, b.4)).collect();
        prefixes.sort_unstable();
        plurals.sort_unstable();
        let n = BUILT_INS.len();
        prefixes.dedup();
        plurals.dedup();
        assert_eq!((prefixes.len(), plurals.len()), (n, n));
        for (plural, _) in SHORT_NAMES {
            assert!(BUILT_INS.iter().any(|b| b.4 == *plural), "{plural}");
        }
        for plural in ALL {
            assert!(BUILT_INS.iter().any(|b| b.4 == *plural), "{plural}");
        }
        for b in BUILT_INS {
            assert!(b.4.chars().all(|c| c.is_ascii_lowercase()), "{}", b.4);
            assert!(b.3.starts_with(|c: char| c.is_ascii_uppercase()), "{}", b.3);
        }
    }

    #[test]
    fn a_custom_resource_prefix_names_its_group_and_plural() {
        assert_eq!(
            custom("/registry/example.com/widgets/"),
            Some(("example.com", "widgets"))
        );
        assert_eq!(custom("/registry/pods/"), None);
        assert_eq!(custom("/registry/example.com/"), None);
        assert_eq!(custom("/registry/example.com/widgets/extra"), None);
        assert_eq!(custom("/other/example.com/widgets"), None);
    }
}
