//! Serving the routes on HTTP/2: on the service's own connection path
//! (`http2`, the default) or on tonic's server, as
//! `watch.serve_path` says, in plain text or over TLS. Both stop accepting
//! at `shutdown`, send GOAWAY and wait for the open calls to end.

pub mod admission;
pub mod health;
mod http2;
pub mod kubernetes;
pub mod router;
mod routes;
pub mod tls;

/// The HTTP/2 server's fuzz targets, for the fuzzers in `fuzz/`.
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub use http2::fuzz as http2_fuzz;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tracing::warn;

use crate::config::{LimitsConfig, ServePath, WatchConfig};
use http2::{tune, MAX_HEADER_LIST, TCP_KEEPALIVE};
use router::Faces;
use tls::Tls;

/// Streams a client may make h2 reset for its errors before it is sent
/// away: h2's own default.
const LOCAL_RESETS: usize = 1024;

/// Handshakes finished but not yet taken by tonic's server.
const HANDSHAKEN: usize = 64;

pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    faces: Faces,
    routes: Routes,
    limits: &LimitsConfig,
    watch: &WatchConfig,
    shutdown: CancellationToken,
) {
    if tls.is_none() {
        warn!("no tls section: clients connect in plain text");
    }
    match watch.serve_path {
        ServePath::Fast => {
            let settings = http2::ConnectionBounds {
                max_concurrent_streams: limits.max_concurrent_streams,
                max_request_bytes: limits.max_request_bytes,
                max_message_bytes: limits.max_message_bytes,
                request_body_timeout: limits.request_body_timeout,
                keep_alive_interval: limits.keepalive_interval,
                keep_alive_timeout: limits.keepalive_timeout,
                max_connection_age: limits.max_connection_age,
                max_connection_age_grace: limits.max_connection_age_grace,
                direct_delivery: watch.direct_delivery,
            };
            let routes = routes.prepare();
            http2::serve(listener, tls, faces, routes, settings, shutdown).await
        }
        ServePath::Tonic => {
            let mut builder = tonic::transport::Server::builder()
                .max_concurrent_streams(limits.max_concurrent_streams)
                // h2's bound on the streams a client makes it reset
                // (MadeYouReset), which tonic leaves off.
                .http2_max_local_error_reset_streams(Some(LOCAL_RESETS))
                .http2_max_header_list_size(MAX_HEADER_LIST as u32)
                .http2_keepalive_interval(Some(limits.keepalive_interval))
                .http2_keepalive_timeout(Some(limits.keepalive_timeout));
            // hyper's: GOAWAY at the age, the connection closed after the
            // grace; watches end with the connection, without a version.
            if let Some(age) = limits.max_connection_age {
                builder = builder
                    .max_connection_age(age)
                    .max_connection_age_grace(limits.max_connection_age_grace);
            }
            let server = builder.add_routes(routes);
            let served = match tls {
                None => {
                    let incoming = TcpIncoming::from(listener)
                        .with_nodelay(Some(true))
                        .with_keepalive(Some(TCP_KEEPALIVE));
                    server
                        .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
                        .await
                }
                Some(tls) => {
                    let (tx, rx) = tokio::sync::mpsc::channel(HANDSHAKEN);
                    let accepting = accept_tls(listener, tls, tx, shutdown.clone());
                    let serving = server.serve_with_incoming_shutdown(
                        ReceiverStream::new(rx),
                        shutdown.cancelled(),
                    );
                    tokio::join!(accepting, serving).1
                }
            };
            if let Err(e) = served {
                warn!(error = %e, "the gRPC server failed");
            }
        }
    }
}

