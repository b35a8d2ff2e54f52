//! Kubernetes' own clients, written by others, pointed at watchproxy by a
//! kubeconfig that `watchproxy kubeconfig` printed: kubectl 1.33 and an
//! informer on the official Python client, each through the shared
//! scenario (not ready at start, writes, a restart, a compaction past
//! them) and compared with etcd.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use etcd_client::Client;

use crate::common::{delete_key, listener_at, web_pods, Etcd, External, Forwarder, Proxy};
use crate::{kubernetes_config, kubernetes_proxy};

/// A pod as the apiserver stores one in JSON, with what clients' models
/// require (a container).
pub fn pod(name: &str, ns: &str, app: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "uid": format!("uid-{ns}-{name}"),
                     "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "registry.example/app:1"}]},
        "status": {"phase": "Running"},
    })
    .to_string()
}

pub async fn put(c: &mut Client, ns: &str, name: &str, app: &str) -> u64 {
    let r = c
        .put(
            format!("/registry/pods/{ns}/{name}"),
            pod(name, ns, app),
            None,
        )
        .await
        .unwrap();
    r.header().unwrap().revision() as u64
}

/// A kubeconfig for the API at `server`, as `watchproxy kubeconfig`
/// prints it, in `dir`.
pub fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(["kubeconfig", "--server", server])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, out.stdout).unwrap();
    path
}

pub fn kubectl(config: &Path) -> Command {
    let hint = "run ./scripts/install-deps.sh, which puts kubectl 1.33 in .venv/bin";
    let path = watchproxy_testkit::require("kubectl", hint);
    let version = Command::new(&path)
        .args(["version", "--client"])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(
        version.contains("v1.33."),
        "{} is {version}: kubectl 1.33 is required: {hint}",
        path.display()
    );
    let mut c = Command::new(path);
    c.arg("--kubeconfig").arg(config);
    c
}

