//! The Helm chart renders in standalone and sidecar modes, its manifests
//! validate against the Kubernetes schemas, and the config it renders is
//! one watchproxy accepts.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use watchproxy::config::Config;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/watchproxy");

fn tool(name: &str) -> PathBuf {
    watchproxy_testkit::require(
        name,
        "the chart tests run it: run ./scripts/install-deps.sh",
    )
}

fn run(cmd: &mut Command, input: Option<&str>) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = input {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn render(values: &str) -> String {
    let values = format!("{CHART}/ci/{values}");
    let (ok, out) = run(
        Command::new(tool("helm")).args(["template", "r", CHART, "-f", &values]),
        None,
    );
    assert!(ok, "helm template -f {values}:\n{out}");
    out
}

/// The documents of a multi-document YAML stream.
fn documents(text: &str) -> Vec<serde_yaml_ng::Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_yaml_ng::Value| !v.is_null())
        .collect()
}

fn kinds(docs: &[serde_yaml_ng::Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn rendered_config(docs: &[serde_yaml_ng::Value]) -> Config {
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap");
    Config::from_yaml(cm["data"]["config.yaml"].as_str().unwrap())
        .expect("watchproxy accepts the rendered config")
}

#[test]
fn the_chart_lints_strictly() {
    let (ok, out) = run(
        Command::new(tool("helm")).args(["lint", "--strict", CHART]),
        None,
    );
    assert!(ok, "{out}");
    for values in [
        "default-values.yaml",
        "sidecar-values.yaml",
        "secure-values.yaml",
        "scale-values.yaml",
    ] {
        let file = format!("{CHART}/ci/{values}");
        let (ok, out) = run(
            Command::new(tool("helm")).args(["lint", "--strict", CHART, "-f", &file]),
            None,
        );
        assert!(ok, "{values}: {out}");
    }
}

#[test]
fn both_modes_render_manifests_that_validate() {
    for values in [
        "default-values.yaml",
        "sidecar-values.yaml",
        "secure-values.yaml",
        "scale-values.yaml",
        "edge-values.yaml",
    ] {
        let manifests = render(values);
        let (ok, out) = run(
            Command::new(tool("kubernetes-validate")).args(["--strict", "-"]),
            Some(&manifests),
        );
        assert!(ok, "{values}: kubernetes-validate:\n{out}");
        assert!(!out.contains("ERROR"), "{out}");
    }
}

#[test]
fn standalone_mode_is_a_service_in_front_of_probed_non_root_pods() {
    let docs = documents(&render("default-values.yaml"));
    let kinds = kinds(&docs);
    for k in [
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(&k.to_owned()), "{k} in {kinds:?}");
    }
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        c["readinessProbe"]["grpc"]["service"],
        "watchproxy.v1.WatchProxy"
    );
    assert_eq!(c["livenessProbe"]["grpc"]["service"], "liveness");
    let config = rendered_config(&docs);
    assert_eq!(config.listen.to_string(), "0.0.0.0:50051");
    assert!(config.etcd.tls.is_none());
    // The image the Dockerfile builds, tagged with the chart's appVersion:
    // no registry publishes one.
    let chart = std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap();
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(&chart).unwrap();
    let version = chart["appVersion"].as_str().unwrap();
    assert_eq!(c["image"], format!("watchproxy:{version}").as_str());
}

/// A file a rendered container mounts `path` from: the Secret's name.
fn secret_mounted_at<'a>(pod: &'a serde_yaml_ng::Value, path: &str) -> Option<&'a str> {
    let containers = pod["containers"].as_sequence().unwrap().iter();
    let inits = pod["initContainers"].as_sequence().into_iter().flatten();
    let mount = containers
        .chain(inits)
        .flat_map(|c| c["volumeMounts"].as_sequence().unwrap())
        .find(|m| m["mountPath"] == path)?;
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])?;
    volume["secret"]["secretName"].as_str()
}

