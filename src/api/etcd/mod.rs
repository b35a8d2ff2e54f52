//! etcd's own read API, served from the caches: KV.Range and Watch of
//! package `etcdserverpb`, so etcd's clients read through watchproxy with
//! only their endpoint changed. A request's key range becomes the query of
//! the resource it lies in ([`keys`]); it passes the same identities,
//! rules and limits, reads the same snapshots and registers the same
//! watchers as `watchproxy.v1`. Only the messages are etcd's ([`wire`]).
//! A range over several resources is their parts merged ([`merge`]), with
//! the keys between them read from etcd when `etcd_api.outside` forwards
//! them ([`forward`]). Writes and etcd's other services are refused with
//! UNIMPLEMENTED.

mod batch;
mod forward;
mod keys;
mod login;
mod merge;
mod range;
mod register;
mod watch;
mod wire;

use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::server::{NamedService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::{ProstCodec, ProstDecoder};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::admission::{Admission, Bounds};
use super::error::ApiError;
use super::service::{grpc, Calls, ALL};
use super::Api;
use crate::config::LimitsConfig;
use crate::etcdpb::etcdserverpb::{
    AuthenticateRequest, AuthenticateResponse, RangeRequest, RangeResponse, WatchRequest,
};
use crate::telemetry::{DeliveryLatency, ServePathLabel, WatchApi};
use batch::Outgoing;
pub use watch::Session;

/// Where etcd's services' methods are.
pub const PATHS: &str = "/etcdserverpb.";
pub const RANGE_PATH: &str = "/etcdserverpb.KV/Range";
pub const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";
pub const AUTHENTICATE_PATH: &str = "/etcdserverpb.Auth/Authenticate";

/// etcd's clients send the token Authenticate gave them as `token`
/// metadata: a bearer token, as watchproxy reads one.
pub fn bearer_from_token(headers: &mut http::HeaderMap) {
    if headers.contains_key(http::header::AUTHORIZATION) {
        return;
    }
    let bearer = (headers.get("token"))
        .and_then(|t| t.to_str().ok())
        .and_then(|t| http::HeaderValue::try_from(format!("Bearer {t}")).ok());
    if let Some(bearer) = bearer {
        headers.insert(http::header::AUTHORIZATION, bearer);
    }
}

type HttpService = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

/// etcd's API: one of its services, by the name `N` gives it, answering
/// every method of it (the reads, and a refusal for the rest).
pub struct EtcdService<N> {
    range: HttpService,
    watch: HttpService,
    login: HttpService,
    _name: PhantomData<fn() -> N>,
}

impl<N> Clone for EtcdService<N> {
    fn clone(&self) -> Self {
        self.named()
    }
}

/// The names of etcd's services.
pub mod names {
    macro_rules! services {
        ($($name:ident = $path:literal),* $(,)?) => {$(
            pub struct $name;
            impl tonic::server::NamedService for super::EtcdService<$name> {
                const NAME: &'static str = $path;
            }
        )*};
    }
    services!(
        Kv = "etcdserverpb.KV",
        Watch = "etcdserverpb.Watch",
        Lease = "etcdserverpb.Lease",
        Cluster = "etcdserverpb.Cluster",
        Maintenance = "etcdserverpb.Maintenance",
        Auth = "etcdserverpb.Auth",
    );
}

impl<N> EtcdService<N> {
    /// The same routes under another of etcd's service names.
    pub fn named<M>(&self) -> EtcdService<M> {
        EtcdService {
            range: self.range.clone(),
            watch: self.watch.clone(),
            login: self.login.clone(),
            _name: PhantomData,
        }
    }
}

impl<N> EtcdService<N>
where
    EtcdService<N>: NamedService,
{
    pub fn new(api: Api, limits: &LimitsConfig) -> Self {
        let calls = Calls::new(api.clone(), limits);
        let bounds = Bounds {
            max_request_bytes: limits.max_request_bytes,
            body_timeout: limits.request_body_timeout,
        };
        // A Range takes a slot of a limit the size of List and Get's.
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent_unary));
        let range = Admission::new(
            calls.clone(),
            api.clone(),
            bounds.clone(),
            Some(slots.clone()),
        );
        let login = Admission::unidentified(calls.clone(), api.clone(), bounds, Some(slots));
        Self {
            range: BoxCloneSyncService::new(range),
            watch: BoxCloneSyncService::new(Admission::streaming(calls, api)),
            login: BoxCloneSyncService::new(login),
            _name: PhantomData,
        }
    }
}

