//! Reading the configuration file and checking it whole: a bad one fails
//! at start with a message naming the field.

use std::collections::HashSet;
use std::path::Path;

use super::*;

/// A configuration that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config: {0}")]
    Parse(#[from] serde_yaml_ng::Error),
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

pub(super) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::from_yaml(&text)?;
        config.source = Some(ConfigSource {
            path: path.to_owned(),
            overrides: Overrides::default(),
        });
        Ok(config)
    }

    /// Parses and validates; prefixes lose a trailing '/'.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = serde_yaml_ng::from_str(text)?;
        for r in &mut config.resources {
            while r.prefix.len() > 1 && r.prefix.ends_with('/') {
                r.prefix.pop();
            }
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.etcd.endpoints.is_empty() {
            return Err(invalid(
                "etcd.endpoints",
                "at least one endpoint is required",
            ));
        }
        if self
            .etcd
            .watch_endpoints
            .as_ref()
            .is_some_and(Vec::is_empty)
        {
            return Err(invalid(
                "etcd.watch_endpoints",
                "leave it out, or name at least one endpoint",
            ));
        }
        if let Some(tls) = &self.etcd.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(invalid("etcd.tls", "cert_file and key_file go together"));
            }
        }
        if let Some(tls) = &self.tls {
            if tls.client_auth.is_some() && tls.client_ca_file.is_none() {
                return Err(invalid(
                    "tls.client_auth",
                    "needs tls.client_ca_file, the CAs to verify client certificates against",
                ));
            }
        }
        if let Some(jwt) = &self.auth.jwt {
            if jwt.audiences.is_empty() {
                return Err(invalid("auth.jwt.audiences", "must name at least one"));
            }
        }
        if (self.auth.tokens_file.is_some() || self.auth.jwt.is_some())
            && self.tls.is_none()
            && !self.auth.allow_plaintext_tokens
        {
            return Err(invalid(
                "auth.tokens_file",
                "bearer tokens travel only over TLS: add a tls section, or set auth.allow_plaintext_tokens for a listener only loopback reaches",
            ));
        }
        if self.auth.allow_plaintext_tokens && self.tls.is_none() && !self.listen.ip().is_loopback()
        {
            return Err(invalid(
                "auth.allow_plaintext_tokens",
                format!(
                    "bearer tokens in plain text are accepted only on a loopback listener, not on {}: add a tls section, or listen on 127.0.0.1",
                    self.listen
                ),
            ));
        }
        self.kubernetes_api.validate(self)?;
        if self.etcd_api.enabled
            && self.etcd_api.outside == Outside::Forward
            && self.authorization.is_none()
        {
            return Err(invalid(
                "etcd_api.outside",
                "forward reads keys of no resource on watchproxy's own etcd credentials, for every caller: add an authorization section whose rules say who may (a rule over resources [\"*\"] and namespaces [\"*\"] without a selector), or set etcd_api.outside: refuse",
            ));
        }
        if let Some(authz) = &self.authorization {
            for (i, rule) in authz.rules.iter().enumerate() {
                let field = |f: &str| format!("authorization.rules[{i}].{f}");
                for (name, list) in [
                    ("subjects", &rule.subjects),
                    ("resources", &rule.resources),
                    ("namespaces", &rule.namespaces),
                ] {
                    if list.is_empty() {
                        return Err(invalid(field(name), "must name at least one"));
                    }
                }
                if rule.verbs.is_empty() {
                    return Err(invalid(field("verbs"), "must name at least one"));
                }
                for s in &rule.subjects {
                    let named = s
                        .strip_prefix("user:")
                        .or_else(|| s.strip_prefix("group:"))
                        .is_some_and(|n| !n.is_empty());
                    if s != "*" && !named {
                        return Err(invalid(
                            field("subjects"),
                            format!("{s:?} is not user:<name>, group:<name> or *"),
                        ));
                    }
                }
                for r in &rule.resources {
                    if r != "*" && !self.resources.iter().any(|c| &c.name == r) {
                        return Err(invalid(
                            field("resources"),
                            format!("{r:?} is not a configured resource"),
                        ));
                    }
                }
            }
        }
        if self.etcd.username.is_some() != self.etcd.password_file.is_some() {
            return Err(invalid(
                "etcd.username",
                "etcd.username and etcd.password_file go together",
            ));
        }
        if self.etcd.list_page_size <= 0 {
            return Err(invalid("etcd.list_page_size", "must be positive"));
        }
        if self.watch.watcher_queue < 2 {
            return Err(invalid("watch.watcher_queue", "must be at least 2"));
        }
        if self.watch.bookmark_interval.is_zero() {
            return Err(invalid("watch.bookmark_interval", "must be positive"));
        }
        let l = &self.limits;
        for (field, v) in [
            ("limits.max_watchers", l.max_watchers),
            (
                "limits.max_watchers_per_resource",
                l.max_watchers_per_resource,
            ),
            (
                "limits.max_concurrent_streams",
                l.max_concurrent_streams as usize,
            ),
            ("limits.max_concurrent_unary", l.max_concurrent_unary),
            ("limits.max_message_bytes", l.max_message_bytes),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if l.max_watchers_per_user == Some(0) {
            return Err(invalid("limits.max_watchers_per_user", "must be positive"));
        }
        if l.unary_per_user_per_second
            .is_some_and(|r| !r.is_finite() || r <= 0.0)
        {
            return Err(invalid(
                "limits.unary_per_user_per_second",
                "must be a positive number",
            ));
        }
        if l.unary_burst_per_user == 0 {
            return Err(invalid("limits.unary_burst_per_user", "must be positive"));
        }
        if self.resources.is_empty() {
            return Err(invalid("resources", "at least one resource is required"));
        }
        let mut names = HashSet::new();
        let mut prefixes: Vec<(&str, usize)> = Vec::new();
        for (i, r) in self.resources.iter().enumerate() {
            let at = |field: &str| format!("resources[{i}].{field}");
            if r.name.is_empty()
                || !r
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            {
                return Err(invalid(
                    at("name"),
                    format!("{:?} must be non-empty and use only [A-Za-z0-9._-]", r.name),
                ));
            }
            if !names.insert(r.name.as_str()) {
                return Err(invalid(at("name"), format!("{:?} is used twice", r.name)));
            }
            if r.prefix.is_empty() || r.prefix == "/" {
                return Err(invalid(
                    at("prefix"),
                    "must name a key prefix, e.g. /registry/pods",
                ));
            }
            for (other, j) in &prefixes {
                let (a, b) = (format!("{other}/"), format!("{}/", r.prefix));
                if a.starts_with(&b) || b.starts_with(&a) {
                    return Err(invalid(
                        at("prefix"),
                        format!("{:?} overlaps resources[{j}].prefix {other:?}", r.prefix),
                    ));
                }
            }
            prefixes.push((&r.prefix, i));
            for (at_, url) in [("upstream", &self.upstream), ("", &r.upstream)] {
                let Some(url) = url else { continue };
                let field = if at_.is_empty() {
                    at("upstream")
                } else {
                    at_.to_owned()
                };
                if !(url.starts_with("http://") || url.starts_with("https://"))
                    || url.parse::<http::Uri>().is_err()
                {
                    return Err(invalid(
                        field,
                        format!("{url:?} is not a URL such as http://core:50051"),
                    ));
                }
                let plain_token = self.upstream_token_file.is_some()
                    && url.starts_with("http://")
                    && !self.allow_plaintext_upstream_token;
                if plain_token {
                    return Err(invalid(
                        "upstream_token_file".to_owned(),
                        format!("{url:?} is plain text: the token travels only over https://, unless allow_plaintext_upstream_token is set"),
                    ));
                }
                let ca = self.upstream_tls.as_ref().and_then(|t| t.ca_file.as_ref());
                if url.starts_with("https://") && ca.is_none() {
                    return Err(invalid(
                        "upstream_tls.ca_file".to_owned(),
                        format!("{url:?} is https: name the CA to trust"),
                    ));
                }
            }
            if self.etcd_api.enabled && (r.upstream.is_some() || self.upstream.is_some()) {
                return Err(invalid(
                    "etcd_api.enabled",
                    format!("resource {:?} is read from another watchproxy, whose API does not carry what etcd's shows (create_revision, version, lease): serve etcd's API where the resources are read from etcd", r.name),
                ));
            }
            if r.max_bytes == Some(0) {
                return Err(invalid(at("max_bytes"), "must be more than 0"));
            }
            match (&r.key_layout, r.namespaced) {
                (Some(l), true) if !l.namespaced() => {
                    return Err(invalid(
                        at("key_layout"),
                        "holds no {namespace} for a namespaced resource (or set namespaced: false)",
                    ))
                }
                (Some(l), false) if l.namespaced() => {
                    return Err(invalid(
                        at("key_layout"),
                        "holds {namespace}, but the resource sets namespaced: false",
                    ))
                }
                _ => {}
            }
            if r.format == ValueFormat::Raw && !r.selectable_fields.is_empty() {
                return Err(invalid(
                    at("selectable_fields"),
                    "raw resources have no fields to select on; use format: json",
                ));
            }
            for (k, f) in r.selectable_fields.iter().enumerate() {
                if f.is_empty() || f.split('.').any(str::is_empty) {
                    return Err(invalid(
                        format!("resources[{i}].selectable_fields[{k}]"),
                        format!("{f:?} is not a dotted path such as spec.nodeName"),
                    ));
                }
                if f == "metadata.name" || f == "metadata.namespace" {
                    return Err(invalid(
                        format!("resources[{i}].selectable_fields[{k}]"),
                        format!("{f} is always selectable; remove it"),
                    ));
                }
            }
            for (k, f) in r.indexed_fields.iter().enumerate() {
                if !r.selectable_fields.contains(f) {
                    return Err(invalid(
                        format!("resources[{i}].indexed_fields[{k}]"),
                        format!("{f:?} must also be listed in selectable_fields"),
                    ));
                }
            }
            let c = &r.cache;
            if c.min_events == 0 {
                return Err(invalid(at("cache.min_events"), "must be positive"));
            }
            if c.max_events < c.min_events {
                return Err(invalid(
                    at("cache.max_events"),
                    format!(
                        "{} is below cache.min_events {}",
                        c.max_events, c.min_events
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
etcd:
  endpoints: ["http://127.0.0.1:2379"]
resources:
  - name: pods
    prefix: /registry/pods/
    selectable_fields: [spec.nodeName, status.phase]
    indexed_fields: [spec.nodeName]
  - name: nodes
    prefix: /registry/minions
    namespaced: false
"#;

    #[test]
    fn a_good_config_parses_with_defaults() {
        let c = Config::from_yaml(GOOD).unwrap();
        assert_eq!(c.resources[0].prefix, "/registry/pods");
        assert!(c.resources[0].namespaced);
        assert!(!c.resources[1].namespaced);
        assert_eq!(c.resources[1].format, ValueFormat::Json);
        assert_eq!(c.watch.bookmark_interval, Duration::from_secs(60));
        assert_eq!(c.listen.port(), 50051);
    }

    #[test]
    fn bad_configs_name_the_offending_field() {
        let cases = [
            (
                GOOD.replace(
                    "indexed_fields: [spec.nodeName]",
                    "indexed_fields: [spec.x]",
                ),
                "resources[0].indexed_fields[0]",
            ),
            (
                GOOD.replace("name: nodes", "name: pods"),
                "resources[1].name",
            ),
            (
                GOOD.replace("/registry/minions", "/registry/pods/sub"),
                "resources[1].prefix",
            ),
            (
                GOOD.replace("status.phase", "status..phase"),
                "resources[0].selectable_fields[1]",
            ),
            (
                GOOD.replace(
                    "namespaced: false",
                    "namespaced: false\n    format: raw\n    selectable_fields: [a]",
                ),
                "resources[1].selectable_fields",
            ),
            (
                GOOD.replace(
                    "namespaced: false",
                    "namespaced: false\n    cache: {min_events: 10, max_events: 5}",
                ),
                "resources[1].cache.max_events",
            ),
            (
                GOOD.replace("resources:", "watch: {watcher_queue: 1}\nresources:"),
                "watch.watcher_queue",
            ),
            (
                GOOD.replace("namespaced: false", "namespaced: false\n    colour: blue"),
                "colour",
            ),
            (
                GOOD.replace("[\"http://127.0.0.1:2379\"]", "[]"),
                "etcd.endpoints",
            ),
            (
                GOOD.replace("resources:", "upstream: core:50051\nresources:"),
                "upstream",
            ),
            (
                GOOD.replace(
                    "resources:",
                    "upstream: http://core:50051\netcd_api: {enabled: true}\nresources:",
                ),
                "etcd_api.enabled",
            ),
            (
                GOOD.replace("resources:", "etcd_api: {outside: ignore}\nresources:"),
                "etcd_api.outside",
            ),
            (
                GOOD.replace(
                    "resources:",
                    "etcd_api: {enabled: true, outside: forward}\nresources:",
                ),
                "etcd_api.outside",
            ),
            (
                GOOD.replace("resources:", "upstream: https://core:50051\nresources:"),
                "upstream_tls.ca_file",
            ),
            (
                GOOD.replace(
                    "resources:",
                    "upstream: http://core:50051\nupstream_token_file: /t\nresources:",
                ),
                "upstream_token_file",
            ),
            (
                GOOD.replace(
                    "resources:",
                    "listen: 0.0.0.0:50051\nauth: {tokens_file: /t, allow_plaintext_tokens: true}\nresources:",
                ),
                "auth.allow_plaintext_tokens",
            ),
        ];
        for (yaml, field) in cases {
            let err = Config::from_yaml(&yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{err:?} should name {field}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_the_config_loader(text in crate::fuzzing::text("config")) {
            if let Ok(config) = Config::from_yaml(&text) {
                proptest::prop_assert!(!config.resources.is_empty());
            }
        }
    }
}