#[test]
fn by_default_the_api_is_tls_with_its_own_client_ca_no_anonymous_caller_per_user_limits_and_a_network_policy(
) {
    let docs = documents(&render("default-values.yaml"));
    let config = rendered_config(&docs);
    let tls = config.tls.as_ref().expect("TLS by default");
    assert_eq!(config.auth.anonymous, Some(false), "no anonymous read-all");
    let client_ca = tls.client_ca_file.as_deref().unwrap().to_str().unwrap();
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deploy["spec"]["template"]["spec"];
    let serving = secret_mounted_at(pod, "/etc/watchproxy/tls").unwrap();
    let clients = secret_mounted_at(pod, "/etc/watchproxy/client-ca").unwrap();
    assert_eq!(
        (serving, clients),
        ("r-watchproxy-tls", "r-watchproxy-client-ca")
    );
    assert!(
        client_ca.starts_with("/etc/watchproxy/client-ca/"),
        "{client_ca}"
    );
    let limits = &config.limits;
    assert_eq!(limits.max_watchers_per_user, Some(1000));
    assert_eq!(limits.unary_per_user_per_second, Some(50.0));
    assert_eq!(limits.max_page_size, Some(5000));
    assert_eq!(limits.costly_reads_per_user_per_second, Some(5.0));

    // Every port it opens is in the policy.
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy");
    let ports: Vec<&str> = policy["spec"]["ingress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_sequence().unwrap())
        .map(|p| p["port"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["grpc", "metrics", "health"]);
    let opened: Vec<&str> = pod["containers"][0]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(opened, ports);

    // Replicas seal continue tokens with one key, so pages may come from
    // any of them.
    assert_eq!(
        secret_mounted_at(pod, "/etc/watchproxy/continue-token"),
        Some("r-watchproxy-continue-token-key")
    );
    assert_eq!(
        config
            .continue_token_key_file
            .as_deref()
            .and_then(|p| p.to_str()),
        Some("/etc/watchproxy/continue-token/key")
    );
    let key = docs
        .iter()
        .find(|d| {
            d["kind"] == "Secret" && d["metadata"]["name"] == "r-watchproxy-continue-token-key"
        })
        .expect("the key's Secret");
    assert!(key["data"]["key"].as_str().unwrap().len() >= 64);

    // Without cert-manager, no Certificate: the Secrets are the user's.
    assert!(!kinds(&docs).contains(&"Certificate".to_owned()));
}

#[test]
fn with_cert_manager_the_client_ca_is_the_charts_own_not_the_serving_issuer() {
    let (ok, out) = run(
        Command::new(tool("helm")).args([
            "template",
            "r",
            CHART,
            "--api-versions",
            "cert-manager.io/v1",
        ]),
        None,
    );
    assert!(ok, "{out}");
    let docs = documents(&out);
    let named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))
    };
    let serving = named("Certificate", "r-watchproxy");
    assert_eq!(serving["spec"]["secretName"], "r-watchproxy-tls");
    assert_eq!(serving["spec"]["issuerRef"]["name"], "r-watchproxy-serving");
    let client_ca = named("Certificate", "r-watchproxy-client-ca");
    assert_eq!(client_ca["spec"]["isCA"], true);
    assert_eq!(client_ca["spec"]["secretName"], "r-watchproxy-client-ca");
    let clients = named("Issuer", "r-watchproxy-clients");
    assert_eq!(
        clients["spec"]["ca"]["secretName"],
        "r-watchproxy-client-ca"
    );
    let serving_issuer = named("Issuer", "r-watchproxy-serving");
    assert_ne!(
        serving_issuer["spec"]["ca"]["secretName"], clients["spec"]["ca"]["secretName"],
        "two CAs"
    );
}

