//! Who calls, on Kubernetes' API as on the gRPC port: bearer tokens, the
//! rules and their forced selectors, and a watch whose credential ends
//! ended with an ERROR event, so that an informer relists with its new
//! one.

use serde_json::json;

use crate::clients::put;
use crate::common::{tenant_auth, write, Etcd, TENANT_TOKENS};
use crate::http::{self, get};
use crate::{kubernetes_config, kubernetes_proxy_as};

const ALICE: (&str, &str) = ("Authorization", "Bearer alice-token");
const NODE: (&str, &str) = ("Authorization", "Bearer node-token");

#[tokio::test]
async fn tokens_and_rules_hold_and_an_ended_credential_ends_its_watch() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    put(&mut c, "tenant-a", "a", "web").await;
    put(&mut c, "other", "b", "web").await;
    let dir = tempfile::tempdir().unwrap();
    let config = kubernetes_config(&etcd, &tenant_auth(dir.path()));
    let (_proxy, addr) = kubernetes_proxy_as(config, &[NODE]).await;

    let (status, anonymous) = get(addr, "/api/v1/namespaces/tenant-a/pods", &[]).await;
    assert_eq!(
        (status, &anonymous["reason"]),
        (401, &json!("Unauthorized")),
        "{anonymous}"
    );
    let (status, _) = get(addr, "/api/v1", &[]).await;
    assert_eq!(status, 401, "discovery is for identified callers");
    let wrong = ("Authorization", "Bearer not-a-token");
    let (status, _) = get(addr, "/api/v1/pods", &[wrong]).await;
    assert_eq!(status, 401);

    let (status, own) = get(addr, "/api/v1/namespaces/tenant-a/pods", &[ALICE]).await;
    assert_eq!(
        (status, &own["items"][0]["metadata"]["name"]),
        (200, &json!("a"))
    );
    let (status, other) = get(addr, "/api/v1/namespaces/other/pods", &[ALICE]).await;
    assert_eq!(
        (status, &other["reason"]),
        (403, &json!("Forbidden")),
        "{other}"
    );
    let message = other["message"].as_str().unwrap();
    assert!(
        message.contains(r#"User "alice" cannot list resource "pods""#)
            && message.contains(r#"namespace "other""#),
        "{message}"
    );

    // node-7 reads only the pods on its node, whatever it asks.
    put(&mut c, "other", "on-7", "web").await;
    let mut on_7 = crate::clients::pod("on-7b", "other", "web");
    on_7 = on_7.replace(r#""nodeName":"n1""#, r#""nodeName":"node-7""#);
    c.put("/registry/pods/other/on-7b", on_7, None)
        .await
        .unwrap();
    let (status, mine) = get(addr, "/api/v1/pods", &[NODE]).await;
    assert_eq!(status, 200, "{mine}");
    let names: Vec<&str> = (mine["items"].as_array().unwrap().iter())
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["on-7b"]);

    // Alice's token leaves the file: her open watch ends with a 401.
    let (_, list) = get(addr, "/api/v1/namespaces/tenant-a/pods", &[ALICE]).await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let target = format!("/api/v1/namespaces/tenant-a/pods?watch=true&resourceVersion={rv}");
    let mut watch = http::request(addr, "GET", &target, &[ALICE]).await;
    assert_eq!(watch.status, 200);
    let without_alice: String = TENANT_TOKENS
        .lines()
        .filter(|l| !l.contains("alice"))
        .map(|l| format!("{l}\n"))
        .collect();
    write(dir.path(), "tokens.yaml", &without_alice);
    let line = watch.next_line().await.unwrap();
    assert_eq!(line["type"], "ERROR", "{line}");
    assert_eq!(
        (&line["object"]["code"], &line["object"]["reason"]),
        (&json!(401), &json!("Unauthorized")),
        "{line}"
    );
    assert!(
        watch.next_line().await.is_none(),
        "the watch ends with its credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_over_tls_is_the_user_and_groups_its_certificate_names() {
    use crate::common::{mutual_tls, test_ca, test_leaf};
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    put(&mut c, "tenant-a", "a", "web").await;
    put(&mut c, "other", "b", "web").await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (server_ca, client_ca) = (test_ca("server-ca"), test_ca("client-ca"));
    let tls = mutual_tls(dir.path(), &server_ca, &client_ca.pem(), "client-ca.crt");
    let config = kubernetes_config(&etcd, &(tls + &tenant_auth(dir.path())));
    let proxy = crate::common::Proxy::start_config(config).await;
    let port = proxy.kubernetes_addr.unwrap().port();
    // Its subject's O is tenant-a: the group the tenant's rule names.
    let (agent, agent_key) = test_leaf(&client_ca, "agent", &[], false);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args([
            "kubeconfig",
            "--server",
            &format!("https://localhost:{port}"),
        ])
        .args(["--certificate-authority", &file("ca.crt", &server_ca.pem())])
        .args(["--client-certificate", &file("agent.crt", &agent)])
        .args(["--client-key", &file("agent.key", &agent_key)])
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        !printed.contains("PRIVATE KEY"),
        "files are named, never copied in"
    );
    let kubeconfig = file("kubeconfig", &printed);
    let kubectl = |args: &[&str]| {
        let mut k = crate::clients::kubectl(std::path::Path::new(&kubeconfig));
        let out = k.args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let mut listed = (false, String::new());
    for _ in 0..50 {
        listed = tokio::task::block_in_place(|| {
            kubectl(&["get", "pods", "-n", "tenant-a", "-o", "name"])
        });
        if listed.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(listed, (true, "pod/a\n".to_owned()));
    let (ok, said) = tokio::task::block_in_place(|| kubectl(&["get", "pods", "-n", "other"]));
    assert!(!ok);
    assert!(
        said.contains(r#"User "agent" cannot list resource "pods""#),
        "{said}"
    );
    // A watch over HTTP/2 (ALPN h2): kubectl's request ends at its timeout.
    let (ok, watched) = tokio::task::block_in_place(|| {
        kubectl(&[
            "get",
            "pods",
            "-n",
            "tenant-a",
            "-w",
            "-o",
            "name",
            "--request-timeout",
            "2s",
        ])
    });
    assert!(watched.starts_with("pod/a\n"), "{ok} {watched}");
}
