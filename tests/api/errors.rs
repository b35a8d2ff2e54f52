//! Bad input gets a clear status, and an unreachable etcd gets UNAVAILABLE
//! instead of a hang.

use std::time::{Duration, Instant};

use crate::common::*;
use tonic::Code;
use watchproxy::pb::{GetRequest, ListRequest, ResourceVersionMatch, WatchRequest};

fn list(resource: &str) -> ListRequest {
    ListRequest {
        resource: resource.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_status_a_client_can_act_on() {
    let (etcd, _proxy, mut client) = start_ready().await;

    let lists = [
        (
            list("secrets"),
            Code::NotFound,
            "configured resources: blobs, nodes, pods",
        ),
        (
            ListRequest {
                label_selector: "app in (a".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "label selector",
        ),
        (
            ListRequest {
                label_selector: "app=a,,b=c".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "expected a label key",
        ),
        (
            ListRequest {
                field_selector: "spec.color=red".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "allowed: metadata.name, metadata.namespace, spec.nodeName, status.phase",
        ),
        (
            ListRequest {
                resource_version: "abc".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "invalid resource version",
        ),
        (
            ListRequest {
                resource_version: "-5".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "invalid resource version",
        ),
        (
            ListRequest {
                limit: -1,
                ..list("pods")
            },
            Code::InvalidArgument,
            "limit",
        ),
        (
            ListRequest {
                continue_token: "garbage!".into(),
                ..list("pods")
            },
            Code::InvalidArgument,
            "continue token",
        ),
        (
            ListRequest {
                resource_version_match: 9,
                ..list("pods")
            },
            Code::InvalidArgument,
            "resource_version_match",
        ),
        (
            ListRequest {
                resource_version_match: ResourceVersionMatch::Exact as i32,
                ..list("pods")
            },
            Code::InvalidArgument,
            "EXACT",
        ),
    ];
    for (req, code, needle) in lists {
        let err = client.list(req.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{req:?}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{req:?}: {:?} lacks {needle:?}",
            err.message()
        );
    }

    let token = {
        let mut c = etcd.client().await;
        for i in 0..3 {
            put_pod(&mut c, "ns", &format!("p{i}"), &[], "").await;
        }
        client
            .list(ListRequest {
                limit: 1,
                ..list("pods")
            })
            .await
            .unwrap()
            .into_inner()
            .continue_token
    };
    let other = client
        .list(ListRequest {
            continue_token: token.clone(),
            ..list("nodes")
        })
        .await
        .unwrap_err();
    assert_eq!(
        other.code(),
        Code::InvalidArgument,
        "a token is bound to its resource"
    );
    let with_rv = client
        .list(ListRequest {
            continue_token: token,
            resource_version: "5".into(),
            ..list("pods")
        })
        .await
        .unwrap_err();
    assert_eq!(with_rv.code(), Code::InvalidArgument);

    let gets = [
        (
            GetRequest {
                resource: "nope".into(),
                name: "x".into(),
                ..Default::default()
            },
            Code::NotFound,
        ),
        (
            GetRequest {
                resource: "pods".into(),
                namespace: "ns".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            GetRequest {
                resource: "pods".into(),
                namespace: "ns".into(),
                name: "p0".into(),
                resource_version: "x".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ];
    for (req, code) in gets {
        assert_eq!(
            client.get(req.clone()).await.unwrap_err().code(),
            code,
            "{req:?}"
        );
    }

    let watches = [
        (watch_req("nope", ""), Code::NotFound),
        (
            WatchRequest {
                label_selector: "=x".into(),
                ..watch_req("pods", "")
            },
            Code::InvalidArgument,
        ),
        (
            WatchRequest {
                field_selector: "spec.nodeName".into(),
                ..watch_req("pods", "")
            },
            Code::InvalidArgument,
        ),
        (watch_req("pods", "1.5"), Code::InvalidArgument),
        (
            WatchRequest {
                timeout_seconds: -1,
                ..watch_req("pods", "")
            },
            Code::InvalidArgument,
        ),
    ];
    for (req, code) in watches {
        assert_eq!(
            client.watch(req.clone()).await.unwrap_err().code(),
            code,
            "{req:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_requests_fail_with_unavailable_instead_of_hanging() {
    // A port nothing listens on.
    let dead = format!(
        "http://127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let proxy = Proxy::start(&dead).await;
    let mut client = proxy.client().await;
    for rv in ["", "0", "10"] {
        let started = Instant::now();
        let err = client
            .list(ListRequest {
                resource_version: rv.into(),
                ..list("pods")
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "rv {rv:?}: {err:?}");
        assert!(err.message().contains("not ready"), "{}", err.message());
        assert!(started.elapsed() < Duration::from_secs(10));
        let err = client.watch(watch_req("pods", rv)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "rv {rv:?}: {err:?}");
    }
}
