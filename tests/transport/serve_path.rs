//! The two ways calls are served (`watch.serve_path`): the service's own
//! HTTP/2 path, with live changes framed at once or each through its
//! watch's queue (`watch.direct_delivery`), and tonic's server answer the
//! same calls alike.

use std::time::Duration;

use crate::common::*;
use tonic_types::StatusExt;
use watchproxy::config::{Config, ServePath};
use watchproxy::pb::{self, EventType};

fn config(etcd_url: &str, path: ServePath, direct: bool) -> Config {
    let yaml = PODS_CONFIG.replace("ETCD", etcd_url).replace("QUEUE", "64");
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config.watch.direct_delivery = direct;
    config
}

/// What a client sees of one scenario: a watch's initial state, its end
/// marker and live changes; a filtered watch; a paged list; a Get; a bad
/// request; a compressed watch request; and the end of a watch at
/// shutdown.
async fn scenario(path: ServePath, direct: bool) -> Vec<String> {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for (i, node) in ["n1", "n2", "n1"].iter().enumerate() {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[("app", "web")], node).await;
    }
    let mut proxy = Proxy::start_config(config(&etcd.client_url, path, direct)).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    let base = list_version(&mut client, "pods", "").await;
    let rel = |v: u64| v.saturating_sub(base);
    let mut seen = Vec::new();

    let mut all = open_watch(
        &mut client,
        pb::WatchRequest {
            send_initial_events: true,
            allow_bookmarks: true,
            ..watch_req("pods", "")
        },
    )
    .await;
    let mut n1 = open_watch(
        &mut client,
        pb::WatchRequest {
            field_selector: "spec.nodeName=n1".into(),
            ..watch_req("pods", "")
        },
    )
    .await;
    for _ in 0..4 {
        let e = next_event(&mut all).await.unwrap().unwrap();
        let (kind, name, _) = summary(&e);
        seen.push(format!("all {kind:?} {name} end={}", e.initial_events_end));
    }
    for e in take_events(&mut n1, 2).await {
        seen.push(format!("n1 initial {:?}", summary(&e).1));
    }
    put_pod(&mut ec, "ns", "p1", &[("app", "web")], "n1").await;
    delete_key(&mut ec, "/registry/pods/ns/p0").await;
    for e in take_events(&mut all, 2).await {
        let (kind, name, v) = summary(&e);
        seen.push(format!("all {kind:?} {name} +{}", rel(v)));
    }
    for e in take_events(&mut n1, 2).await {
        let (kind, name, v) = summary(&e);
        seen.push(format!("n1 {kind:?} {name} +{}", rel(v)));
    }
    // The live changes' delivery was timed, by the path that wrote them.
    let (this, other) = match path {
        ServePath::Fast => ("fast", "tonic"),
        ServePath::Tonic => ("tonic", "fast"),
    };
    let timed = |p: &str| {
        let labels = format!("serve_path=\"{p}\",api=\"watchproxy\"");
        proxy.metric("watchproxy_event_delivery_seconds_count", &labels)
    };
    // Timed once the write returns, which may be after the client read
    // it: looked at until it shows, for up to 2 s.
    for _ in 0..20 {
        if timed(this) >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(timed(this) >= 1.0, "no delivery timed on the {this} path");
    assert_eq!(timed(other), 0.0, "a delivery timed on the {other} path");

    let page = client
        .list(pb::ListRequest {
            resource: "pods".into(),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let rest = client
        .list(pb::ListRequest {
            resource: "pods".into(),
            continue_token: page.continue_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    seen.push(format!(
        "list {:?} then {:?}, remaining {:?}",
        page.items.iter().map(|o| &o.name).collect::<Vec<_>>(),
        rest.items.iter().map(|o| &o.name).collect::<Vec<_>>(),
        page.remaining_item_count
    ));
    let got = client
        .get(pb::GetRequest {
            resource: "pods".into(),
            namespace: "ns".into(),
            name: "p2".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    seen.push(format!("get {} {}", got.name, got.labels["app"]));
    let bad = client
        .watch(pb::WatchRequest {
            label_selector: "app in (".into(),
            ..watch_req("pods", "")
        })
        .await
        .unwrap_err();
    seen.push(format!(
        "bad {:?} {} reason {}",
        bad.code(),
        bad.message(),
        reason(&bad)
    ));

    let mut zipped = proxy
        .client()
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let mut z = open_watch(&mut zipped, watch_req("pods", &(base + 1).to_string())).await;
    for e in take_events(&mut z, 1).await {
        let (kind, name, v) = summary(&e);
        seen.push(format!("gzip {kind:?} {name} +{}", rel(v)));
    }

    proxy.shutdown.cancel();
    let (status, _) = until_error(&mut all).await;
    let info = status.get_error_details().error_info().cloned().unwrap();
    seen.push(format!(
        "shutdown {:?} resume +{} reason {} (resume_resource_version +{})",
        status.code(),
        rel(resume_version(&status)),
        info.reason,
        rel(info.metadata["resume_resource_version"].parse().unwrap())
    ));
    tokio::time::timeout(Duration::from_secs(20), proxy.stop())
        .await
        .unwrap();
    seen
}

/// The `ErrorInfo` reason a status carries, in the watchproxy.v1 domain.
fn reason(status: &tonic::Status) -> String {
    let info = status.get_error_details().error_info().cloned().unwrap();
    assert_eq!(info.domain, "watchproxy.v1");
    info.reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_serve_paths_answer_every_call_alike() {
    let fast = scenario(ServePath::Fast, true).await;
    let queued = scenario(ServePath::Fast, false).await;
    let tonic = scenario(ServePath::Tonic, true).await;
    assert_eq!(fast, queued);
    assert_eq!(fast, tonic);
    assert!(
        fast.iter()
            .any(|l| l.starts_with("shutdown Unavailable") && l.contains("reason SHUTTING_DOWN")),
        "{fast:#?}"
    );
    assert!(
        fast.iter().any(|l| l.contains("reason BAD_SELECTOR")),
        "{fast:#?}"
    );
    assert!(
        fast.iter().any(|l| l.contains("InvalidArgument")),
        "{fast:#?}"
    );
    assert_eq!(
        fast.iter().filter(|l| l.starts_with("all ")).count(),
        6,
        "{fast:#?}"
    );
    assert!(
        fast.contains(&format!("all {:?} / end=true", EventType::Bookmark)),
        "{fast:#?}"
    );
}
