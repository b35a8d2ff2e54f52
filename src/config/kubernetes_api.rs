//! `kubernetes_api`: Kubernetes' own list/watch REST API, served from the
//! caches on a listener of its own; and what each resource is to that
//! API (`kubernetes` in a resource).

use std::net::SocketAddr;

use serde::Deserialize;

use super::validate::{invalid, ConfigError};
use super::Config;

/// Whether Kubernetes' read API is served, and where.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesApiConfig {
    #[serde(default)]
    pub enabled: bool,
    /// Its listener: HTTP/1.1 and HTTP/2, with the `tls` section's
    /// certificate and client CAs. Required when enabled.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
}

/// A resource's group, version, kind and plural on Kubernetes' API; each
/// left out is taken from the built-in resource its prefix names
/// (`/registry/pods`), or, for a custom resource's prefix
/// (`/registry/<group>/<plural>`), its group and plural.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesMapping {
    pub group: Option<String>,
    pub version: Option<String>,
    pub kind: Option<String>,
    pub plural: Option<String>,
}

impl KubernetesApiConfig {
    pub(super) fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        let Some(listen) = self.listen else {
            return Err(invalid(
                "kubernetes_api.listen",
                "an address is required when kubernetes_api is enabled, e.g. 127.0.0.1:6443",
            ));
        };
        let taken = [
            ("listen", Some(config.listen)),
            ("metrics_listen", config.metrics_listen),
            ("health_listen", config.health_listen),
        ];
        if let Some((other, _)) =
            (taken.iter()).find(|(_, a)| *a == Some(listen) && listen.port() != 0)
        {
            return Err(invalid(
                "kubernetes_api.listen",
                format!("{listen} is {other}'s address too: give it a port of its own"),
            ));
        }
        if config.auth.allow_plaintext_tokens && config.tls.is_none() && !listen.ip().is_loopback()
        {
            return Err(invalid(
                "auth.allow_plaintext_tokens",
                format!(
                    "bearer tokens in plain text are accepted only on a loopback listener, not on kubernetes_api.listen {listen}: add a tls section, or listen on 127.0.0.1"
                ),
            ));
        }
        for (i, r) in config.resources.iter().enumerate() {
            let Some(m) = &r.kubernetes else { continue };
            let names = [(&m.version, false), (&m.kind, false), (&m.plural, false)];
            let group = (m.group.as_ref()).filter(|g| !g.is_empty());
            let bad = (names
                .into_iter()
                .filter_map(|(n, g)| Some((n.as_ref()?, g))))
            .chain(group.map(|g| (g, true)))
            .find(|(n, group)| !is_name(n, *group));
            if let Some((bad, _)) = bad {
                return Err(invalid(
                    format!("resources[{i}].kubernetes"),
                    format!("{bad:?} is not a name Kubernetes' paths can hold"),
                ));
            }
            if r.format == super::ValueFormat::Raw {
                return Err(invalid(
                    format!("resources[{i}].kubernetes"),
                    format!("{} holds raw values, which Kubernetes' API cannot serve: leave kubernetes out", r.name),
                ));
            }
        }
        Ok(())
    }
}

/// A path segment's name: lower-case letters, digits, dashes (and, in a
/// group, dots); a kind also takes capitals.
fn is_name(name: &str, group: bool) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || (group && b == b'.'))
}
