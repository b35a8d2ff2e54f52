//! What a client can make the service hold before it is identified, and
//! before its request is whole: each bound on both serve paths, with a
//! bearer token required for every call.

use std::io::Write;
use std::time::Duration;

use crate::common::*;
use crate::raw::*;
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use watchproxy::config::{Config, ServePath};
use watchproxy::pb::{ListRequest, WatchRequest};

const LIST: &str = "/watchproxy.v1.WatchProxy/List";
const WATCH: &str = "/watchproxy.v1.WatchProxy/Watch";
const TOKEN: &str = "Bearer reader-token";

/// Pods served on `path` to callers with a token only, with `limits`.
pub(crate) fn config(etcd: &Etcd, dir: &std::path::Path, path: ServePath, limits: &str) -> Config {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, "- {token: reader-token, user: reader}\n").unwrap();
    let yaml = PODS_CONFIG
        .replace("ETCD", &etcd.client_url)
        .replace("QUEUE", "64")
        .replace("max_concurrent_unary: 4096", limits)
        + &format!(
            "auth:\n  tokens_file: {}\n  allow_plaintext_tokens: true\n",
            tokens.display()
        );
    let mut config = Config::from_yaml(&yaml).unwrap();
    config.watch.serve_path = path;
    config
}

pub(crate) async fn h2_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    send
}

/// A gRPC request's head, with the token when `token`.
pub(crate) fn head(path: &str, token: bool, gzip: bool) -> http::Request<()> {
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if token {
        b = b.header("authorization", TOKEN);
    }
    if gzip {
        b = b.header("grpc-encoding", "gzip");
    }
    b.body(()).unwrap()
}

/// A message with its gRPC prefix; `compressed` marks it so.
pub(crate) fn framed(body: &[u8], compressed: bool) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(compressed as u8);
    b.put_u32(body.len() as u32);
    b.put_slice(body);
    b.freeze()
}

