//! etcd's own read API, served from the caches: KV.Range and Watch of
//! package `etcdserverpb`, so etcd's clients read through watchproxy with
//! only their endpoint changed. A request's key range becomes the query of
//! the resource it lies in (`keys`); it passes the same identities,
//! rules and limits, reads the same snapshots and registers the same
//! watchers as `watchproxy.v1`. Only the messages are etcd's (`wire`).
//! A range over several resources is their parts merged (`merge`), with
//! the keys between them read from etcd when `etcd_api.outside` forwards
//! them (`forward`). Writes and etcd's other services are refused with
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

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::server::{StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::{ProstCodec, ProstDecoder};

use crate::api::{grpc, Api, ALL};
use crate::config::{EtcdApiConfig, Outside};
use crate::etcdpb::etcdserverpb::{
    AuthenticateRequest, AuthenticateResponse, RangeRequest, RangeResponse, WatchRequest,
};
use crate::telemetry::{DeliveryLatency, ServePathLabel, WatchApi};
use batch::Outgoing;
pub use watch::EtcdStream;

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

/// etcd's face: the read core's handle, and what etcd's API adds to it.
#[derive(Clone)]
pub struct EtcdApi {
    core: Api,
    /// What is done with keys outside the served prefixes.
    outside: Outside,
}

impl EtcdApi {
    pub fn new(api: Api, config: &EtcdApiConfig) -> Self {
        Self {
            core: api,
            outside: config.outside,
        }
    }
}

/// Answers one of etcd's reads with its gRPC handler.
pub async fn answer(
    api: EtcdApi,
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
            let latency = api.core.metrics().delivery_latency(ServePathLabel::tonic);
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

struct LoginCall(EtcdApi);

impl UnaryService<AuthenticateRequest> for LoginCall {
    type Response = AuthenticateResponse;
    type Future = BoxFuture<'static, Result<Response<AuthenticateResponse>, Status>>;

    fn call(&mut self, request: Request<AuthenticateRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.etcd_authenticate(request).await })
    }
}

struct RangeCall(EtcdApi);

impl UnaryService<RangeRequest> for RangeCall {
    type Response = RangeResponse;
    type Future = BoxFuture<'static, Result<Response<RangeResponse>, Status>>;

    fn call(&mut self, request: Request<RangeRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.etcd_range(request).await })
    }
}

struct WatchCall {
    api: EtcdApi,
    /// The largest response, past which a watch's changes are split.
    max: usize,
}

impl StreamingService<WatchRequest> for WatchCall {
    type Response = Outgoing;
    type ResponseStream = EtcdStream;
    type Future = BoxFuture<'static, Result<Response<EtcdStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<WatchRequest>>) -> Self::Future {
        let (api, max) = (self.api.clone(), self.max);
        Box::pin(async move { api.etcd_watch(request, max).await })
    }
}
