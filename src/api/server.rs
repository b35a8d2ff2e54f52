//! The gRPC server: the API with its limits, health and reflection.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codec::CompressionEncoding;
use tonic::server::NamedService;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

use bytes::BufMut;
use tonic::codec::{BufferSettings, Codec, EnabledCompressionEncodings, EncodeBuf, Encoder};

use super::{Api, EncodedEvents};
use crate::config::LimitsConfig;
use crate::dispatch::Encoded;
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

/// Serves Watch with each event's bytes as the dispatcher encoded them once
/// for all its watchers, instead of encoding them again per watcher.
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
            let mut encodings = EnabledCompressionEncodings::default();
            encodings.enable(CompressionEncoding::Gzip);
            encodings.enable(CompressionEncoding::Zstd);
            let mut grpc = tonic::server::Grpc::new(PreEncoded)
                .apply_compression_config(encodings, encodings)
                .apply_max_message_size_config(Some(max), Some(max));
            Ok(grpc.server_streaming(WatchCall(api), req).await)
        })
    }
}

struct WatchCall(Api);

impl tonic::server::ServerStreamingService<pb::WatchRequest> for WatchCall {
    type Response = Encoded;
    type ResponseStream = EncodedEvents;
    type Future =
        futures::future::BoxFuture<'static, Result<tonic::Response<EncodedEvents>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::WatchRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.watch_encoded(request).await })
    }
}

/// Decodes requests with prost; writes responses that are already encoded.
#[derive(Default)]
struct PreEncoded;

impl Codec for PreEncoded {
    type Encode = Encoded;
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
    type Item = Encoded;
    type Error = Status;

    fn encode(&mut self, item: Encoded, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item.head);
        dst.put(item.body);
        Ok(())
    }

    /// A watch is idle most of its life: start each stream's buffer small
    /// (tonic's default takes 8 KiB per stream up front) and let it grow.
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(256, 32 * 1024)
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
