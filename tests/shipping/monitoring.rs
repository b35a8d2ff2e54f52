//! What operators look at: the alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), each alert has a runbook and a
//! test, the dashboard's queries are valid PromQL, and every metric the
//! rules and the dashboard name is one a running watchproxy exposes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use serde_json::Value;
use serde_yaml_ng::Value as Yaml;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const RULES: &str = "deploy/prometheus/watchproxy-rules.yaml";
const RULE_TESTS: &str = "deploy/prometheus/watchproxy-rules.test.yaml";
const DASHBOARD: &str = "deploy/grafana/watchproxy-dashboard.json";

fn promtool() -> PathBuf {
    watchproxy_testkit::require(
        "promtool",
        "run ./scripts/install-deps.sh (apt-get install -y prometheus)",
    )
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap()
}

/// `promtool ARGS` in `dir`: it must succeed.
fn promtool_ok(dir: &Path, args: &[&str]) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alerting rules: (alert, expr, annotations).
fn alerts() -> Vec<(String, String, Yaml)> {
    let rules: Yaml = serde_yaml_ng::from_str(&read(RULES)).unwrap();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            alerts.push((
                rule["alert"].as_str().unwrap().to_owned(),
                rule["expr"].as_str().unwrap().to_owned(),
                rule["annotations"].clone(),
            ));
        }
    }
    alerts
}

/// The dashboard's queries.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    assert_eq!(dashboard["uid"], "watchproxy");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(queries.len() >= 15, "{queries:?}");
    queries
}

/// The metric names a query reads.
fn metric_names(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in query.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if word.starts_with("watchproxy_") || word.starts_with("process_") {
            names.insert(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let dir = Path::new(ROOT).join("deploy/prometheus");
    promtool_ok(&dir, &["check", "rules", "watchproxy-rules.yaml"]);
    promtool_ok(&dir, &["test", "rules", "watchproxy-rules.test.yaml"]);
}

#[test]
fn every_alert_has_a_runbook_and_a_unit_test_that_fires_it() {
    let tests: Yaml = serde_yaml_ng::from_str(&read(RULE_TESTS)).unwrap();
    let mut fired = BTreeSet::new();
    for test in tests["tests"].as_sequence().unwrap() {
        for case in test["alert_rule_test"].as_sequence().unwrap() {
            if case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty())
            {
                fired.insert(case["alertname"].as_str().unwrap().to_owned());
            }
        }
    }
    let alerts = alerts();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for (alert, _, annotations) in &alerts {
        assert!(fired.contains(alert), "no unit test fires {alert}");
        let runbook = format!("docs/runbooks/{alert}.md");
        assert_eq!(annotations["runbook_url"].as_str(), Some(runbook.as_str()));
        let page = read(&runbook);
        assert!(page.starts_with(&format!("# {alert}\n")), "{runbook}");
        for section in [
            "## What it means",
            "## Impact",
            "## Diagnosis",
            "## Mitigation",
        ] {
            assert!(page.contains(section), "{runbook}: no {section}");
        }
    }
}

#[test]
fn the_dashboards_queries_are_valid_promql() {
    // As recording rules, which promtool parses.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in dashboard_queries().iter().enumerate() {
        let query = query.replace("$__rate_interval", "5m");
        rules += &format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&query).unwrap()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("queries.yaml"), rules).unwrap();
    promtool_ok(dir.path(), &["check", "rules", "queries.yaml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_read_is_exposed() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut watch = open_watch(&mut client, watch_req("pods", "0")).await;
    put_pod(&mut ec, "ns", "p", &[], "").await;
    take_events(&mut watch, 1).await;
    let text = http_get(&proxy.metrics_addr.to_string(), "/metrics");
    // Every family's samples: a histogram's and a counter's by their
    // suffixes, as queries name them.
    let mut exposed = BTreeSet::new();
    for line in text.lines() {
        let name = match line.strip_prefix("# TYPE ") {
            Some(typed) => typed.split(' ').next().unwrap(),
            None if line.starts_with('#') => continue,
            None => line.split(['{', ' ']).next().unwrap(),
        };
        exposed.insert(name.to_owned());
        for suffix in ["_bucket", "_count", "_sum"] {
            exposed.insert(format!("{name}{suffix}"));
        }
    }
    let mut read = BTreeSet::new();
    for (_, expr, _) in alerts() {
        read.extend(metric_names(&expr));
    }
    for query in dashboard_queries() {
        read.extend(metric_names(&query));
    }
    assert!(read.len() >= 20, "{read:?}");
    let missing: Vec<_> = read.difference(&exposed).collect();
    assert!(missing.is_empty(), "not exposed: {missing:?}");
}
