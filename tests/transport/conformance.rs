//! HTTP/2 conformance: one case per rule of RFC 9113 and RFC 7541 (each
//! naming its section, after h2spec's cases), run against both serve paths
//! (`watch.serve_path`: the service's own HTTP/2 server and tonic's, on
//! hyper's h2), which must give the same answers.

use std::time::Duration;

use crate::common::*;
use crate::raw::*;
use prost::Message;
use watchproxy::config::ServePath;
use watchproxy::pb::ListRequest;

const LIST: &str = "/watchproxy.v1.WatchProxy/List";

/// How many streams the servers under test allow on a connection.
const MAX_STREAMS: u32 = 8;

/// What a case does, step by step.
#[derive(Clone)]
enum Step {
    /// A frame: kind, flags, stream, payload.
    Send(u8, u8, u32, Vec<u8>),
    /// Read until the server's response on the stream has ended.
    AwaitEnd(u32),
}

/// What the server must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A stream error: RST_STREAM with this code (or GOAWAY with it, which
    /// RFC 9113 §5.4.2 allows).
    Stream(u32),
    /// A connection error: GOAWAY with this code.
    Connection(u32),
    /// Nothing is refused: a PING after the case is answered.
    Accepted,
    /// No answer within 5 s (what h2 gives in one case).
    Silent,
}

const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const STREAM_CLOSED: u32 = 0x5;
const FRAME_SIZE_ERROR: u32 = 0x6;
const REFUSED_STREAM: u32 = 0x7;
const COMPRESSION_ERROR: u32 = 0x9;

struct Case {
    section: &'static str,
    /// SETTINGS the client sends first.
    settings: Vec<(u16, u32)>,
    steps: Vec<Step>,
    /// The RFC's answer, which the service's own server gives.
    expect: Expect,
    /// h2's answer (tonic's path) where it is not the RFC's: kept here so
    /// that a change in either is seen. h2spec passes both, as it takes a
    /// closed connection for any error.
    h2: Option<Expect>,
}

impl Case {
    /// h2's answer is `h2` rather than the RFC's.
    fn h2(mut self, h2: Expect) -> Case {
        self.h2 = Some(h2);
        self
    }
}

fn send(kind: u8, flags: u8, stream: u32, payload: impl Into<Vec<u8>>) -> Step {
    Step::Send(kind, flags, stream, payload.into())
}

/// A List request's HEADERS, whole; `end` ends the stream.
fn list_headers(stream: u32, end: bool) -> Step {
    let flags = END_HEADERS | if end { END_STREAM } else { 0 };
    send(HEADERS, flags, stream, literal_block(&grpc_fields(LIST)))
}

/// HEADERS of the List request's fields with `change` applied.
fn list_headers_with(stream: u32, change: impl Fn(&mut Vec<(&str, &str)>)) -> Step {
    let mut fields = grpc_fields(LIST);
    change(&mut fields);
    send(
        HEADERS,
        END_HEADERS | END_STREAM,
        stream,
        literal_block(&fields),
    )
}

