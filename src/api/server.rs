//! The gRPC server: the API with its limits, health and reflection.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use tonic::body::Body;
use tonic::codec::CompressionEncoding;
use tonic::server::NamedService;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

use tonic::codec::{BufferSettings, Codec, EnabledCompressionEncodings, EncodeBuf, Encoder};

use super::{connection, Api, WatchMessage, WatchStream};
use crate::config::LimitsConfig;
use crate::pb;
use crate::pb::watch_proxy_server::WatchProxyServer;

type HttpService = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

/// The API as one service: Watch calls go straight through; List and Get
/// pass a concurrency limit that sheds load (RESOURCE_EXHAUSTED at once)
/// rather than queueing when it is reached. A watch must not hold a slot
/// of that limit for its whole life, hence the split by method.
#[derive(Clone)]
pub struct ApiService {
    streaming: HttpService,
    unary: HttpService,
}

impl ApiService {
    pub fn new(api: Api, limits: &LimitsConfig) -> Self {
        let streaming = BoxCloneSyncService::new(WatchHandler {
            api: api.clone(),
            max_message_bytes: limits.max_message_bytes,
        });
        let grpc = WatchProxyServer::new(api)
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Zstd);
        let unary = ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(limits.max_concurrent_unary)
            .service(grpc);
        let unary = BoxCloneSyncService::new(ShedAsStatus(unary));
        Self { streaming, unary }
    }
}

/// Serves the Watch calls a connection does not serve itself (those with a
/// compressed request), with each event's bytes as the dispatcher encoded
/// them once for all its watchers. Responses are never compressed, here
/// as on the connection's own path: compressing per watcher would cost
/// more than the whole fan-out.
#[derive(Clone)]
struct WatchHandler {
    api: Api,
    max_message_bytes: usize,
}

impl Service<http::Request<Body>> for WatchHandler {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let (api, max) = (self.api.clone(), self.max_message_bytes);
        Box::pin(async move {
            let mut accepted = EnabledCompressionEncodings::default();
            accepted.enable(CompressionEncoding::Gzip);
            accepted.enable(CompressionEncoding::Zstd);
            let mut grpc = tonic::server::Grpc::new(PreEncoded)
                .apply_compression_config(accepted, EnabledCompressionEncodings::default())
                .apply_max_message_size_config(Some(max), Some(max));
            Ok(grpc.server_streaming(WatchCall(api), req).await)
        })
    }
}

struct WatchCall(Api);

impl tonic::server::ServerStreamingService<pb::WatchRequest> for WatchCall {
    type Response = WatchMessage;
    type ResponseStream = WatchStream;
    type Future = futures::future::BoxFuture<'static, Result<tonic::Response<WatchStream>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::WatchRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.watch_encoded(request).await })
    }
}

/// Decodes requests with prost; writes responses that are already encoded.
#[derive(Default)]
struct PreEncoded;

impl Codec for PreEncoded {
    type Encode = WatchMessage;
    type Decode = pb::WatchRequest;
    type Encoder = PreEncoded;
    type Decoder = tonic_prost::ProstDecoder<pb::WatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        PreEncoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

impl Encoder for PreEncoded {
    type Item = WatchMessage;
    type Error = Status;

    fn encode(&mut self, item: WatchMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.write_to(dst);
        Ok(())
    }

    /// A watch is idle most of its life: start each stream's buffer small
    /// (tonic's default takes 8 KiB per stream up front) and let it grow.
    /// Events ready together go out as one chunk of up to 8 KiB (tonic's
    /// default, 32 KiB, is more than a lagging stream should hold).
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(256, 8 * 1024)
    }
}

/// Answers a call the load shedder refused with RESOURCE_EXHAUSTED.
#[derive(Clone)]
struct ShedAsStatus<S>(S);

impl<S> Service<http::Request<Body>> for ShedAsStatus<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The shedder is always ready; it refuses in `call`.
        self.0.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let call = self.0.call(req);
        Box::pin(async move {
            Ok(call.await.unwrap_or_else(|e| {
                Status::resource_exhausted(format!(
                    "{e}: too many List/Get calls in progress; retry with backoff"
                ))
                .into_http()
            }))
        })
    }
}

