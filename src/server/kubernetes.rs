//! The listener of Kubernetes' API (`kubernetes_api.listen`): HTTP/1.1
//! and HTTP/2 on hyper, as Kubernetes' clients speak either, over the
//! `tls` section's TLS (its client CAs identify callers by certificate, as
//! on the gRPC port). Each connection is held to the API port's bounds:
//! header bytes, the time its headers may take, streams, keepalive. Every
//! served verb is a GET: a request's body is never read.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn, Instrument};

use super::http2::MAX_HEADER_LIST;
use super::tls::Tls;
use crate::access::PeerCerts;
use crate::config::LimitsConfig;
use crate::kubernetes_api::KubernetesApi;

/// The most bytes of an HTTP/1.1 request's head: as HTTP/2's header list.
const MAX_HEAD: usize = MAX_HEADER_LIST;

/// Streams a client may make hyper reset for its errors before it is
/// sent away.
const LOCAL_RESETS: usize = 1024;

/// Serves Kubernetes' API on `listener` until `shutdown`; connections
/// then get `grace` to end, after which they are closed.
pub fn spawn(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    face: KubernetesApi,
    limits: &LimitsConfig,
    grace: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let builder = Arc::new(builder(limits));
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Some((tcp, peer)) = super::accept(&listener, &mut connections, &shutdown).await {
            let (tls, face, builder) = (tls.clone(), face.clone(), builder.clone());
            let stop = shutdown.clone();
            let span = info_span!("connection", peer = %peer, api = "kubernetes");
            connections.spawn(
                async move {
                    match tls {
                        None => serve(TokioIo::new(tcp), None, face, &builder, stop).await,
                        Some(tls) => {
                            if let Ok(stream) = tls.accept_http(tcp).await {
                                let certs = (stream.get_ref().1.peer_certificates()).map(|c| {
                                    PeerCerts(Arc::new(
                                        c.iter().map(|c| c.clone().into_owned()).collect(),
                                    ))
                                });
                                serve(TokioIo::new(stream), certs, face, &builder, stop).await
                            }
                        }
                    }
                }
                .instrument(span),
            );
        }
        drop(listener);
        let drained = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, drained).await.is_err() {
            warn!(
                ?grace,
                "closing Kubernetes API connections still open after the grace period"
            );
        }
    })
}

/// hyper's HTTP/1.1 and HTTP/2, held to the API port's bounds.
fn builder(limits: &LimitsConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(MAX_HEAD)
        .header_read_timeout(limits.request_body_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_LIST as u32)
        .max_local_error_reset_streams(Some(LOCAL_RESETS))
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    builder
}

/// One connection's requests, until it closes or `shutdown`, when it is
/// asked to close once its open requests end.
async fn serve<I>(
    io: I,
    certs: Option<PeerCerts>,
    face: KubernetesApi,
    builder: &auto::Builder<TokioExecutor>,
    shutdown: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        let face = face.clone();
        if let Some(certs) = &certs {
            request.extensions_mut().insert(certs.clone());
        }
        async move { Ok::<_, Infallible>(face.answer(request).await) }
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        debug!(error = %e, "a Kubernetes API connection ended");
    }
}
