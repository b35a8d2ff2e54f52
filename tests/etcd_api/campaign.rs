//! watchproxy-check's informers written against etcd's own API,
//! proven against etcd's recorded history under faults: etcd's watch
//! guarantees (ordered, unique, reliable, atomic per revision,
//! resumable, bookmarkable) through watchproxy.

use std::time::Duration;

use crate::common::*;
use watchproxy::config::{Config, ServePath};

use super::shared::*;
use watchproxy_check::writer::Writes;
use watchproxy_check::{Api, Check, Options};

fn options(etcd: &Etcd, watchproxy: String, seed: u64, misbehave: bool) -> Options {
    Options {
        etcd: etcd.client_url.clone(),
        watchproxy: vec![watchproxy],
        resource: "pods".into(),
        prefix: "/registry/pods".into(),
        watchers: 12,
        rate: 40,
        duration: campaign_writes(),
        settle: Duration::from_secs(20),
        seed,
        misbehave,
        identities: Vec::new(),
        writes: Writes::Mixed,
        readers: 0,
        api: Api::Etcd,
    }
}

async fn through(
    name: &str,
    options: Options,
    fault: impl std::future::Future<Output = ()>,
    heal: impl std::future::Future<Output = ()>,
) -> watchproxy_check::Report {
    let mut check = Check::start(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fault.await;
    check.writes_done().await.unwrap();
    heal.await;
    let report = check.finish().await.unwrap();
    eprintln!("{name}: {report}");
    assert!(report.passed(), "{name}:\n{report}");
    assert!(report.checked > 0, "{name}: events were checked");
    report
}

fn etcd_api_proxy_yaml(etcd_url: &str) -> Config {
    config(etcd_url, ServePath::Fast)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_stalling_and_vanishing_etcd_clients() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 21, true);
    let r = through("etcd clients, misbehaving", options, async {}, async {}).await;
    assert!(r.resumes > 0, "the vanishing clients resumed: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_through_a_compaction_while_cut_off() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    let proxy = Proxy::start_config(etcd_api_proxy_yaml(&forwarder.url)).await;
    let mut ec = etcd.client().await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 22, false);
    let heal = async {
        compact_all(&mut ec).await;
        forwarder.restore();
    };
    let r = through(
        "etcd clients, compaction while cut off",
        options,
        async { forwarder.cut() },
        heal,
    )
    .await;
    assert!(r.relists > 12, "canceled watches read again: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_resume_through_a_watchproxy_restart() {
    let etcd = Etcd::start().await;
    let mut proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
    let addr = proxy.addr;
    let options = options(&etcd, format!("http://{addr}"), 24, false);
    let restart = async {
        proxy.stop().await;
        let listener = listener_at(addr).await;
        proxy = Proxy::start_on(etcd_api_proxy_yaml(&etcd.client_url), listener).await;
    };
    let r = through(
        "etcd clients, watchproxy restarted",
        options,
        restart,
        async {},
    )
    .await;
    assert!(
        r.resumes > 0,
        "the clients resumed from their revisions: {r}"
    );
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_through_etcd_killed_and_restarted() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start_config(etcd_api_proxy_yaml(&etcd.client_url)).await;
    let options = options(&etcd, format!("http://{}", proxy.addr), 23, false);
    through(
        "etcd clients, etcd killed and restarted",
        options,
        etcd.restart(),
        async {},
    )
    .await;
}