/// A List request's message, with its gRPC prefix.
fn list_message() -> Vec<u8> {
    let body = ListRequest {
        resource: "pods".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut m = vec![0];
    m.extend_from_slice(&(body.len() as u32).to_be_bytes());
    m.extend_from_slice(&body);
    m
}

/// A whole List request on `stream`: HEADERS, then its message ending
/// the stream.
fn list_request(stream: u32) -> Vec<Step> {
    vec![
        list_headers(stream, false),
        send(DATA, END_STREAM, stream, list_message()),
    ]
}

fn window_update(n: u32) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

const INITIAL_WINDOW_SIZE: u16 = 0x4;
const MAX_WINDOW: u32 = (1 << 31) - 1;

fn cases() -> Vec<Case> {
    let plain = |section, steps, expect| Case {
        section,
        settings: vec![],
        steps,
        expect,
        h2: None,
    };
    // The server may not send a response's DATA: its stream stays
    // half-closed (remote) once the request is whole.
    let no_window = |section, steps, expect| Case {
        section,
        settings: vec![(INITIAL_WINDOW_SIZE, 0)],
        steps,
        expect,
        h2: None,
    };
    let with = |mut steps: Vec<Step>, more: Vec<Step>| {
        steps.extend(more);
        steps
    };
    let trailers = literal_block(&[("x-trailer", "1")]);
    vec![
        plain(
            "5.1 idle: DATA is a PROTOCOL_ERROR",
            vec![send(DATA, END_STREAM, 1, b"test".to_vec())],
            Expect::Connection(PROTOCOL_ERROR),
        ),
        plain(
            "5.1 idle: RST_STREAM is a PROTOCOL_ERROR",
            vec![send(RST_STREAM, 0, 1, window_update(8))],
            Expect::Connection(PROTOCOL_ERROR),
        ),
        no_window(
            "5.1 half-closed (remote): HEADERS is STREAM_CLOSED",
            with(
                list_request(1),
                vec![send(HEADERS, END_HEADERS | END_STREAM, 1, trailers.clone())],
            ),
            Expect::Stream(STREAM_CLOSED),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
        no_window(
            "5.1 half-closed (remote): DATA is STREAM_CLOSED",
            with(
                list_request(1),
                vec![send(DATA, END_STREAM, 1, b"x".to_vec())],
            ),
            Expect::Stream(STREAM_CLOSED),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
        no_window(
            "5.1 half-closed (remote): WINDOW_UPDATE and PRIORITY are taken",
            with(
                list_request(1),
                vec![
                    send(WINDOW_UPDATE, 0, 1, window_update(1)),
                    send(PRIORITY, 0, 1, vec![0, 0, 0, 0, 16]),
                ],
            ),
            Expect::Accepted,
        ),
        plain(
            "5.1 closed: DATA after the client's RST_STREAM is STREAM_CLOSED",
            vec![
                list_headers(1, false),
                send(RST_STREAM, 0, 1, window_update(8)),
                send(DATA, END_STREAM, 1, list_message()),
            ],
            Expect::Stream(STREAM_CLOSED),
        ),
        plain(
            "5.1 closed: DATA on a stream that ended is STREAM_CLOSED",
            with(
                list_request(1),
                vec![Step::AwaitEnd(1), send(DATA, END_STREAM, 1, b"x".to_vec())],
            ),
            Expect::Stream(STREAM_CLOSED),
        ),
        plain(
            "5.1 closed: HEADERS on a stream that ended is a connection's STREAM_CLOSED",
            with(
                list_request(1),
                vec![Step::AwaitEnd(1), list_headers(1, true)],
            ),
            Expect::Connection(STREAM_CLOSED),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
        plain(
            "5.1.1 a stream opened with an even number is a PROTOCOL_ERROR",
            vec![list_headers(2, true)],
            Expect::Connection(PROTOCOL_ERROR),
        ),
        plain(
            "5.1.1 a stream number lower than one opened before is a PROTOCOL_ERROR",
            with(list_request(5), vec![list_headers(3, true)]),
            Expect::Connection(PROTOCOL_ERROR),
        ),
        no_window(
            "5.1.2 streams past SETTINGS_MAX_CONCURRENT_STREAMS are refused",
            (0..=MAX_STREAMS)
                .map(|i| list_headers(2 * i + 1, false))
                .collect(),
            Expect::Stream(REFUSED_STREAM),
        ),
        plain(
            "5.3.1 HEADERS that depend on their own stream: PROTOCOL_ERROR",
            vec![{
                let mut payload = vec![0, 0, 0, 1, 255];
                payload.extend(literal_block(&grpc_fields(LIST)));
                send(
                    HEADERS,
                    END_HEADERS | END_STREAM | PRIORITY_FLAG,
                    1,
                    payload,
                )
            }],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "5.3.1 PRIORITY that depends on its own stream: PROTOCOL_ERROR",
            vec![send(PRIORITY, 0, 3, vec![0, 0, 0, 3, 16])],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "6.3 PRIORITY of a length other than 5: FRAME_SIZE_ERROR",
            vec![send(PRIORITY, 0, 3, vec![0, 0, 0, 1])],
            Expect::Stream(FRAME_SIZE_ERROR),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
        plain(
            "6.5 SETTINGS ACK with a payload: FRAME_SIZE_ERROR",
            vec![send(SETTINGS, ACK, 0, vec![0, 4, 0, 0, 0, 1])],
            Expect::Connection(FRAME_SIZE_ERROR),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
        plain(
            "6.5.2 SETTINGS_ENABLE_PUSH other than 0 or 1: PROTOCOL_ERROR",
            vec![send(SETTINGS, 0, 0, vec![0, 2, 0, 0, 0, 2])],
            Expect::Connection(PROTOCOL_ERROR),
        ),
        plain(
            "6.9 WINDOW_UPDATE of 0 on the connection: PROTOCOL_ERROR",
            vec![send(WINDOW_UPDATE, 0, 0, window_update(0))],
            Expect::Connection(PROTOCOL_ERROR),
        ),
        plain(
            "6.9.1 WINDOW_UPDATEs taking a stream's window past 2^31-1: FLOW_CONTROL_ERROR",
            vec![
                list_headers(1, false),
                send(WINDOW_UPDATE, 0, 1, window_update(MAX_WINDOW)),
                send(WINDOW_UPDATE, 0, 1, window_update(MAX_WINDOW)),
            ],
            Expect::Stream(FLOW_CONTROL_ERROR),
        ),
        plain(
            "6.9.2 SETTINGS_INITIAL_WINDOW_SIZE that overflows an open stream: FLOW_CONTROL_ERROR",
            vec![
                list_headers(1, false),
                send(WINDOW_UPDATE, 0, 1, window_update(MAX_WINDOW - 65_535)),
                send(SETTINGS, 0, 0, vec![0, 4, 0, 1, 0, 0]),
            ],
            Expect::Connection(FLOW_CONTROL_ERROR),
        ),
        plain(
            "8.1 trailers that hold a pseudo-field: PROTOCOL_ERROR",
            vec![
                list_headers(1, false),
                send(DATA, 0, 1, list_message()),
                send(
                    HEADERS,
                    END_HEADERS | END_STREAM,
                    1,
                    literal_block(&[(":method", "POST")]),
                ),
            ],
            Expect::Stream(PROTOCOL_ERROR),
        )
        .h2(Expect::Silent),
        plain(
            "8.1.1 a body longer than its content-length: PROTOCOL_ERROR",
            vec![
                {
                    let mut fields = grpc_fields(LIST);
                    fields.push(("content-length", "1"));
                    send(HEADERS, END_HEADERS, 1, literal_block(&fields))
                },
                send(DATA, END_STREAM, 1, list_message()),
            ],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "8.2.2 a connection-specific field: PROTOCOL_ERROR",
            vec![list_headers_with(1, |f| {
                f.push(("connection", "keep-alive"))
            })],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "8.2.2 te other than trailers: PROTOCOL_ERROR",
            vec![list_headers_with(1, |f| {
                f.retain(|(n, _)| *n != "te");
                f.push(("te", "gzip"));
            })],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "8.3.1 :scheme missing: PROTOCOL_ERROR",
            vec![list_headers_with(1, |f| f.retain(|(n, _)| *n != ":scheme"))],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "8.3.1 :scheme twice: PROTOCOL_ERROR",
            vec![list_headers_with(1, |f| f.insert(1, (":scheme", "http")))],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "8.3 a pseudo-field after a regular one: PROTOCOL_ERROR",
            vec![list_headers_with(1, |f| {
                f.retain(|(n, _)| *n != ":authority");
                f.push((":authority", "x"));
            })],
            Expect::Stream(PROTOCOL_ERROR),
        ),
        plain(
            "RFC 7541 6.3 a table size update above SETTINGS_HEADER_TABLE_SIZE: COMPRESSION_ERROR",
            vec![{
                // 2^28 with a 5-bit prefix, then the request.
                let mut block = vec![0x3f, 0xe1, 0xff, 0xff, 0x7f];
                block.extend(literal_block(&grpc_fields(LIST)));
                send(HEADERS, END_HEADERS | END_STREAM, 1, block)
            }],
            Expect::Connection(COMPRESSION_ERROR),
        )
        .h2(Expect::Connection(PROTOCOL_ERROR)),
    ]
}

/// Runs one case on a new connection: what the server answered.
async fn run(addr: std::net::SocketAddr, case: &Case) -> Result<Expect, String> {
    let mut raw = Raw::connect_with(addr, &case.settings).await;
    for step in &case.steps {
        match step {
            Step::Send(kind, flags, stream, payload) => {
                raw.send(*kind, *flags, *stream, payload).await
            }
            Step::AwaitEnd(id) => loop {
                match raw.frame_within(Duration::from_secs(5)).await {
                    Some((DATA | HEADERS, flags, s, _)) if s == *id && flags & END_STREAM != 0 => {
                        break
                    }
                    Some((RST_STREAM, _, s, _)) if s == *id => break,
                    Some(_) => {}
                    None => return Err(format!("stream {id} did not end")),
                }
            },
        }
    }
    if case.expect == Expect::Accepted {
        raw.send(PING, 0, 0, b"conform!").await;
    }
    loop {
        let Some((kind, flags, _, payload)) = raw.frame_within(Duration::from_secs(5)).await else {
            return Ok(Expect::Silent);
        };
        return Ok(match kind {
            RST_STREAM if code(&payload) != 0 => Expect::Stream(code(&payload)),
            GOAWAY => Expect::Connection(code(&payload[4..])),
            PING if flags & ACK != 0 && &payload[..] == b"conform!" => Expect::Accepted,
            _ => continue,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_serve_paths_answer_each_rule_as_rfc_9113_says() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    put_pod(&mut ec, "ns", "a", &[], "node-1").await;
    let limits = format!("max_concurrent_unary: 4096\n  max_concurrent_streams: {MAX_STREAMS}");
    let mut failures = Vec::new();
    for path in [ServePath::Fast, ServePath::Tonic] {
        let mut config = pods_config_with_limits(&etcd.client_url, &limits);
        config.watch.serve_path = path;
        let proxy = Proxy::start_config(config).await;
        wait_ready(&mut proxy.client().await, "pods").await;
        for case in cases() {
            let want = match path {
                ServePath::Tonic => case.h2.unwrap_or(case.expect),
                ServePath::Fast => case.expect,
            };
            let got = run(proxy.addr, &case).await;
            if got != Ok(want) {
                failures.push(format!(
                    "{path:?}: {}: expected {want:?}, got {got:?}",
                    case.section
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