/// The next connection `listener` accepts, tuned, while `connections`
/// (the tasks of those accepted before) are reaped as they end; none at
/// `shutdown`. A failure to accept (out of file descriptors, say) is
/// logged and waited out rather than spun on.
async fn accept(
    listener: &TcpListener,
    connections: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    tune(&tcp);
                    return Some((tcp, peer));
                }
                Err(e) => {
                    warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Accepts connections and completes their handshakes, each in a task of
/// its own, until `shutdown`; hands the finished ones to tonic's server.
/// Handshakes still under way then are dropped, and so is `ready`, which
/// ends the server's stream of connections.
async fn accept_tls(
    listener: TcpListener,
    tls: Arc<Tls>,
    ready: tokio::sync::mpsc::Sender<std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>>,
    shutdown: CancellationToken,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    tune(&tcp);
                    let (tls, ready) = (tls.clone(), ready.clone());
                    handshakes.spawn(async move {
                        if let Ok(stream) = tls.accept(tcp).await {
                            let _ = ready.send(Ok(stream)).await;
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Streams a connection of the health-only listener may have open: a
/// probe makes one at a time.
const HEALTH_STREAMS: u32 = 16;

/// The windows of a connection of the health-only listener: its requests
/// are a few bytes each.
const HEALTH_WINDOW: u32 = 64 * 1024;

/// Serves only `grpc.health.v1` on `listener`, in plain text, until
/// `shutdown`: for probes (a kubelet's gRPC probe) that cannot present a
/// client certificate when the API port asks for one. Open to whoever
/// reaches it, it holds the API's HTTP/2 bounds (resets, keepalive, the
/// header list) with fewer streams and smaller windows, and each request
/// the size of a health check ([`router::HealthRoute`]).
pub fn spawn_health_only(
    listener: TcpListener,
    health: router::HealthRoute,
    limits: &LimitsConfig,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(HEALTH_STREAMS)
        .http2_max_local_error_reset_streams(Some(LOCAL_RESETS))
        .http2_max_header_list_size(MAX_HEADER_LIST as u32)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .initial_connection_window_size(HEALTH_WINDOW)
        .initial_stream_window_size(HEALTH_WINDOW)
        .add_service(health);
    tokio::spawn(async move {
        let incoming = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(TCP_KEEPALIVE));
        let served = server
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
            .await;
        if let Err(e) = served {
            warn!(error = %e, "the health server failed");
        }
    })
}

/// How often a listener open to all is complained about.
const INSECURE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// A listener in plain text that serves anonymous callers, on an address
/// others can reach, reads everything to anyone: said in the log every
/// minute, and in `watchproxy_insecure_listener`, until `shutdown`.
/// `addrs` are the API's listeners (gRPC, and Kubernetes' API).
pub fn spawn_insecure_warning(
    addrs: &[std::net::SocketAddr],
    config: &crate::config::Config,
    metrics: &crate::telemetry::Metrics,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let identified = config.auth.tokens_file.is_some() || config.auth.jwt.is_some();
    let anonymous = config.auth.anonymous.unwrap_or(!identified);
    let open: Vec<std::net::SocketAddr> = (addrs.iter())
        .filter(|a| config.tls.is_none() && anonymous && !a.ip().is_loopback())
        .copied()
        .collect();
    metrics.security.insecure_listener(!open.is_empty());
    let addr = match open.as_slice() {
        [] => return None,
        [one] => one.to_string(),
        many => format!("{many:?}"),
    };
    Some(tokio::spawn(async move {
        let mut every = tokio::time::interval(INSECURE_WARNING_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => warn!(
                    %addr,
                    "serving in plain text without identities on an address others can reach: anyone who reaches it reads everything; configure tls and auth, or listen on 127.0.0.1"
                ),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::telemetry::Metrics;

    const BASE: &str = "
etcd: {endpoints: [http://127.0.0.1:2379]}
resources: [{name: pods, prefix: /registry/pods}]
";

    #[tokio::test]
    async fn only_a_listener_open_to_others_without_tls_or_identities_is_called_insecure() {
        let open = |yaml: &str, addr: &str| {
            let metrics = Metrics::default();
            let config = Config::from_yaml(&format!("{BASE}{yaml}")).unwrap();
            let shutdown = CancellationToken::new();
            let task = spawn_insecure_warning(
                &[addr.parse().unwrap()],
                &config,
                &metrics,
                shutdown.clone(),
            );
            shutdown.cancel();
            let gauge = (metrics.encode().lines()).any(|l| l == "watchproxy_insecure_listener 1");
            assert_eq!(task.is_some(), gauge, "{yaml} on {addr}");
            gauge
        };
        assert!(open("", "10.0.0.7:50051"));
        assert!(open("", "[::]:50051"));
        assert!(!open("", "127.0.0.1:50051"));
        assert!(!open("", "[::1]:50051"));
        let tokens =
            "listen: 10.0.0.7:50051\nauth: {tokens_file: /t}\ntls: {cert_file: /c, key_file: /k}\n";
        assert!(!open(tokens, "10.0.0.7:50051"));
        assert!(
            !open("auth: {anonymous: false}\n", "10.0.0.7:50051"),
            "nobody is served"
        );
        // Kubernetes' API on an address others reach, the gRPC port on
        // loopback: still open to all.
        let metrics = Metrics::default();
        let config = Config::from_yaml(BASE).unwrap();
        let addrs = [
            "127.0.0.1:50051".parse().unwrap(),
            "10.0.0.7:6443".parse().unwrap(),
        ];
        let task = spawn_insecure_warning(&addrs, &config, &metrics, CancellationToken::new());
        assert!(task.is_some());
        task.unwrap().abort();
    }
}
