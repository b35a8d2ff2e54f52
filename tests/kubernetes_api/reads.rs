//! Discovery, GET and LIST as the apiserver answers them, and its
//! refusals.

use serde_json::json;

use crate::common::{delete_key, put_pod, Etcd};
use crate::http::{self, get};
use crate::{kubernetes_config, kubernetes_proxy};

#[tokio::test]
async fn discovery_lists_the_resources_served_with_their_verbs() {
    let etcd = Etcd::start().await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let (status, api) = get(addr, "/api", &[]).await;
    assert_eq!((status, &api["versions"]), (200, &json!(["v1"])));
    let (_, v1) = get(addr, "/api/v1", &[]).await;
    assert_eq!(v1["kind"], "APIResourceList");
    let names: Vec<&str> = (v1["resources"].as_array().unwrap().iter())
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["pods", "nodes"],
        "raw blobs are not on Kubernetes' API"
    );
    let pods = &v1["resources"][0];
    assert_eq!(pods["verbs"], json!(["get", "list", "watch"]));
    assert_eq!(
        (&pods["kind"], &pods["namespaced"]),
        (&json!("Pod"), &json!(true))
    );
    assert_eq!(v1["resources"][1]["namespaced"], false);
    let (_, groups) = get(addr, "/apis", &[]).await;
    assert_eq!(groups["groups"], json!([]));
    let (status, version) = get(addr, "/version", &[]).await;
    assert_eq!((status, &version["major"]), (200, &json!("1")));
    let (status, missing) = get(addr, "/apis/apps/v1", &[]).await;
    assert_eq!((status, &missing["reason"]), (404, &json!("NotFound")));
}

#[tokio::test]
async fn get_and_list_show_objects_at_their_versions_as_etcd_holds_them() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    let a = put_pod(&mut c, "ns1", "a", &[("app", "web")], "n1").await;
    let b = put_pod(&mut c, "ns1", "b", &[("app", "db")], "n2").await;
    let other = put_pod(&mut c, "ns2", "c", &[("app", "web")], "n1").await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;

    let (status, pod) = get(addr, "/api/v1/namespaces/ns1/pods/a", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&pod["apiVersion"], &pod["kind"]),
        (&json!("v1"), &json!("Pod"))
    );
    assert_eq!(pod["metadata"]["resourceVersion"], a.to_string());
    assert_eq!(pod["spec"]["nodeName"], "n1");

    let (status, list) = get(addr, "/api/v1/namespaces/ns1/pods", &[]).await;
    assert_eq!((status, &list["kind"]), (200, &json!("PodList")));
    let listed: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        listed >= other,
        "a consistent list is at etcd's revision or later"
    );
    let versions: Vec<&str> = (list["items"].as_array().unwrap().iter())
        .map(|p| p["metadata"]["resourceVersion"].as_str().unwrap())
        .collect();
    assert_eq!(versions, [a.to_string(), b.to_string()]);

    let (_, web) = get(addr, "/api/v1/pods?labelSelector=app%3Dweb", &[]).await;
    let names: Vec<&str> = (web["items"].as_array().unwrap().iter())
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "c"]);
    let (_, on_n2) = get(addr, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn2", &[]).await;
    assert_eq!(on_n2["items"][0]["metadata"]["name"], "b");

    // Pages of one revision, however the store changes between them.
    let (_, first) = get(addr, "/api/v1/pods?limit=2", &[]).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    delete_key(&mut c, "/registry/pods/ns2/c").await;
    let next = format!("/api/v1/pods?limit=2&continue={token}");
    let (status, second) = get(addr, &next, &[]).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["items"][0]["metadata"]["name"], "c",
        "the page is cut from the first one's revision"
    );
    assert_eq!(
        second["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(second["metadata"].get("continue").is_none());

    let (_, meta) = get(
        addr,
        "/api/v1/namespaces/ns1/pods/a",
        &[(
            "Accept",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )],
    )
    .await;
    assert_eq!(
        (&meta["kind"], &meta["apiVersion"]),
        (&json!("PartialObjectMetadata"), &json!("meta.k8s.io/v1"))
    );
    assert_eq!(meta["metadata"]["labels"]["app"], "web");
    assert!(meta.get("spec").is_none());
}

#[tokio::test]
async fn refusals_are_the_apiservers_statuses() {
    let etcd = Etcd::start().await;
    let (_proxy, addr) = kubernetes_proxy(kubernetes_config(&etcd, "")).await;
    let (status, missing) = get(addr, "/api/v1/namespaces/ns1/pods/none", &[]).await;
    assert_eq!((status, &missing["reason"]), (404, &json!("NotFound")));
    assert_eq!(missing["message"], "pods \"none\" not found");
    assert_eq!(missing["details"], json!({"name": "none", "kind": "pods"}));

    // Namespaces are the apiserver's, not missing: kubectl asks for one
    // when it finds no object, and takes 404 as "no such namespace".
    let (status, ns) = get(addr, "/api/v1/namespaces/ns1", &[]).await;
    assert_eq!((status, &ns["reason"]), (403, &json!("Forbidden")), "{ns}");
    let (status, _) = get(addr, "/api/v1/widgets", &[]).await;
    assert_eq!(status, 404);

    let (status, bad) = get(addr, "/api/v1/pods?labelSelector=a%20in", &[]).await;
    assert_eq!(
        (status, &bad["reason"]),
        (400, &json!("BadRequest")),
        "{bad}"
    );

    let (status, invalid) = get(addr, "/api/v1/pods?resourceVersionMatch=Exact", &[]).await;
    assert_eq!(
        (status, &invalid["reason"]),
        (422, &json!("Invalid")),
        "{invalid}"
    );

    let (status, cluster) = get(addr, "/api/v1/namespaces/ns1/nodes", &[]).await;
    assert_eq!(status, 404, "nodes are not namespaced: {cluster}");

    let mut post = http::request(
        addr,
        "POST",
        "/api/v1/namespaces/ns1/pods",
        &[("Content-Length", "0")],
    )
    .await;
    let body: serde_json::Value = serde_json::from_slice(&post.body().await).unwrap();
    assert_eq!(
        (post.status, &body["reason"]),
        (405, &json!("MethodNotAllowed"))
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Kubernetes API server"),
        "{body}"
    );

    let (status, _) = get(
        addr,
        "/api/v1/pods",
        &[("Accept", "application/vnd.kubernetes.protobuf")],
    )
    .await;
    assert_eq!(status, 406);
}
