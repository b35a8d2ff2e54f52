//! The Python informer's handlers as client-go's AddEventHandler has them,
//! its listers and its shared informers, and the asyncio informer's
//! readers, against a real etcd and watchproxy (`tests/python/` has the
//! scripts that drive them).

use crate::common::*;

/// Pods `<prefix>0..n` in `namespace`, app=web on node-0.
async fn put_web_pods(c: &mut etcd_client::Client, namespace: &str, prefix: &str, n: usize) {
    for i in 0..n {
        let name = format!("{prefix}{i}");
        put_pod(c, namespace, &name, &[("app", "web")], "node-0").await;
    }
}

/// Runs `tests/python/<script>` against watchproxy on `etcd`: what it
/// printed.
async fn drive(script: &str, etcd: &Etcd) -> serde_json::Value {
    let proxy = Proxy::start(&etcd.client_url).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::task::block_in_place(|| {
        (python3().arg(script))
            .arg(proxy.addr.to_string())
            .arg(&etcd.client_url)
            .output()
            .unwrap()
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    eprintln!("{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_run_off_the_watch_and_a_late_or_slow_one_ends_with_every_object() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    for i in 0..5 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        put_pod(
            &mut c,
            "ns-a",
            &format!("p{i}"),
            &[("app", app)],
            &format!("node-{}", i % 3),
        )
        .await;
    }
    put_web_pods(&mut c, "ns-b", "q", 3).await;
    let r = drive("informer_handlers.py", &etcd).await;
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&r["first_list"]),
        ["p0", "p1", "p2", "p3", "p4", "q0", "q1", "q2"]
    );
    // Had the slow handler run on the watch's thread, it would have made
    // every call (the list's 8, the burst's and 2 more) before the store
    // took the marker.
    let changes = 8 + r["burst"].as_u64().unwrap() + 2;
    let slow_then = r["slow_calls_when_fast_done"].as_u64().unwrap();
    assert!(
        slow_then < changes,
        "the slow handler held the watch up: {r}"
    );
    assert!(r["slow_fell_behind"].as_u64().unwrap() >= 1, "{r}");
    // Caught up with fewer calls than there were changes: the difference.
    assert!(r["slow_calls"].as_u64().unwrap() < changes, "{r}");
    assert_eq!(r["late_adds"], r["store"].as_u64().unwrap() - 1, "{r}");
    assert_eq!(
        names(&r["web_adds"]),
        ["p0", "p2", "p4", "q0", "q1", "q2"],
        "{r}"
    );
    assert_eq!(
        names(&r["lister_ns_a_web"]),
        ["marker", "p0", "p2", "p4", "p6", "p8"],
        "{r}"
    );
    assert_eq!(
        names(&r["lister_every_db"]),
        ["p1", "p3", "p5", "p7", "p9"],
        "{r}"
    );
    assert_eq!(r["lister_get"], "after");
    assert_eq!(r["lister_missing"], true);
    assert!(names(&r["on_node_0"]).contains(&"marker".to_owned()), "{r}");
}

/// `watchproxy.aio`'s readers (`tests/python/informer_aio.py`): a slow
/// one falls behind without holding up the informer or the others and
/// catches up with the store; one made after sync gets every object once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aio_readers_never_hold_the_informer_and_a_late_or_slow_one_ends_with_every_object() {
    let etcd = Etcd::start().await;
    let mut c = etcd.client().await;
    put_web_pods(&mut c, "ns-b", "q", 5).await;
    let r = drive("informer_aio.py", &etcd).await;
    assert_eq!(
        r["first_list"],
        serde_json::json!(["q0", "q1", "q2", "q3", "q4"])
    );
    // Had the slow reader held the informer up, it would have read every
    // change before the fast one saw the marker.
    let changes = r["changes"].as_u64().unwrap();
    assert!(
        r["slow_calls_when_fast_done"].as_u64().unwrap() < changes,
        "{r}"
    );
    assert!(r["slow_fell_behind"].as_u64().unwrap() >= 1, "{r}");
    assert!(
        r["slow_calls"].as_u64().unwrap() < changes,
        "the difference, not every change: {r}"
    );
    assert_eq!(r["late_adds"], r["store"].as_u64().unwrap() - 1, "{r}");
}
