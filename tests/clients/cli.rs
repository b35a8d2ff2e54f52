//! The command line as its users run it: kubectl's flags and outputs,
//! failures that print the status' details and exit with a code that says
//! what happened, and a pipe whose reader goes away.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

/// `watchproxy ARGS`: its exit code, stdout and stderr.
pub(crate) async fn run(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .unwrap_or_else(|_| panic!("watchproxy {args:?} did not end"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `watchproxy ARGS` that must succeed: its stdout.
async fn ok(args: &[&str]) -> String {
    let (code, out, err) = run(args).await;
    assert_eq!(code, 0, "watchproxy {args:?}: {err}");
    out
}

/// The pods of the tests: two namespaces, labels and nodes.
async fn pods(etcd: &Etcd) -> u64 {
    let mut c = etcd.client().await;
    let mut last = 0;
    for (ns, name, app, node) in [
        ("ns-a", "web-1", "web", "node-1"),
        ("ns-a", "web-2", "web", "node-2"),
        ("ns-a", "db-1", "db", "node-1"),
        ("ns-b", "web-3", "web", "node-1"),
        ("ns-b", "cache-1", "cache", "node-2"),
    ] {
        last = put_pod(&mut c, ns, name, &[("app", app)], node).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_list_and_watch_print_what_kubectl_users_expect() {
    let etcd = Etcd::start().await;
    let last = pods(&etcd).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    let addr = proxy.addr.to_string();
    let url = format!("http://{addr}");
    let s = addr.as_str();

    // A table of every namespace, in key order, with a header; the
    // server as host:port and as a URL.
    let table = ok(&["get", "pods", "--server", s]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAMESPACE", "NAME", "RESOURCE", "VERSION"],
        "{table}"
    );
    let names: Vec<&str> = rows[1..].iter().map(|r| r[1]).collect();
    assert_eq!(
        names,
        ["db-1", "web-1", "web-2", "cache-1", "web-3"],
        "{table}"
    );
    assert_eq!(ok(&["list", "pods", "-A", "--server", &url]).await, table);

    // One namespace: no namespace column; wide adds the labels.
    let wide = ok(&["get", "pods", "-n", "ns-b", "-o", "wide", "--server", s]).await;
    let rows: Vec<Vec<&str>> = wide
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "RESOURCE", "VERSION", "LABELS"], "{wide}");
    assert_eq!(rows[1][0], "cache-1");
    assert_eq!(rows[1][2], "app=cache", "{wide}");

    // Selectors, and names.
    let names = ok(&[
        "list",
        "pods",
        "-l",
        "app=web",
        "--field-selector",
        "spec.nodeName=node-1",
        "-o",
        "name",
        "--server",
        s,
    ])
    .await;
    assert_eq!(names, "pods/web-1\npods/web-3\n");

    // --limit is the total, read in pages of --chunk-size.
    let names = ok(&[
        "list",
        "pods",
        "--limit",
        "3",
        "--chunk-size",
        "2",
        "-o",
        "name",
        "--server",
        s,
    ])
    .await;
    assert_eq!(names, "pods/db-1\npods/web-1\npods/web-2\n");

    // json: a List at the list's version, the objects with their versions.
    let json: Value = serde_json::from_str(
        &ok(&[
            "list",
            "pods",
            "-n",
            "ns-a",
            "-o",
            "json",
            "--chunk-size",
            "1",
            "--server",
            s,
        ])
        .await,
    )
    .unwrap();
    assert_eq!(json["kind"], "List");
    assert_eq!(json["metadata"]["resourceVersion"], last.to_string());
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{json}");
    assert_eq!(items[0]["metadata"]["name"], "db-1");
    assert!(items[0]["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|v| !v.is_empty()));

    // yaml of one object by name.
    let yaml = ok(&[
        "get", "pods", "web-3", "-n", "ns-b", "-o", "yaml", "--server", s,
    ])
    .await;
    let pod: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(pod["metadata"]["name"], "web-3", "{yaml}");
    assert_eq!(pod["spec"]["nodeName"], "node-1", "{yaml}");

    // A watch prints the current objects as ADDED, then the changes, one
    // JSON document per line.
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args([
            "watch", "pods", "-n", "ns-a", "-l", "app=web", "-o", "json", "--server", s,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || -> Value {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a watch event");
        serde_json::from_str(&line).unwrap()
    };
    for name in ["web-1", "web-2"] {
        let e = next();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some(name)),
            "{e}"
        );
    }
    let mut c = etcd.client().await;
    let changed = put_pod(&mut c, "ns-a", "web-2", &[("app", "web")], "node-3").await;
    let e = next();
    assert_eq!(e["type"], "MODIFIED", "{e}");
    assert_eq!(
        e["object"]["metadata"]["resourceVersion"],
        changed.to_string()
    );
    assert_eq!(e["object"]["spec"]["nodeName"], "node-3");
    delete_key(&mut c, "/registry/pods/ns-a/web-1").await;
    let e = next();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("DELETED"), Some("web-1")),
        "{e}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_print_their_details_and_exit_with_what_happened() {
    let etcd = Etcd::start().await;
    pods(&etcd).await;
    compact_all(&mut etcd.client().await).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    let s = proxy.addr.to_string();
    let s = s.as_str();

    let (code, out, err) = run(&["get", "pods", "nope", "-n", "ns-a", "--server", s]).await;
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
    assert!(
        err.contains("NotFound") && err.contains("reason: NOT_FOUND"),
        "{err}"
    );

    let (code, _, err) = run(&["list", "pods", "-l", "app in (web", "--server", s]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("reason: BAD_SELECTOR") && err.contains("field label_selector:"),
        "{err}"
    );

    let (code, _, err) = run(&["list", "things", "--server", s]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("reason: "), "{err}");

    // A version etcd compacted away: list again, says the code; the
    // details say from where.
    let (code, _, err) = run(&["watch", "pods", "--resource-version", "1", "--server", s]).await;
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("reason: ") && err.contains("oldest_resource_version: "),
        "{err}"
    );

    // No server there.
    let free = format!("127.0.0.1:{}", watchproxy_testkit::free_port());
    let (code, _, err) = run(&["list", "pods", "--server", &free]).await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("Unavailable"), "{err}");

    // A bad command line: clap's usage error; https without a CA.
    let (code, _, err) = run(&["list", "pods", "-n", "a", "-A", "--server", s]).await;
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["list", "pods", "--server", &format!("https://{s}")]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--ca"), "{err}");

    // Every flag says what it is for.
    let help = ok(&["list", "--help"]).await;
    for flag in [
        "--namespace",
        "--all-namespaces",
        "--selector",
        "--field-selector",
        "--output",
        "--limit",
        "--chunk-size",
        "--resource-version",
        "--server",
        "--ca",
        "--cert",
        "--key",
        "--token-file",
    ] {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(flag) || l.contains(&format!(", {flag}")))
            .unwrap_or_else(|| panic!("{flag} is not in the help:\n{help}"));
        let described = line
            .split_once(flag)
            .map(|(_, rest)| rest.trim())
            .is_some_and(|rest| rest.split_whitespace().count() > 1);
        let next_line = help.lines().skip_while(|l| *l != line).nth(1).unwrap_or("");
        assert!(
            described || !next_line.trim().is_empty(),
            "{flag} has no help:\n{help}"
        );
    }
    assert!(help.contains("Exit codes:"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_names_the_caller() {
    let etcd = Etcd::start().await;
    pods(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "- {token: alice-token, user: alice, groups: [tenant-b]}\n",
    )
    .unwrap();
    let config = pods_config_and(
        &etcd.client_url,
        &format!(
            r#"
auth:
  tokens_file: {}
  allow_plaintext_tokens: true
authorization:
  rules:
    - subjects: ["group:tenant-b"]
      resources: ["pods"]
      namespaces: ["ns-b"]
      verbs: ["list", "get", "watch"]
"#,
            tokens.display()
        ),
    );
    let proxy = Proxy::start_config(config).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "alice-token\n").unwrap();
    let s = proxy.addr.to_string();
    let t = token.display().to_string();
    let mut names = String::new();
    for _ in 0..100 {
        let (code, out, _) = run(&[
            "list",
            "pods",
            "-n",
            "ns-b",
            "-o",
            "name",
            "--token-file",
            &t,
            "--server",
            &s,
        ])
        .await;
        if code == 0 {
            names = out;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(names, "pods/cache-1\npods/web-3\n");
    let (code, _, err) = run(&[
        "list",
        "pods",
        "-n",
        "ns-a",
        "--token-file",
        &t,
        "--server",
        &s,
    ])
    .await;
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = run(&["list", "pods", "-n", "ns-b", "--server", &s]).await;
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = run(&[
        "list",
        "pods",
        "--token-file",
        "/nonexistent/token",
        "--server",
        &s,
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/token"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_reader_goes_away_ends_quietly() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    for i in 0..3 {
        put_pod(&mut c, "ns", &format!("p{i}"), &[], "n").await;
    }
    let proxy = Proxy::start(&etcd.client_url).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    // `watchproxy watch pods | head -1`
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(["watch", "pods", "--server"])
        .arg(format!("http://{}", proxy.addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("EVENT "), "{first}");
    // The reader is gone; the next event has nowhere to go.
    put_pod(&mut c, "ns", "later", &[], "n").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the watch went on without a reader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