#[test]
fn plain_text_takes_an_explicit_value_and_the_notes_warn_of_it() {
    // `helm install --dry-run` wants a cluster; `helm template` leaves the
    // NOTES out. A copy of the chart renders them as a ConfigMap's data.
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("watchproxy");
    let (ok, out) = run(
        Command::new("cp").args(["-r", CHART, chart.to_str().unwrap()]),
        None,
    );
    assert!(ok, "{out}");
    std::fs::copy(chart.join("templates/NOTES.txt"), chart.join("notes.txt")).unwrap();
    std::fs::write(
        chart.join("templates/notes.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"notes.txt\") . | indent 4 }}\n",
    )
    .unwrap();
    let notes = |set: &[&str]| {
        let mut cmd = Command::new(tool("helm"));
        cmd.args([
            "template",
            "r",
            chart.to_str().unwrap(),
            "--show-only",
            "templates/notes.yaml",
        ]);
        for s in set {
            cmd.args(["--set", s]);
        }
        let (ok, out) = run(&mut cmd, None);
        assert!(ok, "{out}");
        out
    };
    let secure = notes(&[]);
    assert!(!secure.contains("PLAIN TEXT"), "{secure}");
    assert!(secure.contains("no anonymous caller"), "{secure}");
    assert!(secure.contains("client certificate"), "{secure}");
    // The commands to try it say what the TLS settings ask of a client.
    assert!(
        secure.contains("-cacert ca.crt -cert client.crt")
            && secure.contains("--ca ca.crt --cert client.crt --key client.key"),
        "{secure}"
    );
    let tokens = notes(&["tls.clientAuth="]);
    assert!(
        tokens.contains("--ca ca.crt --token-file") && !tokens.contains("-cert client.crt"),
        "{tokens}"
    );
    let plain = notes(&["tls.enabled=false"]);
    assert!(
        plain.contains("WARNING") && plain.contains("PLAIN TEXT"),
        "{plain}"
    );
    assert!(
        plain.contains("grpcurl -plaintext") && !plain.contains("-cacert"),
        "{plain}"
    );
    let docs = documents(&{
        let (ok, out) = run(
            Command::new(tool("helm")).args(["template", "r", CHART, "--set", "tls.enabled=false"]),
            None,
        );
        assert!(ok, "{out}");
        out
    });
    assert!(rendered_config(&docs).tls.is_none());
}

#[test]
fn sidecar_mode_puts_watchproxy_next_to_the_app_with_etcd_client_certificates() {
    let docs = documents(&render("sidecar-values.yaml"));
    let kinds = kinds(&docs);
    assert!(
        !kinds.contains(&"Service".to_owned()),
        "no Service in sidecar mode: {kinds:?}"
    );
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deploy["spec"]["template"]["spec"];
    let names = |list: &str| -> Vec<&str> {
        pod[list]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    };
    assert_eq!(names("containers"), ["kubelet-like"]);
    // A native sidecar: started before the app, stopped after it.
    assert_eq!(names("initContainers"), ["watchproxy"]);
    assert_eq!(pod["initContainers"][0]["restartPolicy"], "Always");
    let volumes = pod["volumes"].as_sequence().unwrap();
    assert!(volumes
        .iter()
        .any(|v| v["secret"]["secretName"] == "etcd-client-certs"));
    let config = rendered_config(&docs);
    let tls = config.etcd.tls.expect("TLS to etcd");
    assert_eq!(
        tls.cert_file.unwrap().to_str().unwrap(),
        "/etc/watchproxy/etcd-tls/tls.crt"
    );
    assert_eq!(tls.server_name.as_deref(), Some("etcd.kube-system.svc"));
    assert_eq!(config.etcd.endpoints, ["https://etcd.kube-system.svc:2379"]);
    assert_eq!(
        config.listen.to_string(),
        "127.0.0.1:50051",
        "the API on loopback only"
    );
    assert!(config.tls.is_none(), "loopback needs no TLS");
}

#[test]
fn secure_values_mount_the_secrets_probe_the_health_port_and_fence_the_api() {
    let docs = documents(&render("secure-values.yaml"));
    let kinds = kinds(&docs);
    for kind in ["Certificate", "NetworkPolicy", "Deployment", "Service"] {
        assert!(kinds.contains(&kind.to_owned()), "{kind} in {kinds:?}");
    }
    let config = rendered_config(&docs);
    config.validate().expect("a valid configuration");
    let tls = config.tls.expect("TLS for clients");
    assert_eq!(tls.cert_file.to_str(), Some("/etc/watchproxy/tls/tls.crt"));
    assert_eq!(
        tls.client_ca_file.as_deref().and_then(|p| p.to_str()),
        Some("/etc/watchproxy/client-ca/ca.crt")
    );
    assert_eq!(
        config.auth.tokens_file.as_deref().and_then(|p| p.to_str()),
        Some("/etc/watchproxy/tokens/tokens.yaml")
    );
    let jwt = config.auth.jwt.expect("JWT verification");
    assert_eq!(
        jwt.jwks_file.to_str(),
        Some("/etc/watchproxy/jwks/jwks.json")
    );
    assert_eq!(jwt.audiences, ["watchproxy"]);
    let rules = config.authorization.expect("rules").rules;
    assert_eq!(rules.len(), 2, "the values' rule and the helm test's");
    assert_eq!(rules[1].subjects, ["user:watchproxy-helm-test"]);
    let health = config.health_listen.expect("a health port");

    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deploy["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(
            container[probe]["grpc"]["port"].as_u64(),
            Some(u64::from(health.port())),
            "{probe} uses the plain-text health port, which needs no client certificate"
        );
    }
    let secrets: Vec<&str> = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    assert_eq!(
        secrets,
        [
            "r-watchproxy-continue-token-key",
            "watchproxy-tls",
            "r-watchproxy-client-ca",
            "watchproxy-tokens",
            "cluster-jwks"
        ]
    );
    let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    let from = &policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    assert_eq!(from["watchproxy-client"].as_str(), Some("true"));
}

