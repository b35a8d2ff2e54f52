//! The service's own HTTP/2 server against clients it did not write: h2's
//! client with small flow-control windows and a client that stops reading,
//! tonic sending a header block in CONTINUATION frames, and frames written
//! by hand (padding, priority, and what breaks the protocol).

use std::time::Duration;

use crate::common::*;
use crate::raw::{request_block, Raw};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use watchproxy::pb::{EventType, ListRequest, ListResponse, WatchEvent, WatchRequest};

const WATCH: &str = "/watchproxy.v1.WatchProxy/Watch";
const LIST: &str = "/watchproxy.v1.WatchProxy/List";

/// A gRPC message with its prefix.
fn grpc_message(m: &impl Message) -> Bytes {
    let body = m.encode_to_vec();
    let mut b = BytesMut::with_capacity(5 + body.len());
    b.put_u8(0);
    b.put_u32(body.len() as u32);
    b.put_slice(&body);
    b.freeze()
}

/// The whole messages at the front of `buf`.
fn take_messages<M: Message + Default>(buf: &mut BytesMut) -> Vec<M> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        buf.advance(5);
        out.push(M::decode(buf.split_to(len)).expect("a whole message"));
    }
    out
}

fn grpc_request(path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

async fn h2_client(addr: std::net::SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// Sends one gRPC request on a new stream.
async fn call(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    message: &impl Message,
) -> h2::RecvStream {
    let mut send = send.clone().ready().await.unwrap();
    let (response, mut body) = send.send_request(grpc_request(path), false).unwrap();
    body.send_data(grpc_message(message), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("a response head within 10 s")
        .unwrap();
    assert_eq!(response.status(), 200);
    response.into_body()
}

/// Reads until `n` messages have arrived, giving the window back as it
/// reads.
async fn read_messages<M: Message + Default>(body: &mut h2::RecvStream, n: usize) -> Vec<M> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("data within 10 s")
            .expect("the stream goes on")
            .unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        out.extend(take_messages::<M>(&mut buf));
    }
    assert!(buf.is_empty(), "messages end where frames end");
    out
}

fn names(events: &[WatchEvent]) -> Vec<String> {
    events.iter().map(|e| summary(e).1).collect()
}

/// A watchproxy in front of an etcd holding `n` pods of a few hundred
/// bytes each, its cache past them; their names, sorted.
async fn with_pods(n: usize) -> (Etcd, Proxy, Vec<String>) {
    let (etcd, proxy, _) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut names = Vec::new();
    for i in 0..n {
        put_pod(
            &mut ec,
            "ns",
            &format!("p{i:03}"),
            &[("app", "web")],
            "node-1",
        )
        .await;
        names.push(format!("ns/p{i:03}"));
    }
    names.sort();
    list_version(&mut proxy.client().await, "pods", "").await;
    (etcd, proxy, names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_cut_to_a_small_window_and_arrives_whole() {
    let (etcd, proxy, all) = with_pods(200).await;
    let mut ec = etcd.client().await;

    // A window smaller than one event: every message crosses frames.
    let mut send = h2_client(proxy.addr, 100).await;
    let request = WatchRequest {
        send_initial_events: true,
        allow_bookmarks: true,
        ..watch_req("pods", "")
    };
    let mut body = call(&mut send, WATCH, &request).await;
    let initial: Vec<WatchEvent> = read_messages(&mut body, 201).await;
    let (added, end) = initial.split_at(200);
    assert!(added.iter().all(|e| e.r#type == EventType::Added as i32));
    let mut got = names(added);
    got.sort();
    assert_eq!(got, all);
    assert!(end[0].initial_events_end);

    let r = put_pod(&mut ec, "ns", "late", &[], "node-1").await;
    let live: Vec<WatchEvent> = read_messages(&mut body, 1).await;
    assert_eq!(summary(&live[0]), (EventType::Added, "ns/late".into(), r));
}

/// Live changes framed for a steady watch straight from its connection's
/// inbox take room from its stream's window as queued ones do: a client
/// that stops reading is sent its window's worth and no more (h2's client
/// ends the stream on a byte past it), and the rest once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_sent_straight_to_a_steady_watch_keep_to_its_window() {
    let (etcd, proxy, _) = start_ready().await;
    let mut ec = etcd.client().await;
    let mut send = h2_client(proxy.addr, 4096).await;
    let mut body = call(&mut send, WATCH, &watch_req("pods", "")).await;
    let first = put_pod(&mut ec, "ns", "first", &[], "node-1").await;
    let live: Vec<WatchEvent> = read_messages(&mut body, 1).await;
    assert_eq!(summary(&live[0]).2, first);

    // About three windows' worth while the client reads nothing.
    let mut written = Vec::new();
    for i in 0..30 {
        let name = format!("p{i:02}");
        put_pod(&mut ec, "ns", &name, &[("app", "web")], "node-1").await;
        written.push(format!("ns/{name}"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events: Vec<WatchEvent> = read_messages(&mut body, 30).await;
    assert_eq!(names(&events), written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waits_for_the_connection_window_a_stalled_watch_filled() {
    let (_etcd, proxy, all) = with_pods(500).await;

    // The default windows (64 KiB), and a watch whose initial state is
    // larger, left unread: it fills the connection's window.
    let mut send = h2_client(proxy.addr, 65_535).await;
    let request = WatchRequest {
        send_initial_events: true,
        ..watch_req("pods", "")
    };
    let mut watch = call(&mut send, WATCH, &request).await;
    for _ in 0..100 {
        if watch.flow_control().available_capacity() <= 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = watch.flow_control().available_capacity();
    assert!(
        left <= 0,
        "the watch filled its window within 5 s ({left} bytes left)"
    );
    // A List on the same connection gets its head, but its items wait.
    let list = ListRequest {
        resource: "pods".into(),
        ..Default::default()
    };
    let mut listed = call(&mut send, LIST, &list).await;
    let waiting = tokio::time::timeout(Duration::from_millis(300), listed.data()).await;
    assert!(waiting.is_err(), "the connection window is full");

    // Reading gives the room back, and both go on. (Both are read: the
    // List's data takes the connection's window too.)
    let (initial, page) = tokio::join!(
        // The initial state and the bookmark that ends it.
        read_messages::<WatchEvent>(&mut watch, 501),
        read_messages::<ListResponse>(&mut listed, 1)
    );
    let mut got = names(&initial[..500]);
    got.sort();
    assert_eq!(got, all);
    assert!(initial[500].initial_events_end);
    assert_eq!(page[0].items.len(), 500);
    let trailers = listed.trailers().await.unwrap().expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_limit_are_refused_and_the_connection_serves_on() {
    let (_etcd, _proxy, mut client) = start_ready().await;
    // Larger than a frame: tonic sends the block in CONTINUATION frames.
    let mut request = tonic::Request::new(ListRequest {
        resource: "pods".into(),
        ..Default::default()
    });
    let big = "x".repeat(20_000);
    request.metadata_mut().insert("x-big", big.parse().unwrap());
    let status = client.list(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("headers"), "{status:?}");
    // The table the two sides share is intact: the next call is read.
    let listed = client
        .list(ListRequest {
            resource: "pods".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!listed.into_inner().resource_version.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padded_frames_with_priority_are_read_and_broken_ones_end_the_connection() {
    let (etcd, proxy, _) = start_ready().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "node-1").await;
    let mut client = proxy.client().await;
    list_version(&mut client, "pods", "").await;

    let mut raw = Raw::connect(proxy.addr).await;
    // HEADERS padded and with a priority; DATA padded.
    let mut headers = vec![3];
    headers.extend_from_slice(&[0, 0, 0, 0, 15]);
    headers.extend(request_block(LIST));
    headers.extend_from_slice(&[0; 3]);
    raw.send(0x1, 0x4 | 0x8 | 0x20, 1, &headers).await;
    let message = grpc_message(&ListRequest {
        resource: "pods".into(),
        ..Default::default()
    });
    let mut data = vec![7];
    data.extend_from_slice(&message);
    data.extend_from_slice(&[0; 7]);
    raw.send(0x0, 0x1 | 0x8, 1, &data).await;
    let mut decoder = loona_hpack::Decoder::new();
    let mut body = BytesMut::new();
    let status = loop {
        let (kind, flags, stream, payload) = raw.frame().await.expect("an answer");
        match (kind, stream) {
            (0x0, 1) => body.extend_from_slice(&payload),
            (0x1, 1) if flags & 0x1 != 0 => {
                let fields = decoder.decode(&payload).unwrap();
                break fields
                    .into_iter()
                    .find(|(n, _)| n == b"grpc-status")
                    .map(|(_, v)| v);
            }
            (0x1, 1) => {
                let fields = decoder.decode(&payload).unwrap();
                assert!(fields.contains(&(b":status".to_vec(), b"200".to_vec())));
            }
            _ => {}
        }
    };
    assert_eq!(status.as_deref(), Some(&b"0"[..]));
    let pages: Vec<ListResponse> = take_messages(&mut body);
    assert_eq!(summary_names(&pages[0]), ["ns/a"]);

    // A frame larger than the server allows ends the connection with
    // FRAME_SIZE_ERROR.
    raw.send(0x0, 0, 1, &vec![0; 20_000]).await;
    assert_eq!(raw.goaway().await, 0x6);

    // A request on an even stream, which only a server may open:
    // PROTOCOL_ERROR.
    let mut raw = Raw::connect(proxy.addr).await;
    raw.send(0x1, 0x4 | 0x1, 2, &request_block(LIST)).await;
    assert_eq!(raw.goaway().await, 0x1);

    // Not HTTP/2 at all.
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_opens_streams_only_to_reset_them_is_sent_away() {
    let (_etcd, proxy, _) = start_ready().await;
    let mut raw = Raw::connect(proxy.addr).await;
    let block = request_block(LIST);
    // Requests whose bodies never come, each reset at once.
    let mut flood = Vec::new();
    for i in 0..1100u32 {
        let id = 2 * i + 1;
        for (kind, flags, payload) in [(0x1, 0x4, &block[..]), (0x3, 0, &8u32.to_be_bytes()[..])] {
            flood.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
            flood.extend_from_slice(&[kind, flags]);
            flood.extend_from_slice(&id.to_be_bytes());
            flood.extend_from_slice(payload);
        }
    }
    raw.tcp.write_all(&flood).await.unwrap();
    assert_eq!(raw.goaway().await, 0xb, "ENHANCE_YOUR_CALM");
    // Others are served as before.
    let mut client = proxy.client().await;
    assert!(list_version(&mut client, "pods", "").await > 0);
}

fn summary_names(page: &ListResponse) -> Vec<String> {
    page.items
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watches_on_one_connection_each_get_their_whole_initial_state() {
    let (_etcd, proxy, all) = with_pods(2000).await;
    let mut client = proxy.client().await;
    let request = WatchRequest {
        send_initial_events: true,
        allow_bookmarks: true,
        ..watch_req("pods", "")
    };
    let mut streams = Vec::new();
    for _ in 0..10 {
        streams.push(client.watch(request.clone()).await.unwrap().into_inner());
    }
    let states = futures::future::join_all(streams.iter_mut().map(|s| async {
        let mut names = Vec::new();
        loop {
            let e = next_event(s).await.unwrap().expect("the stream goes on");
            if e.initial_events_end {
                return names;
            }
            names.push(summary(&e).1);
        }
    }))
    .await;
    for mut names in states {
        names.sort();
        assert_eq!(names, all);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_makes_the_server_hold_at_most_the_bound() {
    // 600 pods of a few hundred bytes: each List answer is ~200 KB.
    let (_etcd, proxy, _) = with_pods(600).await;
    let held = || proxy.metric("watchproxy_http2_held_response_bytes", "");
    // Windows of 0: nothing of an answer's body can be sent.
    let mut raw = Raw::connect_with(proxy.addr, &[(0x4, 0)]).await;
    let message = grpc_message(&ListRequest {
        resource: "pods".into(),
        ..Default::default()
    });
    for i in 0..20u32 {
        let id = 2 * i + 1;
        raw.send(0x1, 0x4, id, &request_block(LIST)).await;
        raw.send(0x0, 0x1, id, &message).await;
    }
    // Past the bound (1 MiB), the calls stop producing.
    wait_until("the connection holds 1 MiB", || held() >= 1024.0 * 1024.0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let page = 600.0 * 400.0;
    assert!(
        held() < 1024.0 * 1024.0 + page,
        "held {} bytes: more than the bound and one message",
        held()
    );
    // Half the calls reset, their answers unsent, and room given: the
    // other answers go out, and nothing stays held.
    for i in 0..10u32 {
        raw.send(0x3, 0, 4 * i + 1, &8u32.to_be_bytes()).await;
    }
    raw.send(0x4, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]).await;
    raw.send(0x8, 0, 0, &0x7fff_0000u32.to_be_bytes()).await;
    let mut ended = std::collections::BTreeSet::new();
    while ended.len() < 10 {
        let (kind, flags, stream, _) = raw.frame().await.expect("the answers go on");
        if kind == 0x1 && flags & 0x1 != 0 {
            ended.insert(stream);
        }
    }
    assert!(ended.iter().all(|s| s % 4 == 3), "{ended:?}");
    wait_until("nothing is held", || held() == 0.0).await;
    // The connection serves on.
    raw.send(0x1, 0x4, 41, &request_block(LIST)).await;
    raw.send(0x0, 0x1, 41, &message).await;
    loop {
        let (kind, flags, stream, _) = raw.frame().await.expect("an answer");
        if (kind, stream) == (0x1, 41) && flags & 0x1 != 0 {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_frame_of_many_entries_costs_what_one_entry_costs() {
    // Each INITIAL_WINDOW_SIZE entry once walked every stream: one 16 KiB
    // frame on a connection of thousands of streams was millions of
    // updates. A frame now applies its last value, once. Timed as a ratio
    // against a frame of one entry on the same connection, best of three.
    let etcd = Etcd::start().await;
    let limits = "max_concurrent_unary: 4096\n  request_body_timeout: 1h";
    let proxy = Proxy::start_config(pods_config_with_limits(&etcd.client_url, limits)).await;
    wait_ready(&mut proxy.client().await, "pods").await;
    let mut raw = Raw::connect(proxy.addr).await;
    // 5,000 streams whose requests never come (within the hour they are
    // given): each one is walked.
    let mut opening = Vec::new();
    for i in 0..5000u32 {
        opening.extend(crate::raw::frame(
            0x1,
            0x4,
            2 * i + 1,
            &request_block(WATCH),
        ));
    }
    raw.tcp.write_all(&opening).await.unwrap();
    let mut round_trip = async |settings: &[u8]| {
        let started = std::time::Instant::now();
        raw.send(0x4, 0, 0, settings).await;
        raw.send(0x6, 0, 0, b"settled!").await;
        loop {
            let (kind, flags, _, payload) = raw.frame().await.expect("the connection stays");
            assert_ne!(kind, 0x7, "GOAWAY {payload:?}");
            if kind == 0x6 && flags & 0x1 != 0 && &payload[..] == b"settled!" {
                return started.elapsed();
            }
        }
    };
    let entry = |v: u32| {
        let mut e = vec![0, 4];
        e.extend_from_slice(&v.to_be_bytes());
        e
    };
    let mut one = Duration::MAX;
    let mut many = Duration::MAX;
    for round in 0..3u32 {
        one = one.min(round_trip(&entry(70_000 + round)).await);
        let frame: Vec<u8> = (0..2730u32).flat_map(|i| entry(60_000 + i)).collect();
        many = many.min(round_trip(&frame).await);
    }
    let ratio = many.as_secs_f64() / one.as_secs_f64();
    assert!(
        ratio < 20.0,
        "2,730 entries took {many:?}, one {one:?}: {ratio:.0}x"
    );
}
