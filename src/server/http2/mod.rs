//! The service's own HTTP/2 server (`watch.serve_path: fast`).
//!
//! Two layers. The protocol ([`protocol`]) knows HTTP/2 and nothing of
//! what is served on it: typed frames, header blocks, stream and
//! connection states, windows, keepalive, the socket. On top of it, how it
//! works:
//! - one task per connection ([`connection`]) reads its frames
//!   ([`inbound`]), keeps its streams ([`table`], [`streams`]) and takes
//!   each new request ([`requests`]): plain Watch calls, and etcd's Watch
//!   streams (`etcd_api`: their requests handed to them as they arrive),
//!   it serves itself; every other call (List, Get, Range, health,
//!   reflection, a Watch with a compressed request) is bridged to the
//!   tonic routes in a task of its own ([`bridge`]), its answer held
//!   within a bound ([`held`]);
//! - a dispatch posts a connection's deliveries to its inbox with one lock
//!   and one wake; a pass of the task then polls only the watches the
//!   inbox names, and those the client gave room, from a ready list
//!   ([`watches`]);
//! - each watch frames its ready events straight into the connection's
//!   outgoing buffer ([`live_watch`], [`grpc_framing`]), within the client's
//!   windows, and the pass's frames go out in one system call after it; a
//!   task woken during its own poll is polled again in place.
//!
//! It is HTTP/2 as RFC 9113 has it for a server: SETTINGS, flow control
//! both ways, HPACK (responses are written as literals the client's table
//! does not keep), CONTINUATION, PING, RST_STREAM and GOAWAY, each frame
//! read by its type's `load`, which holds that frame's rules; streams
//! idle, open, half-closed or closed as §5.1 draws them, with those that
//! closed lately remembered and how. It does not do: PRIORITY (read, checked, not taken),
//! server push, the h2c upgrade from HTTP/1.1 (prior knowledge or TLS
//! ALPN only), or a dynamic table for responses. GOAWAY is single-phase:
//! it names the last stream the client opened, which is served. h2spec's
//! generic, HTTP/2 and HPACK suites pass whole (`docs/http2.md`), and
//! `tests/transport/conformance.rs` holds it and tonic's path to RFC 9113's answers.
//!
//! What a client can make a connection hold, before and after it is
//! identified (the operator's guide states them too):
//! - streams: `limits.max_concurrent_streams`; past it, REFUSED_STREAM;
//! - a header list: 16 KiB decoded (RESOURCE_EXHAUSTED), a header block
//!   64 KiB across its CONTINUATION frames (then ENHANCE_YOUR_CALM); the
//!   HPACK table 4,096 bytes (a larger size update is COMPRESSION_ERROR);
//! - request bytes: `limits.max_request_bytes` a stream (decompressed),
//!   and the connection's receive window (1 MiB) for all its unfinished
//!   requests, whose credit is held until each is whole; a request has
//!   `limits.request_body_timeout` to arrive; a caller that cannot be
//!   identified from its headers is refused before its body is read;
//! - resets: 1,000 in 10 s, the client's and those its errors cause
//!   together (CVE-2023-44487, CVE-2025-8671); then ENHANCE_YOUR_CALM;
//! - response bytes held for a client that does not read: the calls'
//!   1 MiB and one message (`limits.max_message_bytes`), each watch one
//!   event past its window, and the outgoing buffer's 64 KiB;
//! - SETTINGS: one walk of the streams a frame, whatever its entries.
//!
//! Why: with every watch woken by each event, per-stream work is most of
//! the server's CPU. tonic runs each stream in a task of its own, woken
//! and polled through several body layers for every message; h2 (under
//! tonic, or driven directly) takes its stream lock three times and
//! queues, prioritizes and copies each DATA frame. Here a delivery is a
//! frame header and a copy of the shared encoding into the buffer the
//! socket is written from. `watch.serve_path: tonic` serves everything on
//! tonic's server instead: the way back, and the standing A/B of the load
//! generator's `watchproxy-tonic` target (`docs/benchmarks.md`).

mod bridge;
mod connection;
mod feed;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
mod grpc_framing;
mod held;
mod inbound;
mod live_watch;
mod protocol;
mod requests;
mod streams;
mod table;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use tracing::info_span;

use super::router::Faces;
pub use super::routes::Routes;
use super::tls::Tls;
use crate::access::PeerCerts;
use bridge::Deadlines;
pub use protocol::hpack::MAX_HEADER_LIST;
pub use protocol::socket::{tune, TCP_KEEPALIVE};

/// How one connection is served.
#[derive(Clone)]
pub struct ConnectionBounds {
    pub max_concurrent_streams: u32,
    /// See `limits.max_request_bytes`.
    pub max_request_bytes: usize,
    /// See `limits.max_message_bytes`.
    pub max_message_bytes: usize,
    /// See `limits.request_body_timeout`.
    pub request_body_timeout: Duration,
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
    /// See `limits.max_connection_age`.
    pub max_connection_age: Option<Duration>,
    pub max_connection_age_grace: Duration,
    /// See `watch.direct_delivery`.
    pub direct_delivery: bool,
}

/// Serves HTTP/2 gRPC on `listener` until `shutdown`, then sends GOAWAY on
/// every connection and waits for their calls to end. Plain Watch calls
/// (and etcd's) are served by each connection itself; `routes` answers every other
/// call. Dropping the future closes the connections that remain.
pub async fn serve<S: Routes>(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    faces: Faces,
    routes: S,
    settings: ConnectionBounds,
    shutdown: CancellationToken,
) {
    let routes = Deadlines(routes);
    let mut connections = JoinSet::new();
    while let Some((tcp, peer_addr)) = super::accept(&listener, &mut connections, &shutdown).await {
        let (tls, faces, routes) = (tls.clone(), faces.clone(), routes.clone());
        let (settings, stop) = (settings.clone(), shutdown.clone());
        // The connection's span names its peer, and its caller once a call
        // has been identified.
        let span = info_span!("connection", peer = %peer_addr, identity = Empty);
        // The handshake runs in the connection's task: a slow client does
        // not hold up the others.
        let connection = async move {
            let (socket, peer) = match tls {
                None => (protocol::socket::Socket::tcp(tcp), None),
                Some(tls) => match tls.accept(tcp).await {
                    Ok(stream) => {
                        let certs = stream.get_ref().1.peer_certificates();
                        let peer = certs.map(|c| {
                            PeerCerts(Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()))
                        });
                        (protocol::socket::Socket::io(stream), peer)
                    }
                    Err(_) => return,
                },
            };
            connection::serve(socket, peer, faces, routes, settings, stop, span).await
        };
        connections.spawn(connection);
    }
    // Stop accepting at once; the open connections drain.
    drop(listener);
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A waker that counts its wakes.
    pub(super) struct Count(pub Arc<AtomicUsize>);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