#[test]
fn values_that_break_the_schema_fail() {
    for set in [
        "replicaCount=two",
        "config.etcd.endpoints[0]=etcd:2379",
        "logFormat=xml",
        "tls.clientAuth=sometimes",
        "config.authorization.rules[0].subjects[0]=alice",
        // Keys nobody reads: a typo at the top, in config, in a resource.
        "replicas=3",
        "config.watch.bookmark_intervall=1s",
        "config.resources[0].max_byte=1Gi",
        // Durations watchproxy cannot read.
        "config.shutdown_grace=soon",
        "config.watch.bookmark_interval=10",
        "config.limits.keepalive_timeout=5 seconds later",
    ] {
        let (ok, out) = run(
            Command::new(tool("helm")).args(["lint", "--strict", CHART, "--set", set]),
            None,
        );
        assert!(!ok, "{set} should fail: {out}");
    }
}

#[test]
fn scale_values_add_an_autoscaler_a_headless_service_and_a_connection_age() {
    let docs = documents(&render("scale-values.yaml"));
    let hpa = docs
        .iter()
        .find(|d| d["kind"] == "HorizontalPodAutoscaler")
        .expect("an HPA");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["maxReplicas"], 6);
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert!(
        deploy["spec"].get("replicas").is_none(),
        "the HPA owns the replica count"
    );
    let headless = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    assert!(headless["metadata"]["name"]
        .as_str()
        .unwrap()
        .ends_with("-headless"));
    let config = rendered_config(&docs);
    assert_eq!(
        config.limits.max_connection_age,
        Some(std::time::Duration::from_secs(30 * 60))
    );
    // By default: neither.
    let kinds = kinds(&documents(&render("default-values.yaml")));
    assert!(!kinds.contains(&"HorizontalPodAutoscaler".to_owned()));
}

#[test]
fn an_edge_release_takes_its_resources_from_the_core_release() {
    let docs = documents(&render("edge-values.yaml"));
    let config = rendered_config(&docs);
    assert_eq!(
        config.upstream.as_deref(),
        Some("https://core-watchproxy:50051")
    );
    assert!(!config.resources.is_empty());
    let tls = config.upstream_tls.as_ref().expect("upstream TLS");
    let ca = tls.ca_file.as_ref().unwrap();
    assert_eq!(ca.to_str(), Some("/etc/watchproxy/upstream-tls/ca.crt"));
    let token = config.upstream_token_file.as_ref().unwrap();
    assert_eq!(token.to_str(), Some("/etc/watchproxy/upstream-token/token"));
    // The files are there: their Secrets are mounted where the config
    // names them.
    let text = render("edge-values.yaml");
    for (secret, path) in [
        ("core-ca", "/etc/watchproxy/upstream-tls"),
        ("edge-token", "/etc/watchproxy/upstream-token"),
    ] {
        assert!(text.contains(&format!("secretName: {secret}")), "{secret}");
        assert!(text.contains(&format!("mountPath: {path}")), "{path}");
    }
    assert!(rendered_config(&documents(&render("default-values.yaml")))
        .upstream
        .is_none());
}