/// What kubectl prints for `args`; it must succeed.
fn run(kubectl: &mut Command, args: &[&str]) -> String {
    let out = kubectl.args(args).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{printed}",
        String::from_utf8_lossy(&out.stderr)
    );
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_lists_and_watches_as_from_an_apiserver() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    put(&mut c, "ns1", "a", "web").await;
    put(&mut c, "ns1", "b", "db").await;
    put(&mut c, "ns2", "c", "web").await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), &format!("http://{addr}"));
    let k = || kubectl(&config);

    let table = tokio::task::block_in_place(|| run(&mut k(), &["get", "pods", "-n", "ns1"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "AGE"], "{table}");
    assert_eq!(
        (rows[1][0], rows[2][0], rows.len()),
        ("a", "b", 3),
        "{table}"
    );

    let names = tokio::task::block_in_place(|| {
        run(
            &mut k(),
            &["get", "po", "-A", "-l", "app=web", "-o", "name"],
        )
    });
    assert_eq!(names, "pod/a\npod/c\n");
    let on_node = tokio::task::block_in_place(|| {
        run(
            &mut k(),
            &[
                "get",
                "pods",
                "-A",
                "--field-selector",
                "spec.nodeName=n1",
                "--chunk-size",
                "1",
                "-o",
                "name",
            ],
        )
    });
    assert_eq!(on_node, "pod/a\npod/b\npod/c\n", "three pages of one");

    let json =
        tokio::task::block_in_place(|| run(&mut k(), &["get", "pods", "-n", "ns1", "-o", "json"]));
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let etcd_a = c.get("/registry/pods/ns1/a", None).await.unwrap();
    let etcd_a = &etcd_a.kvs()[0];
    let mut want: serde_json::Value = serde_json::from_slice(etcd_a.value()).unwrap();
    want["metadata"]["resourceVersion"] = etcd_a.mod_revision().to_string().into();
    assert_eq!(list["items"][0], want, "etcd's object at its mod revision");

    let yaml = tokio::task::block_in_place(|| {
        run(&mut k(), &["get", "pod", "a", "-n", "ns1", "-o", "yaml"])
    });
    assert!(yaml.contains("image: registry.example/app:1"), "{yaml}");
    let raw = tokio::task::block_in_place(|| run(&mut k(), &["get", "--raw", "/api/v1"]));
    assert!(raw.contains(r#""name":"pods""#), "{raw}");
    let resources =
        tokio::task::block_in_place(|| run(&mut k(), &["api-resources", "--no-headers"]));
    assert!(
        resources.lines().any(
            |l| l.split_whitespace().collect::<Vec<_>>() == ["pods", "po", "v1", "true", "Pod"]
        ),
        "{resources}"
    );

    let missing = tokio::task::block_in_place(|| {
        k().args(["get", "pod", "none", "-n", "ns1"])
            .output()
            .unwrap()
    });
    assert!(!missing.status.success());
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains(r#"pods "none" not found"#), "{said}");

    // `get -w`: the current objects, then each change as it comes.
    let mut watch = k()
        .args(["get", "pods", "-n", "ns1", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = crate::common::lines_of(watch.stdout.take().unwrap());
    let mut seen = Vec::new();
    let next = |seen: &mut Vec<String>| {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a line from kubectl get -w");
        seen.push(line);
    };
    tokio::task::block_in_place(|| (0..2).for_each(|_| next(&mut seen)));
    put(&mut c, "ns1", "d", "web").await;
    tokio::task::block_in_place(|| next(&mut seen));
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen, ["pod/a", "pod/b", "pod/d"]);
}

/// The official Python client's informer (`examples/kubernetes/informer.py`).
fn python_kubernetes_informer() -> Command {
    let mut c = crate::common::python3();
    let ok = Command::new(c.get_program())
        .args(["-c", "import kubernetes"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the Python kubernetes client is required: run ./scripts/install-deps.sh"
    );
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/kubernetes/informer.py"
    ));
    c
}

/// `@kubernetes/client-node`'s informer (`examples/kubernetes/informer.mjs`).
fn node_kubernetes_informer() -> Command {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/kubernetes");
    let installed = Path::new(dir)
        .join("node_modules/@kubernetes/client-node")
        .is_dir();
    assert!(installed, "@kubernetes/client-node is required: run ./scripts/install-deps.sh (npm ci --prefix examples/kubernetes)");
    let mut c = Command::new("node");
    c.arg(format!("{dir}/informer.mjs"));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_and_node_informers_resume_across_restarts_and_relist_once_on_410() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..10 {
        put(
            &mut ec,
            "ns",
            &format!("p{i}"),
            if i % 2 == 0 { "web" } else { "db" },
        )
        .await;
    }
    // Cut off from etcd at start: the informers' first lists are 503.
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let yaml = crate::common::pods_yaml(&forwarder.url, 64)
        + "kubernetes_api: {enabled: true, listen: 127.0.0.1:0}\n";
    let config = watchproxy::config::Config::from_yaml(&yaml).unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, api_addr) = (grpc.local_addr().unwrap(), api.local_addr().unwrap());
    let mut proxy = Proxy::start_listening(config.clone(), grpc, Some(api)).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(dir.path(), &format!("http://{api_addr}"));

    let target = kubeconfig.to_str().unwrap();
    let mut python = External::spawn(python_kubernetes_informer(), target, "app=web", "stop");
    let mut node = External::spawn(node_kubernetes_informer(), target, "app=web", "stop");
    let both = |python: &mut External, node: &mut External, event: &str, nth: usize| {
        tokio::task::block_in_place(|| {
            python.wait_for_log(event, nth);
            node.wait_for_log(event, nth);
        })
    };
    tokio::task::block_in_place(|| python.wait_for_log("list unavailable", 1));
    forwarder.restore();
    both(&mut python, &mut node, "listed", 1);

    put(&mut ec, "ns", "p0", "web").await;
    put(&mut ec, "ns", "p10", "web").await;
    delete_key(&mut ec, "/registry/pods/ns/p2").await;
    put(&mut ec, "ns", "p1", "web").await;
    both(&mut python, &mut node, r#""ns/p1""#, 1);

    // Restart: the informers watch again from their version, no relist.
    proxy.stop().await;
    put(&mut ec, "ns", "p12", "web").await;
    let restart = |config| async move {
        let (grpc, api) = (listener_at(grpc_addr).await, listener_at(api_addr).await);
        Proxy::start_listening(config, grpc, Some(api)).await
    };
    let mut proxy = restart(config.clone()).await;
    both(&mut python, &mut node, "ns/p12", 1);
    put(&mut ec, "ns", "p14", "web").await;
    both(&mut python, &mut node, "ns/p14", 1);

    // Restart after etcd compacted past their version: 410, one relist.
    proxy.stop().await;
    delete_key(&mut ec, "/registry/pods/ns/p4").await;
    let now = put(&mut ec, "ns", "p16", "web").await;
    ec.compact(now as i64, None).await.unwrap();
    let _proxy = restart(config).await;
    both(&mut python, &mut node, "listed", 2);
    put(&mut ec, "ns", "stop", "web").await;

    let want: BTreeMap<String, String> = (web_pods(&mut ec).await.into_iter())
        .map(|(k, v)| (k.trim_start_matches("/registry/pods/").to_owned(), v))
        .collect();
    for (name, informer) in [("python", python), ("node", node)] {
        let (result, seen) = tokio::task::block_in_place(|| informer.finish());
        let got: BTreeMap<String, String> =
            serde_json::from_value(result["objects"].clone()).unwrap();
        assert_eq!(got, want, "{name}: the informer's copy is etcd's state");
        assert_eq!(
            result["lists"], 2,
            "{name}: {result}: one list at start, one after the 410"
        );
        if name == "python" {
            assert!(
                seen.iter()
                    .any(|l| l.contains("too old") && l.contains("410")),
                "{seen:#?}"
            );
        }
    }
}