impl NamedService for ApiService {
    const NAME: &'static str = "watchproxy.v1.WatchProxy";
}

impl Service<http::Request<Body>> for ApiService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = tower::util::Oneshot<HttpService, http::Request<Body>>;

    /// Always ready: the chosen service is made ready in `call`, so a watch
    /// never takes a slot of the List/Get limit, even for a moment.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let service = if req.uri().path().ends_with("/Watch") {
            &self.streaming
        } else {
            &self.unary
        };
        service.clone().oneshot(req)
    }
}

/// How much of one stream's response HTTP/2 may hold unwritten before the
/// stream is asked for no more. Each stream's buffered bytes are its own
/// copies of the events, so h2's default (400 KiB) let thousands of
/// lagging watch streams hold hundreds of MiB; past this bound a lagging
/// watcher's events wait in the shared window instead.
const STREAM_SEND_BUFFER: usize = 16 * 1024;

/// Serves HTTP/2 gRPC on `listener` until `shutdown`, then sends GOAWAY on
/// every connection and waits for their calls to end. Watch calls are
/// served by each connection itself; `routes` answers every other call.
/// Dropping the future closes the connections that remain.
pub async fn serve<S>(
    listener: TcpListener,
    api: Api,
    routes: S,
    limits: &LimitsConfig,
    shutdown: CancellationToken,
) where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let settings = connection::Settings {
        max_concurrent_streams: limits.max_concurrent_streams,
        max_message_bytes: limits.max_message_bytes,
        stream_send_buffer: STREAM_SEND_BUFFER,
        keep_alive_interval: limits.keepalive_interval,
        keep_alive_timeout: limits.keepalive_timeout,
    };
    let routes = Deadlines(routes);
    let mut connections = JoinSet::new();
    loop {
        let tcp = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, say: do not spin on it.
                    warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Events go out as they happen: without TCP_NODELAY, Nagle holds
        // each small write until the client's delayed ACK (measured: p50
        // +10 ms, p99 +40 ms at 200 events/s).
        let _ = tcp.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
        let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
        connections.spawn(connection::serve(
            tcp,
            api.clone(),
            routes.clone(),
            settings.clone(),
            shutdown.clone(),
        ));
    }
    // Stop accepting at once; the open connections drain.
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Ends a call that has not answered by the client's `grpc-timeout` with
/// DEADLINE_EXCEEDED (a Watch stream, once started, is not cut by it).
#[derive(Clone)]
struct Deadlines<S>(S);

impl<S> Service<http::Request<Body>> for Deadlines<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let deadline = req.headers().get("grpc-timeout").and_then(grpc_timeout);
        let answer = self.0.call(req);
        Box::pin(async move {
            let Some(deadline) = deadline else {
                return answer.await;
            };
            match tokio::time::timeout(deadline, answer).await {
                Ok(answer) => answer,
                Err(_) => Ok(Status::deadline_exceeded("the call's deadline passed").into_http()),
            }
        })
    }
}

/// Reads a `grpc-timeout` header: at most 8 digits and a unit.
pub(super) fn grpc_timeout(v: &http::HeaderValue) -> Option<Duration> {
    let v = v.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_spells_them() {
        let t = |s: &str| grpc_timeout(&http::HeaderValue::from_str(s).unwrap());
        assert_eq!(t("300m"), Some(Duration::from_millis(300)));
        assert_eq!(t("2S"), Some(Duration::from_secs(2)));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_outlives_its_deadline_is_answered_deadline_exceeded() {
        let never = tower::service_fn(|_: http::Request<Body>| {
            futures::future::pending::<Result<http::Response<Body>, Infallible>>()
        });
        let mut deadlines = Deadlines(never);
        let mut req = http::Request::new(Body::default());
        req.headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static("50m"));
        let answer = deadlines.call(req).await.unwrap();
        let status = Status::from_header_map(answer.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }
}