fn list_message() -> Vec<u8> {
    ListRequest {
        resource: "pods".into(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The gRPC status a response ends with: from its head when it has no
/// body, else from its trailers.
pub(crate) async fn status_of(response: h2::client::ResponseFuture) -> Result<tonic::Code, String> {
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .map_err(|_| "no response head within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    if let Some(code) = response.headers().get("grpc-status") {
        return Ok(tonic::Code::from_bytes(code.as_bytes()));
    }
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), body.data())
        .await
        .map_err(|_| "no end within 5 s".to_string())?
    {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.map_err(|e| e.to_string())?;
    let code = trailers.and_then(|t| t.get("grpc-status").cloned());
    Ok(tonic::Code::from_bytes(
        code.ok_or("no grpc-status")?.as_bytes(),
    ))
}

/// Sends one whole request on a new stream; its status.
pub(crate) async fn call(
    send: &mut h2::client::SendRequest<Bytes>,
    head: http::Request<()>,
    body: Bytes,
) -> Result<tonic::Code, String> {
    let mut send = send.clone().ready().await.unwrap();
    let (response, mut stream) = send.send_request(head, false).unwrap();
    stream.reserve_capacity(body.len());
    stream.send_data(body, true).unwrap();
    status_of(response).await
}

/// A served instance of each path, each on its own etcd data.
pub(crate) async fn each_path(limits: &str, test: impl AsyncFn(ServePath, &Proxy)) {
    for path in [ServePath::Fast, ServePath::Tonic] {
        let etcd = Etcd::start().await;
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::start_config(config(&etcd, dir.path(), path, limits)).await;
        let mut send = h2_client(proxy.addr).await;
        for _ in 0..100 {
            if call(
                &mut send,
                head(LIST, true, false),
                framed(&list_message(), false),
            )
            .await
                == Ok(tonic::Code::Ok)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        test(path, &proxy).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_credentials_is_refused_before_its_body_is_read() {
    each_path("max_concurrent_unary: 4096", async |path, proxy| {
        let send = h2_client(proxy.addr).await;
        for route in [LIST, WATCH] {
            // Headers only: the body never comes.
            let mut ready = send.clone().ready().await.unwrap();
            let (response, _stream) = ready
                .send_request(head(route, false, false), false)
                .unwrap();
            assert_eq!(
                status_of(response).await,
                Ok(tonic::Code::Unauthenticated),
                "{path:?} {route}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_without_a_body_take_no_list_slot() {
    each_path("max_concurrent_unary: 4", async |path, proxy| {
        // Callers with a token whose bodies never come: more than the
        // List/Get slots.
        let idle = h2_client(proxy.addr).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            let mut ready = idle.clone().ready().await.unwrap();
            held.push(ready.send_request(head(LIST, true, false), false).unwrap());
        }
        let mut send = h2_client(proxy.addr).await;
        let code = call(
            &mut send,
            head(LIST, true, false),
            framed(&list_message(), false),
        )
        .await;
        assert_eq!(code, Ok(tonic::Code::Ok), "{path:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_does_not_arrive_in_time_is_ended() {
    let limits = "max_concurrent_unary: 4096\n  request_body_timeout: 1s";
    each_path(limits, async |path, proxy| {
        let send = h2_client(proxy.addr).await;
        for route in [LIST, WATCH] {
            let mut ready = send.clone().ready().await.unwrap();
            let (response, _stream) = ready.send_request(head(route, true, false), false).unwrap();
            assert_eq!(
                status_of(response).await,
                Ok(tonic::Code::DeadlineExceeded),
                "{path:?} {route}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_their_own_limit_are_resource_exhausted_even_compressed() {
    each_path("max_concurrent_unary: 4096", async |path, proxy| {
        let mut send = h2_client(proxy.addr).await;
        // 100 KiB of selector: over the requests' 64 KiB, far under the
        // 64 MiB a response may be.
        let big = ListRequest {
            resource: "pods".into(),
            label_selector: format!("app in ({})", vec!["x"; 50_000].join(",")),
            ..Default::default()
        }
        .encode_to_vec();
        let code = call(&mut send, head(LIST, true, false), framed(&big, false)).await;
        assert_eq!(code, Ok(tonic::Code::ResourceExhausted), "{path:?} plain");

        // A small gzip body of repeated empty `fields` that decompresses
        // to 8 MiB: refused before it is decoded.
        for (route, tag) in [(LIST, 0x4a), (WATCH, 0x52)] {
            let mut inflating = list_message();
            inflating.extend(std::iter::repeat_n([tag, 0x00], 4 << 20).flatten());
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gz.write_all(&inflating).unwrap();
            let small = gz.finish().unwrap();
            assert!(small.len() < 64 * 1024);
            let code = call(&mut send, head(route, true, true), framed(&small, true)).await;
            assert_eq!(
                code,
                Ok(tonic::Code::ResourceExhausted),
                "{path:?} {route} gzip"
            );
        }
        let watch = WatchRequest {
            resource: "pods".into(),
            label_selector: format!("app in ({})", vec!["x"; 50_000].join(",")),
            ..Default::default()
        }
        .encode_to_vec();
        let code = call(&mut send, head(WATCH, true, false), framed(&watch, false)).await;
        assert_eq!(code, Ok(tonic::Code::ResourceExhausted), "{path:?} watch");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bytes_hold_their_window_until_the_request_is_whole() {
    // The service's own server: the connection's window bounds what all
    // its unfinished requests hold. (h2 gives credit back as its body is
    // read.)
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        &etcd,
        dir.path(),
        ServePath::Fast,
        "max_concurrent_unary: 4096",
    );
    let proxy = Proxy::start_config(config).await;
    let mut raw = Raw::connect(proxy.addr).await;
    // Past the server's first frames, which give the connection its window.
    raw.send(PING, 0, 0, b"started!").await;
    while !matches!(raw.frame().await, Some((PING, ACK, _, _))) {}
    let mut fields = grpc_fields(WATCH);
    fields.push(("authorization", TOKEN));
    let block = literal_block(&fields);
    // 24 requests, each of a message of 60,000 bytes of which 30,000 come:
    // 720,000 bytes, more than half the connection's window.
    let mut partial = vec![0u8];
    partial.extend_from_slice(&60_000u32.to_be_bytes());
    partial.resize(30_000, 0);
    for i in 0..24u32 {
        let id = 2 * i + 1;
        raw.send(HEADERS, END_HEADERS, id, &block).await;
        for chunk in partial.chunks(15_000) {
            raw.send(DATA, 0, id, chunk).await;
        }
    }
    raw.send(PING, 0, 0, b"barrier!").await;
    loop {
        let (kind, flags, stream, payload) = raw.frame().await.expect("the connection stays");
        assert_ne!(
            kind, WINDOW_UPDATE,
            "credit given back on stream {stream} before its request was whole"
        );
        assert_ne!(kind, GOAWAY, "{payload:?}");
        if kind == PING && flags & ACK != 0 {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_makes_the_server_reset_stream_after_stream_is_sent_away() {
    // MadeYouReset (CVE-2025-8671): each stream is opened with a request
    // the server must reset (a `te` other than trailers: a stream
    // PROTOCOL_ERROR on both paths; h2 takes a WINDOW_UPDATE of 0, another
    // way in, as an error of the whole connection).
    each_path("max_concurrent_unary: 4096", async |path, proxy| {
        let mut raw = Raw::connect(proxy.addr).await;
        let mut fields = grpc_fields(LIST);
        fields.retain(|(n, _)| *n != "te");
        fields.push(("te", "gzip"));
        let block = literal_block(&fields);
        let mut flood = Vec::new();
        for i in 0..1500u32 {
            flood.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &block));
        }
        use tokio::io::AsyncWriteExt;
        // The server may close the connection before all of it is written.
        let _ = raw.tcp.write_all(&flood).await;
        let mut goaway = None;
        while let Some((kind, _, _, payload)) = raw.frame().await {
            if kind == GOAWAY {
                goaway = Some(code(&payload[4..]));
            }
        }
        assert_eq!(goaway, Some(0xb), "{path:?}: ENHANCE_YOUR_CALM");
        if path == ServePath::Fast {
            let sent_away = proxy.metric(
                "watchproxy_http2_connections_sent_away_total",
                "bound=\"resets\"",
            );
            assert!(sent_away >= 1.0, "counted: {sent_away}");
            let goaways = proxy.metric(
                "watchproxy_http2_goaways_total",
                "direction=\"sent\",code=\"ENHANCE_YOUR_CALM\"",
            );
            let resets = proxy.metric(
                "watchproxy_http2_resets_total",
                "direction=\"sent\",code=\"PROTOCOL_ERROR\"",
            );
            assert!(goaways >= 1.0 && resets >= 1000.0, "{goaways} {resets}");
        }
    })
    .await;
}
