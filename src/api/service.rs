//! The API as one tower service: each method's route with its codec and
//! limits, behind admission ([`super::admission`]). List and Get take a
//! slot of a concurrency limit that sheds load (RESOURCE_EXHAUSTED at
//! once) rather than queueing when it is reached; a watch must not hold a
//! slot of that limit for its whole life, so Watch goes around it.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::codec::{
    BufferSettings, Codec, CompressionEncoding, EnabledCompressionEncodings, EncodeBuf, Encoder,
};
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::admission::{Admission, Bounds};
use super::compression::Codec as WireCodec;
use super::error::ApiError;
use super::wire::WatchMessage;
use super::{etcd, Api, WatchStream};
use crate::config::LimitsConfig;
use crate::pb;
use crate::telemetry::{DeliveryLatency, ServePathLabel, WatchApi};

pub const LIST_PATH: &str = "/watchproxy.v1.WatchProxy/List";
pub const GET_PATH: &str = "/watchproxy.v1.WatchProxy/Get";
pub const WATCH_PATH: &str = "/watchproxy.v1.WatchProxy/Watch";
pub const PROGRESS_PATH: &str = "/watchproxy.v1.WatchProxy/RequestProgress";

/// A service that answers calls as HTTP requests: the routes, and each
/// layer of them.
pub trait Routes:
    Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Routes for S
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
}

type HttpService = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

#[derive(Clone)]
pub struct ApiService {
    watch: HttpService,
    unary: HttpService,
}

impl ApiService {
    pub fn new(api: Api, limits: &LimitsConfig) -> Self {
        let calls = Calls::new(api.clone(), limits);
        let bounds = Bounds {
            max_request_bytes: limits.max_request_bytes,
            body_timeout: limits.request_body_timeout,
        };
        let watch = Admission::new(calls.clone(), api.clone(), bounds.clone(), None);
        // A List or Get takes a slot once its request is whole; beyond
        // the limit it is shed with RESOURCE_EXHAUSTED, not queued.
        let slots = Arc::new(Semaphore::new(limits.max_concurrent_unary));
        let unary = Admission::new(calls, api, bounds, Some(slots));
        Self {
            watch: BoxCloneSyncService::new(watch),
            unary: BoxCloneSyncService::new(unary),
        }
    }
}

impl NamedService for ApiService {
    const NAME: &'static str = "watchproxy.v1.WatchProxy";
}

impl Service<http::Request<Body>> for ApiService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    /// Always ready: the chosen route is made ready in `call`, so a watch
    /// never takes a slot of the List/Get limit, even for a moment.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let route = match req.uri().path() {
            WATCH_PATH => &self.watch,
            LIST_PATH | GET_PATH | PROGRESS_PATH => &self.unary,
            path => {
                let status = Status::from(ApiError::UnknownMethod {
                    path: path.to_owned(),
                });
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        Box::pin(route.clone().oneshot(req))
    }
}

/// The codecs List and Get answers may be compressed in.
pub(super) const ALL: [WireCodec; 2] = [WireCodec::Zstd, WireCodec::Gzip];

/// gRPC settings shared by every route: requests may come compressed
/// (admission has inflated gzip and zstd within its bound); answers are
/// compressed in one of `send` when the client asks for it.
pub(super) fn grpc<C: Codec>(
    codec: C,
    max: usize,
    max_request: usize,
    send: &[WireCodec],
) -> Grpc<C> {
    let mut accepted = EnabledCompressionEncodings::default();
    accepted.enable(CompressionEncoding::Gzip);
    accepted.enable(CompressionEncoding::Zstd);
    let mut enabled = EnabledCompressionEncodings::default();
    for c in send {
        enabled.enable(match c {
            WireCodec::Zstd => CompressionEncoding::Zstd,
            WireCodec::Gzip => CompressionEncoding::Gzip,
        });
    }
    let send = enabled;
    Grpc::new(codec)
        .apply_compression_config(accepted, send)
        .apply_max_message_size_config(Some(max_request), Some(max))
}

/// Each call answered by its gRPC handler: watchproxy.v1's, and etcd's
/// reads ([`super::etcd`]).
#[derive(Clone)]
pub(super) struct Calls {
    api: Api,
    /// The largest message sent.
    max: usize,
    /// The largest request message read.
    max_request: usize,
}

impl Calls {
    pub(super) fn new(api: Api, limits: &LimitsConfig) -> Self {
        Self {
            api,
            max: limits.max_message_bytes,
            max_request: limits.max_request_bytes,
        }
    }
}

impl Service<http::Request<Body>> for Calls {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let (api, max, max_request) = (self.api.clone(), self.max, self.max_request);
        Box::pin(async move {
            Ok(match req.uri().path() {
                LIST_PATH => {
                    let mut grpc = grpc(ProstCodec::default(), max, max_request, &ALL);
                    grpc.unary(ListCall(api), req).await
                }
                GET_PATH => {
                    let mut grpc = grpc(ProstCodec::default(), max, max_request, &ALL);
                    grpc.unary(GetCall(api), req).await
                }
                PROGRESS_PATH => {
                    let mut grpc = grpc(ProstCodec::default(), max, max_request, &ALL);
                    grpc.unary(ProgressCall(api), req).await
                }
                path if path.starts_with(etcd::PATHS) => {
                    etcd::answer(api, max, max_request, req).await
                }
                // Each event's bytes as the dispatcher encoded them once
                // for all its watchers. Compressed, when the client accepts
                // an offered codec, by tonic for each stream on its own:
                // the plain path; the service's own path compresses each
                // message once for all the streams that send it.
                _ => {
                    let codecs = api.watch_codecs().to_vec();
                    let latency = api.metrics().delivery_latency(ServePathLabel::tonic);
                    let mut grpc = grpc(PreEncoded(latency), max, max_request, &codecs);
                    grpc.server_streaming(WatchCall(api), req).await
                }
            })
        })
    }
}

struct ListCall(Api);

impl UnaryService<pb::ListRequest> for ListCall {
    type Response = pb::ListResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<pb::ListResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::ListRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.list(request).await })
    }
}

struct GetCall(Api);

impl UnaryService<pb::GetRequest> for GetCall {
    type Response = pb::Object;
    type Future = BoxFuture<'static, Result<tonic::Response<pb::Object>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::GetRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.get(request).await })
    }
}

struct ProgressCall(Api);

impl UnaryService<pb::ProgressRequest> for ProgressCall {
    type Response = pb::ProgressResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<pb::ProgressResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::ProgressRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.request_progress(request).await })
    }
}

struct WatchCall(Api);

impl ServerStreamingService<pb::WatchRequest> for WatchCall {
    type Response = WatchMessage;
    type ResponseStream = WatchStream;
    type Future = BoxFuture<'static, Result<tonic::Response<WatchStream>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::WatchRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.watch(request).await })
    }
}

/// Decodes requests with prost; writes responses that are already
/// encoded, timing each live change's delivery.
struct PreEncoded(DeliveryLatency);

impl Codec for PreEncoded {
    type Encode = WatchMessage;
    type Decode = pb::WatchRequest;
    type Encoder = PreEncoded;
    type Decoder = ProstDecoder<pb::WatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        PreEncoded(self.0.clone())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

impl Encoder for PreEncoded {
    type Item = WatchMessage;
    type Error = Status;

    fn encode(&mut self, item: WatchMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        if let Some(received) = item.received() {
            self.0.observe(WatchApi::watchproxy, received);
        }
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
