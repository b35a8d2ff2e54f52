//! A resource's `max_bytes`: the window is shed first; objects that alone
//! exceed it are given up, every watch ends and reads answer UNAVAILABLE
//! with reason OVER_BUDGET, the process lives on, and the resource serves
//! again once a list fits. A start over the budget is refused the same way.

use std::time::Duration;

use crate::common::*;
use tonic::Code;
use tonic_types::StatusExt;
use watchproxy::config::Config;
use watchproxy::pb::{self, ListRequest};

/// About 1 KiB of pod.
fn big_pod(name: &str, generation: u32) -> String {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "labels": {"gen": generation.to_string()}},
        "spec": {"nodeName": "node-1"},
        "pad": "x".repeat(900),
    })
    .to_string()
}

fn config(etcd_url: &str, max_bytes: &str) -> Config {
    let yaml = pods_yaml(etcd_url, 64).replace(
        "    indexed_fields: [spec.nodeName]\n",
        &format!("    indexed_fields: [spec.nodeName]\n    max_bytes: {max_bytes}\n    cache: {{min_events: 16}}\n"),
    );
    Config::from_yaml(&yaml).unwrap()
}

fn reason(status: &tonic::Status) -> String {
    let info = status.get_error_details().error_info().cloned().unwrap();
    info.reason
}

async fn list(
    client: &mut pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
) -> Result<usize, tonic::Status> {
    let req = ListRequest {
        resource: "pods".into(),
        ..Default::default()
    };
    Ok(client.list(req).await?.into_inner().items.len())
}

async fn put_pods(ec: &mut etcd_client::Client, names: std::ops::Range<u32>, generation: u32) {
    for i in names {
        let name = format!("p-{i}");
        ec.put(
            format!("/registry/pods/ns/{name}"),
            big_pod(&name, generation),
            None,
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_goes_first_then_objects_over_the_budget_are_refused_until_they_fit() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pods(&mut ec, 0..40, 0).await;
    // 40 pods of about 1.5 KiB each as the cache counts them fit; 100 do not.
    let proxy = Proxy::start_config(config(&etcd.client_url, "96Ki")).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    assert_eq!(list(&mut client).await.unwrap(), 40);
    let metric = |name: &str| proxy.metric(name, r#"resource="pods""#);
    let held = metric("watchproxy_cache_bytes");
    assert!((40.0 * 1000.0..96.0 * 1024.0).contains(&held), "{held}");

    // Updates fill the window; its oldest events go to keep the budget.
    let rv = list_version(&mut client, "pods", "").await;
    let mut watch = open_watch(&mut client, watch_req("pods", &rv.to_string())).await;
    for generation in 1..=3 {
        put_pods(&mut ec, 0..40, generation).await;
    }
    assert_eq!(take_events(&mut watch, 120).await.len(), 120);
    wait_until("the window shed", || {
        metric("watchproxy_window_shed_events_total") > 0.0
    })
    .await;
    assert!(metric("watchproxy_cache_bytes") + metric("watchproxy_window_bytes") <= 96.0 * 1024.0);
    let resumed = client.watch(watch_req("pods", &rv.to_string())).await;
    let gone = match resumed {
        Err(status) => status,
        Ok(stream) => until_error(&mut stream.into_inner()).await.0,
    };
    assert_eq!(gone.code(), Code::OutOfRange, "{gone:?}");

    // Objects that alone exceed it: given up, watches end, reads refused.
    put_pods(&mut ec, 40..100, 0).await;
    let (ended, _) = until_error(&mut watch).await;
    assert_eq!(ended.code(), Code::OutOfRange, "{ended:?}");
    let refused = list(&mut client).await.unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::Unavailable, "OVER_BUDGET"),
        "{refused:?}"
    );
    assert!(
        refused.message().contains("max_bytes of 98304"),
        "{refused:?}"
    );
    let retry = refused.get_error_details().retry_info().cloned().unwrap();
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(30)));
    assert_eq!(metric("watchproxy_over_budget"), 1.0);
    assert_eq!(metric("watchproxy_cache_bytes"), 0.0);

    // Once they fit again, a list brings the resource back.
    for i in 30..100 {
        delete_key(&mut ec, &format!("/registry/pods/ns/p-{i}")).await;
    }
    let mut back = None;
    for _ in 0..120 {
        if let Ok(n) = list(&mut client).await {
            back = Some(n);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(back, Some(30));
    assert_eq!(metric("watchproxy_over_budget"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_over_the_budget_is_refused_and_the_process_lives_on() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pods(&mut ec, 0..50, 0).await;
    let proxy = Proxy::start_config(config(&etcd.client_url, "20Ki")).await;
    let mut client = proxy.client().await;
    let metric = |name: &str| proxy.metric(name, r#"resource="pods""#);
    wait_until("the refusal", || metric("watchproxy_over_budget") == 1.0).await;
    let refused = list(&mut client).await.unwrap_err();
    assert_eq!(reason(&refused), "OVER_BUDGET", "{refused:?}");
    let refused = client
        .watch(watch_req("pods", ""))
        .await
        .err()
        .unwrap_or_else(|| panic!("a watch of a refused resource starts"));
    assert_eq!(reason(&refused), "OVER_BUDGET", "{refused:?}");
    // The other resources serve as ever.
    wait_ready(&mut client, "nodes").await;
    assert!(proxy.task.as_ref().is_some_and(|t| !t.is_finished()));
}