#[test]
fn values_watchproxy_reads_pass_the_schema() {
    for set in [
        "config.shutdown_grace=1m 30s",
        "config.watch.bookmark_interval=500ms",
        "config.watch.state_check_interval=0s",
        "config.limits.max_connection_age=2h",
        "nameOverride=wp",
        "podMonitor.enabled=true",
    ] {
        let (ok, out) = run(
            Command::new(tool("helm")).args(["lint", "--strict", CHART, "--set", set]),
            None,
        );
        assert!(ok, "{set} should pass: {out}");
    }
}

/// `helm template` of the chart with `set`.
fn render_set(set: &[&str]) -> Vec<serde_yaml_ng::Value> {
    let mut cmd = Command::new(tool("helm"));
    cmd.args(["template", "r", CHART]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let (ok, out) = run(&mut cmd, None);
    assert!(ok, "helm template {set:?}:\n{out}");
    documents(&out)
}

fn find<'a>(docs: &'a [serde_yaml_ng::Value], kind: &str) -> Option<&'a serde_yaml_ng::Value> {
    docs.iter().find(|d| d["kind"] == kind)
}

#[test]
fn the_prometheus_rule_is_the_rules_file_as_it_is() {
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus/watchproxy-rules.yaml"
    ))
    .unwrap();
    let mut groups: serde_yaml_ng::Value = serde_yaml_ng::from_str(&file).unwrap();
    assert!(find(&render_set(&[]), "PrometheusRule").is_none());
    let docs = render_set(&[
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kps",
    ]);
    let rule = find(&docs, "PrometheusRule").expect("a PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    assert_eq!(rule["spec"]["groups"], groups["groups"]);
    // Published runbooks: each alert's runbook_url under the base.
    let docs = render_set(&[
        "prometheusRule.enabled=true",
        "prometheusRule.runbookBaseUrl=https://runbooks.example/wp/",
    ]);
    let rule = find(&docs, "PrometheusRule").unwrap();
    for group in groups["groups"].as_sequence_mut().unwrap() {
        for r in group["rules"].as_sequence_mut().unwrap() {
            let url = format!(
                "https://runbooks.example/wp/{}.md",
                r["alert"].as_str().unwrap()
            );
            r["annotations"]["runbook_url"] = url.into();
        }
    }
    assert_eq!(rule["spec"]["groups"], groups["groups"]);
}

#[test]
fn a_sidecar_release_is_scraped_by_a_pod_monitor() {
    let docs = render_set(&["sidecar.enabled=true", "serviceMonitor.enabled=true"]);
    assert!(
        find(&docs, "ServiceMonitor").is_none(),
        "no Service to monitor"
    );
    let monitor = find(&docs, "PodMonitor").expect("a PodMonitor");
    let pod_labels = &find(&docs, "Deployment").unwrap()["spec"]["template"]["metadata"]["labels"];
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&pod_labels[k], v, "the monitor selects the pods");
    }
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    let standalone = render_set(&["serviceMonitor.enabled=true"]);
    assert!(find(&standalone, "ServiceMonitor").is_some());
    assert!(find(&standalone, "PodMonitor").is_none());
}

