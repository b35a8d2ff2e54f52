//! WATCH as informers read it: lines of events over HTTP/1.1 chunks,
//! bookmarks, the initial events of a WatchList, and 410 for a version
//! too old.

use serde_json::json;

use crate::common::{compact_all, delete_key, put_pod, Etcd};
use crate::http::{self, get};
use crate::{kubernetes_config, kubernetes_proxy};

#[tokio::test]
async fn a_watch_from_a_lists_version_sends_each_change_as_a_line() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    put_pod(&mut c, "ns1", "a", &[], "n1").await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let (_, list) = get(addr, "/api/v1/namespaces/ns1/pods", &[]).await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let target = format!(
        "/api/v1/namespaces/ns1/pods?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
    );
    let mut watch = http::request(addr, "GET", &target, &[]).await;
    assert_eq!(watch.status, 200);
    assert_eq!(watch.header("content-type"), Some("application/json"));
    let added = put_pod(&mut c, "ns1", "b", &[], "n1").await;
    let modified = put_pod(&mut c, "ns1", "a", &[("x", "y")], "n1").await;
    let deleted = delete_key(&mut c, "/registry/pods/ns1/b").await;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let line = watch.next_line().await.unwrap();
        if line["type"] == "BOOKMARK" {
            assert_eq!(line["object"]["kind"], "Pod");
            continue;
        }
        let object = &line["object"];
        seen.push((
            line["type"].as_str().unwrap().to_owned(),
            object["metadata"]["name"].as_str().unwrap().to_owned(),
            object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_owned(),
        ));
    }
    let expected = [
        ("ADDED", "b", added),
        ("MODIFIED", "a", modified),
        ("DELETED", "b", deleted),
    ];
    let expected: Vec<_> = (expected.iter())
        .map(|(t, n, v)| (t.to_string(), n.to_string(), v.to_string()))
        .collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_watch_list_sends_the_state_then_a_bookmark_that_ends_it() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    for name in ["a", "b", "c"] {
        put_pod(&mut c, "ns1", name, &[], "n1").await;
    }
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let target = "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let mut watch = http::request(addr, "GET", target, &[]).await;
    let mut names = Vec::new();
    let end = loop {
        let line = watch.next_line().await.unwrap();
        match line["type"].as_str().unwrap() {
            "ADDED" => names.push(
                line["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            ),
            "BOOKMARK" => break line,
            other => panic!("{other}: {line}"),
        }
    };
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(
        end["object"]["metadata"]["annotations"],
        json!({"k8s.io/initial-events-end": "true"})
    );
    assert_eq!(
        (&end["object"]["apiVersion"], &end["object"]["kind"]),
        (&json!("v1"), &json!("Pod"))
    );
}

#[tokio::test]
async fn a_version_too_old_is_an_error_event_with_410_expired() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    for i in 0..5 {
        put_pod(&mut c, "ns1", &format!("p{i}"), &[], "n1").await;
    }
    compact_all(&mut c).await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let mut watch = http::request(
        addr,
        "GET",
        "/api/v1/pods?watch=true&resourceVersion=2",
        &[],
    )
    .await;
    assert_eq!(
        watch.status, 200,
        "the apiserver starts the watch, then ends it"
    );
    let line = watch.next_line().await.unwrap();
    assert_eq!(line["type"], "ERROR", "{line}");
    assert_eq!(
        (&line["object"]["code"], &line["object"]["reason"]),
        (&json!(410), &json!("Expired"))
    );
    assert!(
        watch.next_line().await.is_none(),
        "the watch ends after its error"
    );
}

#[tokio::test]
async fn a_watch_ends_when_its_timeout_passes() {
    let etcd = Etcd::start().await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let (_, list) = get(addr, "/api/v1/pods", &[]).await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let target = format!("/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let mut watch = http::request(addr, "GET", &target, &[]).await;
    assert!(watch.next_line().await.is_none());
}
