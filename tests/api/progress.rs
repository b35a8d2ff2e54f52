//! RequestProgress: a cache proves it caught up with etcd, on demand, for
//! reads at once and for watches as far as their events have gone.

use crate::common::*;
use watchproxy::config::{Config, ServePath};
use watchproxy::pb::{self, EventType};

const PATHS: [ServePath; 2] = [ServePath::Fast, ServePath::Tonic];

fn progress(resource: &str, bookmark_watches: bool) -> pb::ProgressRequest {
    pb::ProgressRequest {
        resource: resource.into(),
        bookmark_watches,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_resource_is_proven_fresh_on_demand_and_its_watches_told() {
    // etcd's own progress notifications every ten minutes, as most run it:
    // an idle prefix's cache learns nothing of etcd's revision by itself.
    let etcd = Etcd::start_with_default_progress().await;
    let mut e = etcd.client().await;
    e.put("/registry/minions/n1", "{}", None).await.unwrap();
    let node_written = e.get("/", None).await.unwrap().header().unwrap().revision() as u64;
    for path in PATHS {
        let yaml = pods_yaml(&etcd.client_url, 64)
            .replace("bookmark_interval: 1s", "bookmark_interval: 1h");
        let mut config = Config::from_yaml(&yaml).unwrap();
        config.watch.serve_path = path;
        let proxy = Proxy::start_config(config).await;
        let mut client = proxy.client().await;
        wait_ready(&mut client, "nodes").await;
        wait_ready(&mut client, "pods").await;
        // A watch of pods whose selector none of the pods written match:
        // it sees no event, and only periodic bookmarks (every hour here)
        // would tell it how far it has got.
        let from = list_version(&mut client, "pods", "").await.to_string();
        let mut filtered = open_watch(
            &mut client,
            pb::WatchRequest {
                allow_bookmarks: true,
                label_selector: "app=none".into(),
                ..watch_req("pods", &from)
            },
        )
        .await;
        // Pods change; nodes stay idle.
        let mut last = 0;
        for i in 0..3 {
            last = put_pod(&mut e, "ns", &format!("p{i}-{path:?}"), &[], "n").await;
        }

        let pods = client
            .request_progress(progress("pods", true))
            .await
            .unwrap()
            .into_inner();
        let proven = |r: &pb::ProgressResponse| {
            let n = |s: &str| s.parse::<u64>().unwrap();
            (n(&r.resource_version), n(&r.watch_resource_version))
        };
        assert_eq!(
            proven(&pods),
            (last, last),
            "{path:?}: pods' events are all dispatched"
        );
        assert!(!pods.state_digest.is_empty() && !pods.changed_resource_version.is_empty());

        // The filtered watch is told where it stands at once.
        let bookmark = next_event(&mut filtered).await.unwrap().unwrap();
        assert_eq!(
            (bookmark.r#type, bookmark.object.unwrap().resource_version),
            (EventType::Bookmark as i32, last.to_string()),
            "{path:?}"
        );

        let idle = client
            .request_progress(progress("nodes", false))
            .await
            .unwrap()
            .into_inner();
        let (now, watched) = proven(&idle);
        assert_eq!(now, last, "{path:?}: reads are proven at etcd's revision");
        // Nothing moved the idle cache's watches past its last event: no
        // event, no progress notification from etcd.
        assert_eq!(
            watched, node_written,
            "{path:?}: the watches stand at the last change"
        );
        // A read at the proven version is answered at once, from the cache.
        let list = client
            .list(pb::ListRequest {
                resource: "nodes".into(),
                resource_version: now.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(list.resource_version.parse::<u64>().unwrap() >= now);
        let unknown = client
            .request_progress(progress("nope", false))
            .await
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    }
}

/// Bookmarking every watch of a resource is a costly read of the caller's:
/// past its budget, RESOURCE_EXHAUSTED with when to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarking_every_watch_is_a_costly_read() {
    let etcd = Etcd::start().await;
    let mut config = Config::from_yaml(&pods_yaml(&etcd.client_url, 64)).unwrap();
    config.limits.costly_reads_per_user_per_second = Some(0.01);
    config.limits.costly_read_burst_per_user = 2;
    config.validate().unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    for _ in 0..2 {
        client
            .request_progress(progress("pods", true))
            .await
            .unwrap();
    }
    let spent = client
        .request_progress(progress("pods", true))
        .await
        .unwrap_err();
    assert_eq!(spent.code(), tonic::Code::ResourceExhausted, "{spent:?}");
    // Without the bookmarks, a proof of progress costs nothing of it.
    client
        .request_progress(progress("pods", false))
        .await
        .unwrap();
}
