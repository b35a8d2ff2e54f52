//! What the command line will not do: send a token in plain text across
//! the network, or print a name that drives the terminal.

use std::time::Duration;

use crate::cli::run;
use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_goes_in_plain_text_only_to_loopback_or_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let t = token.display().to_string();
    // A name that cannot resolve here: nothing leaves the machine even
    // when the client tries.
    for server in [
        "watchproxy.invalid:50051",
        "http://watchproxy.invalid:50051",
    ] {
        let (code, _, err) = run(&["list", "pods", "--server", server, "--token-file", &t]).await;
        assert_eq!(code, 1, "{server}: {err}");
        assert!(
            err.contains("refusing to send --token-file's token in plain text"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
    let told = [
        "list",
        "pods",
        "--server",
        "watchproxy.invalid:50051",
        "--token-file",
        &t,
        "--insecure-plaintext-token",
    ];
    let (code, _, err) = run(&told).await;
    assert_eq!(code, 5, "tried, and could not reach it: {err}");
    // Loopback: served, as before.
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let s = proxy.addr.to_string();
    let mut code = -1;
    for _ in 0..100 {
        code = run(&["list", "pods", "--server", &s, "--token-file", &t])
            .await
            .0;
        if code == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_labels_cannot_drive_the_terminal() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    let evil = "evil\u{1b}]0;owned\u{7}\u{1b}[2J";
    put_pod(&mut c, "ns", evil, &[("app", "a\rb\u{9b}c")], "node-1").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let s = proxy.addr.to_string();
    let mut shown = Vec::new();
    for output in ["name", "wide"] {
        let mut out = String::new();
        for _ in 0..100 {
            let (code, o, _) =
                run(&["list", "pods", "-n", "ns", "-o", output, "--server", &s]).await;
            if code == 0 && o.contains("evil") {
                out = o;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(out.contains("evil"), "{output}: {out:?}");
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{output}: {out:?}"
        );
        assert!(
            out.contains(r"evil\u{1b}]0;owned\u{7}\u{1b}[2J"),
            "{output}: {out:?}"
        );
        shown.push(out);
    }
    assert!(shown[1].contains(r"app=a\rb\u{9b}c"), "{:?}", shown[1]);
}
