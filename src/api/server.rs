//! The gRPC server: the API with its limits, health and reflection.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codec::CompressionEncoding;
use tonic::server::NamedService;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::Api;
use crate::config::LimitsConfig;
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
        let grpc = WatchProxyServer::new(api)
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Zstd);
        let streaming = BoxCloneSyncService::new(grpc.clone());
        let unary = ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(limits.max_concurrent_unary)
            .service(grpc);
        let unary = BoxCloneSyncService::new(ShedAsStatus(unary));
        Self { streaming, unary }
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
