//! etcd's own authentication: watchproxy reads as an etcd user whose role
//! allows only its prefixes, keeps reading after the user's token expires,
//! and refuses to start on a prefix the role does not allow.

use std::time::Duration;

use crate::common::*;
use etcd_client::{Client, ConnectOptions, Permission};
use watchproxy::config::Config;
use watchproxy::pb::EventType;
use watchproxy_testkit::EtcdOptions;

/// An etcd with authentication on: root, and user `wp` whose role reads
/// only `/registry/pods/`. Tokens live 3 s, so tests see them expire.
async fn etcd_with_users() -> (Etcd, Client) {
    let etcd = Etcd::start_with(EtcdOptions {
        extra_args: vec!["--auth-token-ttl=3".into()],
        ..EtcdOptions::default()
    })
    .await
    .unwrap();
    let mut c = etcd.client().await;
    c.user_add("root", "root-pw", None).await.unwrap();
    c.role_add("root").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("pods-reader").await.unwrap();
    c.role_grant_permission(
        "pods-reader",
        Permission::read("/registry/pods/").with_prefix(),
    )
    .await
    .unwrap();
    c.user_add("wp", "wp-pw", None).await.unwrap();
    c.user_grant_role("wp", "pods-reader").await.unwrap();
    c.auth_enable().await.unwrap();
    let root = Client::connect(
        [&etcd.client_url],
        Some(ConnectOptions::new().with_user("root", "root-pw")),
    )
    .await
    .unwrap();
    (etcd, root)
}

fn config(etcd: &Etcd, dir: &std::path::Path, resources: &str) -> Config {
    let password = dir.join("password");
    std::fs::write(&password, "wp-pw\n").unwrap();
    let yaml = format!(
        "etcd: {{endpoints: [\"{}\"], username: wp, password_file: {}}}\nwatch: {{freshness_wait: 2s}}\nresources:\n{resources}",
        etcd.client_url,
        password.display()
    );
    let config = Config::from_yaml(&yaml).unwrap();
    config.validate().unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_user_reads_its_prefix_past_its_token_expiry() {
    let (etcd, mut root) = etcd_with_users().await;
    let first = put_pod(&mut root, "ns", "a", &[], "").await;
    let dir = tempfile::tempdir().unwrap();
    let pods = "  - {name: pods, prefix: /registry/pods}\n";
    let proxy = Proxy::start_config(config(&etcd, dir.path(), pods)).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let mut watch = open_watch(&mut client, watch_req("pods", &first.to_string())).await;

    // Past the token's life: reads and the watch go on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    root.refresh_token().await.unwrap();
    let later = put_pod(&mut root, "ns", "b", &[], "").await;
    let e = take_events(&mut watch, 1).await;
    assert_eq!(summary(&e[0]), (EventType::Added, "ns/b".into(), later));
    let items = list_items(&mut client, "pods").await;
    assert_eq!(items.len(), 2, "a consistent list after the token expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_the_etcd_role_denies_fails_the_start_with_a_clear_error() {
    let (etcd, _root) = etcd_with_users().await;
    let dir = tempfile::tempdir().unwrap();
    let both = "  - {name: pods, prefix: /registry/pods}\n  - {name: secrets, prefix: /registry/secrets}\n";
    let mut proxy = Proxy::start_config(config(&etcd, dir.path(), both)).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), proxy.task.take().unwrap())
        .await
        .expect("the start fails at once")
        .unwrap();
    let err = format!("{:#}", ended.unwrap_err());
    assert!(
        err.contains("etcd denies reading /registry/secrets/"),
        "{err}"
    );

    let password = dir.path().join("password");
    std::fs::write(&password, "wrong").unwrap();
    let pods = "  - {name: pods, prefix: /registry/pods}\n";
    let mut cfg = config(&etcd, dir.path(), pods);
    std::fs::write(&password, "wrong").unwrap();
    cfg.etcd.password_file = Some(password);
    let mut proxy = Proxy::start_config(cfg).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), proxy.task.take().unwrap())
        .await
        .expect("the start fails at once")
        .unwrap();
    let err = format!("{:#}", ended.unwrap_err());
    assert!(err.contains("etcd refused user \"wp\""), "{err}");
    assert!(
        !err.contains("wrong"),
        "the password stays out of the error: {err}"
    );
}
