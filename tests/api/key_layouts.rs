//! Resources whose keys are not laid out like Kubernetes': `key_layout`
//! says where the namespace and name are, and List, Get and Watch serve
//! them, from the cache and from etcd; keys that do not fit are counted
//! and skipped. Label selectors take Kubernetes' numeric operators.

use crate::common::*;
use watchproxy::config::Config;
use watchproxy::pb::{self, EventType, GetRequest, ListRequest};

const CONFIG: &str = r#"
etcd:
  endpoints: ["ETCD"]
  request_timeout: 2s
watch:
  bookmark_interval: 1s
resources:
  - name: items
    prefix: /stores
    key_layout: "tenants/{namespace}/items/{name...}"
  - name: specs
    prefix: /specs
    namespaced: false
    key_layout: "{name}/spec"
"#;

fn item(n: u32) -> String {
    serde_json::json!({"metadata": {"labels": {"n": n.to_string()}}}).to_string()
}

fn names(items: &[pb::Object]) -> Vec<String> {
    items
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect()
}

async fn list(
    client: &mut pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
    req: ListRequest,
) -> Vec<pb::Object> {
    client.list(req).await.unwrap().into_inner().items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_any_layout_are_listed_got_and_watched() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for (key, n) in [
        ("/stores/tenants/a/items/x", 1),
        ("/stores/tenants/a/items/dir/y", 2),
        ("/stores/tenants/b/items/z", 3),
        // Not this layout: counted and skipped.
        ("/stores/other/q", 4),
        ("/stores/tenants/a/things/w", 5),
        ("/specs/web/spec", 6),
        ("/specs/web/status", 7),
    ] {
        ec.put(key, item(n), None).await.unwrap();
    }
    let before_last = ec
        .put("/stores/tenants/a/items/late", item(8), None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision() as u64
        - 1;
    let config = Config::from_yaml(&CONFIG.replace("ETCD", &etcd.client_url)).unwrap();
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "items").await;
    wait_ready(&mut client, "specs").await;

    let items = |namespace: &str| ListRequest {
        resource: "items".into(),
        namespace: namespace.into(),
        ..Default::default()
    };
    let all = list(&mut client, items("")).await;
    assert_eq!(names(&all), ["a/dir/y", "a/late", "a/x", "b/z"]);
    assert_eq!(all[0].key, "/stores/tenants/a/items/dir/y");
    assert_eq!(
        names(&list(&mut client, items("a")).await),
        ["a/dir/y", "a/late", "a/x"]
    );
    // Read from etcd: a version before the cache's first list.
    let from_etcd = ListRequest {
        resource_version: before_last.to_string(),
        resource_version_match: pb::ResourceVersionMatch::Exact as i32,
        ..items("a")
    };
    let page = client.list(from_etcd).await.unwrap().into_inner();
    assert_eq!(names(&page.items), ["a/dir/y", "a/x"]);
    let specs = ListRequest {
        resource: "specs".into(),
        ..Default::default()
    };
    assert_eq!(names(&list(&mut client, specs).await), ["/web"]);
    assert_eq!(
        proxy.metric("watchproxy_undecodable_values_total", r#"resource="items""#),
        2.0
    );
    assert_eq!(
        proxy.metric("watchproxy_undecodable_values_total", r#"resource="specs""#),
        1.0
    );

    // A name with slashes is got by its name.
    let got = client
        .get(GetRequest {
            resource: "items".into(),
            namespace: "a".into(),
            name: "dir/y".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.key, "/stores/tenants/a/items/dir/y");

    // Watches by namespace and by name see their own objects only.
    let rv = list_version(&mut client, "items", "").await.to_string();
    let mut in_a = client
        .watch(pb::WatchRequest {
            namespace: "a".into(),
            ..watch_req("items", &rv)
        })
        .await
        .unwrap()
        .into_inner();
    let mut one = client
        .watch(pb::WatchRequest {
            namespace: "a".into(),
            name: "dir/y".into(),
            ..watch_req("items", &rv)
        })
        .await
        .unwrap()
        .into_inner();
    ec.put("/stores/tenants/b/items/dir/y", item(9), None)
        .await
        .unwrap();
    ec.put("/stores/tenants/a/items/new/deep/one", item(10), None)
        .await
        .unwrap();
    ec.put("/stores/tenants/a/items/dir/y", item(11), None)
        .await
        .unwrap();
    let seen: Vec<_> = take_events(&mut in_a, 2)
        .await
        .iter()
        .map(|e| (summary(e).0, summary(e).1))
        .collect();
    assert_eq!(
        seen,
        [
            (EventType::Added, "a/new/deep/one".to_string()),
            (EventType::Modified, "a/dir/y".to_string()),
        ]
    );
    let e = take_events(&mut one, 1).await;
    assert_eq!(summary(&e[0]).1, "a/dir/y");
    assert_eq!(summary(&e[0]).0, EventType::Modified);

    // Numeric label operators, evaluated by the cache.
    let numeric = ListRequest {
        label_selector: "n>2,n<10".into(),
        ..items("")
    };
    assert_eq!(
        names(&list(&mut client, numeric).await),
        ["a/late", "b/dir/y", "b/z"]
    );
}

#[test]
fn a_layout_that_does_not_fit_the_resource_is_refused_at_start() {
    for (layout, namespaced, why) in [
        ("{name}", "true", "holds no {namespace}"),
        ("{namespace}/{name}", "false", "namespaced: false"),
        ("{namespace}/{name...}/x", "true", "comes last"),
        ("a/{nam}", "false", "neither fixed text"),
    ] {
        let yaml = format!(
            "etcd: {{endpoints: [\"http://127.0.0.1:1\"]}}\nresources:\n  - name: r\n    prefix: /r\n    namespaced: {namespaced}\n    key_layout: \"{layout}\"\n"
        );
        let e = Config::from_yaml(&yaml).unwrap_err().to_string();
        assert!(e.contains(why), "{layout}: {e}");
    }
}
