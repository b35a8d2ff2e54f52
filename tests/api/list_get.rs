//! List and Get against a real etcd.

use std::collections::BTreeMap;

use crate::common::*;
use etcd_client::GetOptions;
use tonic::transport::Channel;
use tonic::Code;
use watchproxy::config::Config;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{GetRequest, ListRequest, ResourceVersionMatch};

fn list_req(resource: &str) -> ListRequest {
    ListRequest {
        resource: resource.into(),
        ..Default::default()
    }
}

async fn preload(c: &mut etcd_client::Client, n: usize) {
    for i in 0..n {
        let ns = format!("ns-{}", i % 5);
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(
            c,
            &ns,
            &format!("pod-{i:04}"),
            &[("app", app)],
            &format!("node-{}", i % 7),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_after_preload_equals_etcd_content() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    preload(&mut ec, 300).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let resp = client.list(list_req("pods")).await.unwrap().into_inner();
    let want = ec
        .get("/registry/pods/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let want: BTreeMap<String, (Vec<u8>, String)> = want
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                (kv.value().to_vec(), kv.mod_revision().to_string()),
            )
        })
        .collect();
    let got: BTreeMap<String, (Vec<u8>, String)> = resp
        .items
        .iter()
        .map(|o| {
            (
                o.key.clone(),
                (o.value.to_vec(), o.resource_version.clone()),
            )
        })
        .collect();
    assert_eq!(got.len(), 300);
    assert_eq!(got, want);
    let first = &resp.items[0];
    assert_eq!(
        (first.namespace.as_str(), first.name.as_str()),
        ("ns-0", "pod-0000")
    );
    assert_eq!(first.labels.get("app").map(String::as_str), Some("web"));
    assert!(resp.resource_version.parse::<u64>().unwrap() >= 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_cover_the_list_once_each_with_remaining_counts() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    preload(&mut ec, 250).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let mut keys = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let req = ListRequest {
            limit: 100,
            continue_token: token,
            ..list_req("pods")
        };
        let resp = client.list(req).await.unwrap().into_inner();
        pages += 1;
        keys.extend(resp.items.iter().map(|o| o.key.clone()));
        if resp.continue_token.is_empty() {
            assert_eq!(resp.remaining_item_count, None);
            break;
        }
        assert_eq!(resp.remaining_item_count, Some(250 - keys.len() as i64));
        // Writes between pages do not change what the pages show.
        put_pod(&mut ec, "ns-0", &format!("late-{pages}"), &[], "").await;
        token = resp.continue_token;
    }
    assert_eq!(pages, 3);
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, keys, "every key once, in order");
    assert_eq!(keys.len(), 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scoping_and_selectors_filter_the_list() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    preload(&mut ec, 70).await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let list = |req: ListRequest| {
        let mut client = client.clone();
        async move { client.list(req).await.unwrap().into_inner().items }
    };
    let in_ns = list(ListRequest {
        namespace: "ns-3".into(),
        ..list_req("pods")
    })
    .await;
    assert_eq!(in_ns.len(), 14);
    assert!(in_ns.iter().all(|o| o.namespace == "ns-3"));

    let web = list(ListRequest {
        label_selector: "app=web".into(),
        ..list_req("pods")
    })
    .await;
    assert_eq!(web.len(), 35);
    let node = list(ListRequest {
        field_selector: "spec.nodeName=node-2".into(),
        ..list_req("pods")
    })
    .await;
    assert_eq!(node.len(), 10);
    let both = list(ListRequest {
        namespace: "ns-0".into(),
        label_selector: "app!=db".into(),
        field_selector: "spec.nodeName=node-0".into(),
        ..list_req("pods")
    })
    .await;
    let names: Vec<&str> = both.iter().map(|o| o.name.as_str()).collect();
    // ns-0 and node-0 are i % 35 == 0: pods 0 and 35; only 0 is not "db".
    assert_eq!(names, ["pod-0000"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_returns_one_object_or_not_found() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let rev = put_pod(&mut ec, "default", "web-1", &[("app", "web")], "node-1").await;
    ec.put(
        "/registry/minions/node-1",
        r#"{"metadata":{"labels":{"zone":"a"}}}"#,
        None,
    )
    .await
    .unwrap();
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let get = GetRequest {
        resource: "pods".into(),
        namespace: "default".into(),
        name: "web-1".into(),
        ..Default::default()
    };
    let o = client.get(get.clone()).await.unwrap().into_inner();
    assert_eq!(
        (o.key.as_str(), o.resource_version.clone()),
        ("/registry/pods/default/web-1", rev.to_string())
    );
    let node = client
        .get(GetRequest {
            resource: "nodes".into(),
            name: "node-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (node.namespace.as_str(), node.labels["zone"].as_str()),
        ("", "a")
    );

    let missing = client
        .get(GetRequest {
            name: "web-2".into(),
            ..get.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let no_ns = client
        .get(GetRequest {
            namespace: String::new(),
            ..get
        })
        .await
        .unwrap_err();
    assert_eq!(no_ns.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_list_sees_writes_made_just_before_it() {
    let (etcd, _proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;

    for i in 0..20 {
        let rev = put_pod(&mut ec, "default", &format!("p-{i}"), &[], "").await;
        let resp = client.list(list_req("pods")).await.unwrap().into_inner();
        assert!(resp.resource_version.parse::<u64>().unwrap() >= rev);
        assert_eq!(resp.items.len(), i + 1, "write {i} must be visible");
    }
    // A write under another prefix moves etcd's revision; an unset version
    // still answers at once at that revision, proved unchanged by etcd.
    let other = ec
        .put("/elsewhere/x", "1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision() as u64;
    let resp = client.list(list_req("pods")).await.unwrap().into_inner();
    assert!(resp.resource_version.parse::<u64>().unwrap() >= other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_older_than_waits_for_the_version_or_fails_as_too_large() {
    let (etcd, _proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;

    let rev = put_pod(&mut ec, "default", "a", &[], "").await;
    let resp = client
        .list(ListRequest {
            resource_version: rev.to_string(),
            resource_version_match: ResourceVersionMatch::NotOlderThan as i32,
            ..list_req("pods")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.items.len(), 1);

    let err = client
        .list(ListRequest {
            resource_version: (rev + 1000).to_string(),
            ..list_req("pods")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("too large resource version"),
        "{}",
        err.message()
    );
    // "0" answers at once from whatever the cache holds.
    let any = client
        .list(ListRequest {
            resource_version: "0".into(),
            ..list_req("pods")
        })
        .await
        .unwrap();
    assert_eq!(any.into_inner().items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_list_returns_the_state_at_that_version_from_the_window_or_etcd() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let first = put_pod(&mut ec, "default", "a", &[("v", "1")], "").await;
    put_pod(&mut ec, "default", "a", &[("v", "2")], "").await;
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;
    put_pod(&mut ec, "default", "b", &[], "").await;
    let exact = |rv: u64| ListRequest {
        resource_version: rv.to_string(),
        resource_version_match: ResourceVersionMatch::Exact as i32,
        ..list_req("pods")
    };
    let etcd_pages = || {
        proxy.metric(
            "watchproxy_etcd_requests_total",
            "request=\"exact_list_page\"",
        )
    };

    // Before the list, yet inside the window read from etcd's history.
    let old = client.list(exact(first)).await.unwrap().into_inner();
    assert_eq!(old.resource_version, first.to_string());
    assert_eq!(old.items.len(), 1);
    assert_eq!(old.items[0].labels["v"], "1");
    assert_eq!(etcd_pages(), 0.0, "served from the cache");

    // etcd compacts it away; the cache still shows it.
    let now = put_pod(&mut ec, "default", "c", &[], "").await;
    ec.compact(now as i64, None).await.unwrap();
    let still = client.list(exact(first)).await.unwrap().into_inner();
    assert_eq!(still.items[0].labels["v"], "1");

    // A watchproxy started now reads history only from the compaction on,
    // so it asks etcd, which no longer has the revision.
    let late = Proxy::start(&etcd.client_url).await;
    let mut late_client = late.client().await;
    wait_ready(&mut late_client, "pods").await;
    let gone = late_client.list(exact(first)).await.unwrap_err();
    assert_eq!(gone.code(), Code::OutOfRange, "{gone:?}");
    let at_compaction = late_client.list(exact(now)).await.unwrap().into_inner();
    assert_eq!(at_compaction.items.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_resources_keep_bytes_and_filter_by_key_only() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    ec.put("/blobs/one", vec![0u8, 159, 146, 150], None)
        .await
        .unwrap();
    let proxy = Proxy::start(&etcd.client_url).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "blobs").await;
    let items = client
        .list(list_req("blobs"))
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items.len(), 1);
    assert_eq!(&items[0].value[..], [0u8, 159, 146, 150]);
    let err = client
        .list(ListRequest {
            field_selector: "spec.x=1".into(),
            ..list_req("blobs")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let by_name = client
        .list(ListRequest {
            field_selector: "metadata.name=one".into(),
            ..list_req("blobs")
        })
        .await
        .unwrap();
    assert_eq!(by_name.into_inner().items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_token_this_service_did_not_seal_is_refused() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    preload(&mut ec, 5).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("continue.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let yaml =
        pods_yaml(&etcd.client_url, 64) + &format!("continue_token_key_file: {}\n", key.display());
    let shared = Config::from_yaml(&yaml).unwrap();
    let (a, b) = (
        Proxy::start_config(shared.clone()).await,
        Proxy::start_config(shared).await,
    );
    let alone = Proxy::start(&etcd.client_url).await;
    let (mut ca, mut cb, mut calone) = (a.client().await, b.client().await, alone.client().await);
    for c in [&mut ca, &mut cb, &mut calone] {
        wait_ready(c, "pods").await;
    }
    let first = |c: &mut WatchProxyClient<Channel>| {
        let mut c = c.clone();
        async move {
            let req = ListRequest {
                limit: 2,
                ..list_req("pods")
            };
            c.list(req).await.unwrap().into_inner()
        }
    };
    let next = |c: &mut WatchProxyClient<Channel>, token: String| {
        let mut c = c.clone();
        async move {
            let req = ListRequest {
                limit: 2,
                continue_token: token,
                ..list_req("pods")
            };
            c.list(req).await
        }
    };
    let page = first(&mut ca).await;
    // Replicas that share the key serve each other's pages.
    assert!(next(&mut cb, page.continue_token.clone()).await.is_ok());
    // One with a key of its own does not.
    let err = next(&mut calone, page.continue_token.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // A token rewritten to name an old revision: refused, not read from etcd.
    let (payload, _) = page.continue_token.rsplit_once('.').unwrap();
    let mut token: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    token["rv"] = 1.into();
    let forged = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap());
    let reads = a.metric(
        "watchproxy_etcd_requests_total",
        "request=\"exact_list_page\"",
    );
    for t in [
        forged.clone(),
        format!(
            "{forged}.{}",
            page.continue_token.rsplit_once('.').unwrap().1
        ),
    ] {
        let err = next(&mut ca, t).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("not one this service issued"),
            "{err:?}"
        );
    }
    assert_eq!(
        a.metric(
            "watchproxy_etcd_requests_total",
            "request=\"exact_list_page\""
        ),
        reads
    );
}