#[test]
fn helm_test_lists_through_the_service_as_a_client_of_the_tls_settings() {
    let args = |docs: &[serde_yaml_ng::Value]| -> Vec<String> {
        let pod = docs
            .iter()
            .find(|d| d["kind"] == "Pod" && d["metadata"]["annotations"]["helm.sh/hook"] == "test")
            .expect("a helm test pod");
        pod["spec"]["containers"][0]["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let secure = args(&render_set(&[]));
    assert_eq!(secure[..2], ["list", "pods"]);
    assert!(
        secure.contains(&"--server=r-watchproxy.default.svc:50051".to_owned()),
        "{secure:?}"
    );
    assert!(
        secure.contains(&"--ca=/etc/watchproxy/ca/ca.crt".to_owned()),
        "{secure:?}"
    );
    let issued = render_set(&["tls.certManager.enabled=true"]);
    assert!(args(&issued).iter().any(|a| a.starts_with("--cert=")));
    assert!(issued.iter().any(|d| d["kind"] == "Certificate"
        && d["spec"]["commonName"] == "watchproxy-helm-test"
        && d["spec"]["issuerRef"]["name"] == "r-watchproxy-clients"));
    let token = args(&render_set(&[
        "tls.certManager.enabled=true",
        "helmTest.tokenSecret.name=t",
    ]));
    assert!(
        token.contains(&"--token-file=/etc/watchproxy/token/token".to_owned()),
        "{token:?}"
    );
    assert!(!token.iter().any(|a| a.starts_with("--cert=")), "{token:?}");
    let plain = args(&render_set(&[
        "tls.enabled=false",
        "config.auth.anonymous=true",
    ]));
    assert!(!plain.iter().any(|a| a.starts_with("--ca")), "{plain:?}");
    let none = render_set(&["helmTest.enabled=false"]);
    assert!(!none.iter().any(|d| d["kind"] == "Pod"));
}

#[test]
fn the_helm_test_identity_lives_for_the_test_and_may_only_list_its_resource() {
    let issued = render_set(&["tls.certManager.enabled=true"]);
    let hooked = |d: &serde_yaml_ng::Value| {
        let a = &d["metadata"]["annotations"];
        a["helm.sh/hook"] == "test"
            && a["helm.sh/hook-delete-policy"]
                .as_str()
                .is_some_and(|p| p.contains("hook-succeeded") && p.contains("hook-failed"))
    };
    let certificate = issued
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["commonName"] == "watchproxy-helm-test")
        .expect("the test's certificate");
    assert!(hooked(certificate), "{certificate:?}");
    assert_eq!(
        certificate["spec"]["duration"], "1h",
        "cert-manager's shortest"
    );
    // Its Secret is the test's too: helm deletes it with the certificate.
    let secret = issued
        .iter()
        .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "r-watchproxy-helm-test")
        .expect("the certificate's Secret, made by the chart");
    assert!(hooked(secret), "{secret:?}");
    let weight = |d: &serde_yaml_ng::Value| -> i64 {
        d["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap_or("0")
            .parse()
            .unwrap()
    };
    assert!(weight(secret) < weight(certificate), "the Secret first");

    // With rules, the test's user gets one: list of its resource.
    let ruled = render_set(&[
        "tls.certManager.enabled=true",
        "config.authorization.rules[0].subjects={group:readers}",
        "config.authorization.rules[0].resources={pods}",
        "config.authorization.rules[0].namespaces={*}",
        "config.authorization.rules[0].verbs={list,watch}",
    ]);
    let rules = rendered_config(&ruled).authorization.unwrap().rules;
    assert_eq!(rules.len(), 2, "{rules:?}");
    let test = &rules[1];
    assert_eq!(test.subjects, ["user:watchproxy-helm-test"]);
    assert_eq!(test.resources, ["pods"]);
    assert_eq!(test.verbs, [watchproxy::config::Verb::List]);
}

#[test]
fn names_follow_the_overrides() {
    let named = |set: &[&str]| -> String {
        let docs = render_set(set);
        find(&docs, "Deployment").unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(named(&[]), "r-watchproxy");
    assert_eq!(named(&["nameOverride=wp"]), "r-wp");
    assert_eq!(named(&["fullnameOverride=edge-cache"]), "edge-cache");
}

#[test]
fn the_packaged_chart_holds_the_rules_and_not_the_test_values() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(
        Command::new(tool("helm")).args(["package", CHART, "-d", dir.path().to_str().unwrap()]),
        None,
    );
    assert!(ok, "{out}");
    let archive = dir.path().join("watchproxy-0.1.0.tgz");
    let (ok, listing) = run(
        Command::new("tar").args(["-tzf", archive.to_str().unwrap()]),
        None,
    );
    assert!(ok, "{listing}");
    assert!(
        listing.contains("watchproxy/files/watchproxy-rules.yaml"),
        "{listing}"
    );
    assert!(
        listing.contains("watchproxy/templates/tests/list.yaml"),
        "{listing}"
    );
    assert!(!listing.contains("watchproxy/ci/"), "{listing}");
}
