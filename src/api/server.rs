//! Serving the routes on HTTP/2: on the service's own connection path
//! ([`super::http2`], the default) or on tonic's server, as
//! `watch.serve_path` says. Both stop accepting at `shutdown`, send GOAWAY
//! and wait for the open calls to end.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tracing::warn;

use super::{http2, Api};
use crate::config::{LimitsConfig, ServePath};

/// TCP keepalive on accepted connections: finds peers gone without a word
/// even where HTTP/2 pings are not answered for long.
pub(super) const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// How much of one stream's response HTTP/2 may hold unwritten before the
/// stream is asked for no more. Each stream's buffered bytes are its own
/// copies of the events, so h2's default (400 KiB) let thousands of
/// lagging watch streams hold hundreds of MiB; past this bound a lagging
/// watcher's events wait in the shared window instead.
const STREAM_SEND_BUFFER: usize = 16 * 1024;

pub async fn serve(
    listener: TcpListener,
    api: Api,
    routes: Routes,
    limits: &LimitsConfig,
    path: ServePath,
    shutdown: CancellationToken,
) {
    match path {
        ServePath::Fast => {
            let settings = http2::Settings {
                max_concurrent_streams: limits.max_concurrent_streams,
                max_message_bytes: limits.max_message_bytes,
                stream_send_buffer: STREAM_SEND_BUFFER,
                keep_alive_interval: limits.keepalive_interval,
                keep_alive_timeout: limits.keepalive_timeout,
            };
            http2::serve(listener, api, routes.prepare(), settings, shutdown).await
        }
        ServePath::Tonic => {
            let incoming = TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE));
            let served = tonic::transport::Server::builder()
                .max_concurrent_streams(limits.max_concurrent_streams)
                .http2_keepalive_interval(Some(limits.keepalive_interval))
                .http2_keepalive_timeout(Some(limits.keepalive_timeout))
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
                .await;
            if let Err(e) = served {
                warn!(error = %e, "the gRPC server failed");
            }
        }
    }
}