impl<N: 'static> Service<http::Request<Body>> for EtcdService<N> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        bearer_from_token(req.headers_mut());
        let route = match req.uri().path() {
            RANGE_PATH => &self.range,
            WATCH_PATH => &self.watch,
            AUTHENTICATE_PATH => &self.login,
            path => {
                let method = path.trim_start_matches(PATHS).replace('/', ".");
                let status = Status::from(ApiError::ReadOnly { method });
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        Box::pin(route.clone().oneshot(req))
    }
}

/// Answers one of etcd's reads with its gRPC handler.
pub(super) async fn answer(
    api: Api,
    max: usize,
    max_request: usize,
    req: http::Request<Body>,
) -> http::Response<Body> {
    match req.uri().path() {
        RANGE_PATH => {
            let mut grpc = grpc(ProstCodec::default(), max, max_request, &ALL);
            grpc.unary(RangeCall(api), req).await
        }
        AUTHENTICATE_PATH => {
            let mut grpc = grpc(ProstCodec::default(), max, max_request, &ALL);
            grpc.unary(LoginCall(api), req).await
        }
        _ => {
            let latency = api.metrics().delivery_latency(ServePathLabel::tonic);
            let mut grpc = grpc(WatchCodec(latency), max, max_request, &ALL);
            grpc.streaming(WatchCall { api, max }, req).await
        }
    }
}

/// Watch's messages, in a buffer that starts small: a watch is idle most
/// of its life, and tonic's default takes 8 KiB a stream up front.
struct WatchCodec(DeliveryLatency);

impl Codec for WatchCodec {
    type Encode = Outgoing;
    type Decode = WatchRequest;
    type Encoder = OutgoingEncoder;
    type Decoder = ProstDecoder<WatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        OutgoingEncoder(self.0.clone())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Writes a Watch stream's responses, their changes encoded once for
/// every stream.
struct OutgoingEncoder(DeliveryLatency);

impl Encoder for OutgoingEncoder {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, item: Outgoing, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        if let Some(received) = item.received() {
            self.0.observe(WatchApi::etcd, received);
        }
        item.encode_raw(dst);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(256, 8 * 1024)
    }
}

struct LoginCall(Api);

impl UnaryService<AuthenticateRequest> for LoginCall {
    type Response = AuthenticateResponse;
    type Future = BoxFuture<'static, Result<Response<AuthenticateResponse>, Status>>;

    fn call(&mut self, request: Request<AuthenticateRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.etcd_authenticate(request).await })
    }
}

struct RangeCall(Api);

impl UnaryService<RangeRequest> for RangeCall {
    type Response = RangeResponse;
    type Future = BoxFuture<'static, Result<Response<RangeResponse>, Status>>;

    fn call(&mut self, request: Request<RangeRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.etcd_range(request).await })
    }
}

struct WatchCall {
    api: Api,
    /// The largest response, past which a watch's changes are split.
    max: usize,
}

impl StreamingService<WatchRequest> for WatchCall {
    type Response = Outgoing;
    type ResponseStream = Session;
    type Future = BoxFuture<'static, Result<Response<Session>, Status>>;

    fn call(&mut self, request: Request<Streaming<WatchRequest>>) -> Self::Future {
        let (api, max) = (self.api.clone(), self.max);
        Box::pin(async move { api.etcd_watch(request, max).await })
    }
}
