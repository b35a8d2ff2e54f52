//! Fuzz targets of the HTTP/2 server: what a client can send, fed to the
//! code that reads it, with what must hold of the answer checked. The
//! coverage-guided fuzzers in `fuzz/` (afl.rs) and the property tests
//! below (proptest's mutations of `fuzz/seeds/`) run the same functions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tonic::body::Body;

use super::super::router::Faces;
use super::protocol::frame::{kind, Head, HEAD, PREFACE};
use super::protocol::hpack::{read_request, read_trailers};
use super::protocol::socket::Socket;
use super::protocol::state::hpack_decoder;
use super::ConnectionBounds;
use crate::api::Api;
use crate::telemetry::Metrics;

/// The highest error code RFC 9113 §7 defines.
const LAST_CODE: u32 = 0xd;

/// A connection whose client sends the preface, an empty SETTINGS and then
/// `input`, and then closes its side. The server must not panic, must
/// answer in well-formed frames, must end streams and the connection only
/// with codes RFC 9113 defines, and must write no more than a bound of what
/// it was sent.
pub fn connection(input: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let output = runtime.block_on(serve_one(input));
    check_frames(&output);
    // Each frame a client sends is answered with a few frames at most
    // (a 415 answer to a short HEADERS is the most); the server's own
    // first frames are a few dozen bytes.
    assert!(
        output.len() <= 16 * (input.len() + PREFACE.len() + HEAD) + 1024,
        "{} bytes out for {} in",
        output.len(),
        input.len()
    );
}

async fn serve_one(input: &[u8]) -> Vec<u8> {
    let shutdown = CancellationToken::new();
    let api = Api::new(
        HashMap::new(),
        Duration::from_secs(1),
        16,
        Metrics::default(),
        shutdown.clone(),
    );
    let routes = tower::service_fn(|_: http::Request<Body>| async {
        Ok::<_, Infallible>(tonic::Status::unimplemented("fuzzing").into_http())
    });
    let settings = ConnectionBounds {
        max_concurrent_streams: 100,
        max_request_bytes: 64 * 1024,
        max_message_bytes: 1 << 20,
        request_body_timeout: Duration::from_secs(1),
        keep_alive_interval: Duration::from_secs(30),
        keep_alive_timeout: Duration::from_secs(10),
        max_connection_age: None,
        max_connection_age_grace: Duration::from_secs(1),
        direct_delivery: true,
    };
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(super::connection::serve(
        Socket::io(server),
        None,
        Faces { api, etcd: None },
        routes,
        settings,
        shutdown,
        tracing::Span::none(),
    ));
    let mut sent = PREFACE.to_vec();
    sent.extend_from_slice(&[0, 0, 0, kind::SETTINGS, 0, 0, 0, 0, 0]);
    sent.extend_from_slice(input);
    let (mut read, mut write) = tokio::io::split(&mut client);
    let writing = async {
        // The server may stop reading (a connection error): what it did
        // not take is dropped.
        let _ = write.write_all(&sent).await;
        // Time for the answers (time is paused: it passes once all else
        // waits), then the client leaves.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = write.shutdown().await;
    };
    let mut output = Vec::new();
    let reading = async {
        let _ = tokio::time::timeout(Duration::from_secs(60), read.read_to_end(&mut output)).await;
    };
    tokio::join!(writing, reading);
    served.abort();
    output
}

/// What the server wrote, frame by frame: whole frames of known kinds,
/// and every GOAWAY and RST_STREAM code one the RFC defines.
fn check_frames(output: &[u8]) {
    let mut at = 0;
    while at < output.len() {
        assert!(output.len() - at >= HEAD, "a frame cut short");
        let head = Head::read(&output[at..]);
        let payload = &output[at + HEAD..];
        assert!(payload.len() >= head.len, "a frame cut short");
        let payload = &payload[..head.len];
        let code = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        match head.kind {
            kind::GOAWAY => assert!(code(&payload[4..]) <= LAST_CODE),
            kind::RST_STREAM => assert!(code(payload) <= LAST_CODE),
            kind::DATA
            | kind::HEADERS
            | kind::SETTINGS
            | kind::PING
            | kind::WINDOW_UPDATE
            | kind::CONTINUATION => {}
            other => panic!("the server sent a frame of kind {other}"),
        }
        at += HEAD + head.len;
    }
}

/// A header block read as a request, then as trailers, on one decoder
/// whose table is bounded: no panic, whatever the bytes.
pub fn header_block(input: &[u8]) {
    let mut decoder = hpack_decoder();
    let _ = read_request(&mut decoder, input);
    let _ = read_trailers(&mut decoder, input);
}

/// A request body as gRPC frames it: the message taken whole within the
/// bound, or waited for, or refused with a status a client can act on.
pub fn grpc_framing(input: &[u8]) {
    let mut buf = BytesMut::from(input);
    match super::grpc_framing::take_message(&mut buf, 1024) {
        Ok(Some(message)) => assert_eq!(message.len() + 5 + buf.len(), input.len()),
        Ok(None) => assert_eq!(buf.len(), input.len()),
        Err(e) => {
            let status = tonic::Status::from(e);
            assert!(
                matches!(
                    status.code(),
                    tonic::Code::Internal
                        | tonic::Code::ResourceExhausted
                        | tonic::Code::InvalidArgument
                ),
                "{status:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The harness reaches the server: a seed's request is answered, and a
    /// broken frame ends the connection with a GOAWAY the checks read.
    #[test]
    fn the_harness_gets_answers_and_refusals() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let seed = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/seeds/h2_frames/1"
        ));
        let output = runtime.block_on(serve_one(&seed.unwrap()));
        check_frames(&output);
        let kinds = |output: &[u8]| {
            let mut at = 0;
            let mut kinds = Vec::new();
            while at < output.len() {
                let head = Head::read(&output[at..]);
                kinds.push((head.kind, head.stream));
                at += HEAD + head.len;
            }
            kinds
        };
        assert!(
            kinds(&output).contains(&(kind::HEADERS, 1)),
            "{:?}",
            kinds(&output)
        );
        let broken = [0, 0, 1, kind::PING, 0, 0, 0, 0, 0, 0];
        let output = runtime.block_on(serve_one(&broken));
        assert!(
            kinds(&output).contains(&(kind::GOAWAY, 0)),
            "{:?}",
            kinds(&output)
        );
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config())]

        #[test]
        fn fuzz_connections(input in crate::fuzzing::bytes("h2_frames")) {
            super::connection(&input);
        }

        #[test]
        fn fuzz_header_blocks(input in crate::fuzzing::bytes("hpack_block")) {
            super::header_block(&input);
        }

        #[test]
        fn fuzz_grpc_framing(input in crate::fuzzing::bytes("grpc_frame")) {
            super::grpc_framing(&input);
        }
    }
}
