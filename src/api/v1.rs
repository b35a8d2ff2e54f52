//! `watchproxy.v1`'s face: List, Get, Watch and RequestProgress, each a
//! handler over the read core and a gRPC method with its codec.

use std::sync::Arc;

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::server::{ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::{ProstCodec, ProstDecoder};

use super::error::ApiError;
use super::query::{GetQuery, ListQuery, WatchQuery};
use super::wire::WatchMessage;
use super::{grpc, Api, CallInfo, CallMeta, Entered, WatchStream, ALL};
use crate::access::Grant;
use crate::config::Verb;
use crate::dispatch::Inbox;
use crate::pb;
use crate::telemetry::{DeliveryLatency, ServePathLabel, WatchApi};

pub const LIST_PATH: &str = "/watchproxy.v1.WatchProxy/List";
pub const GET_PATH: &str = "/watchproxy.v1.WatchProxy/Get";
pub const WATCH_PATH: &str = "/watchproxy.v1.WatchProxy/Watch";
pub const PROGRESS_PATH: &str = "/watchproxy.v1.WatchProxy/RequestProgress";

impl Api {
    pub async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let (meta, req) = CallMeta::of(request);
        let info = CallInfo {
            method: "List",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        self.answer(&meta.metadata, info, self.list_for(&meta, &req))
            .await
    }

    /// One page of a List as every face asks for it: the caller entered
    /// and admitted, the request checked into a query, the continue
    /// tokens it is sent and gives sealed.
    pub async fn list_for(
        &self,
        meta: &CallMeta,
        req: &pb::ListRequest,
    ) -> Result<pb::ListResponse, ApiError> {
        let entered = self.enter_read(meta)?;
        let (s, scope) = self.admit(&entered, Verb::List, &req.resource, &req.namespace)?;
        let caller = &entered.identity.caller;
        let token_scope = entered.judged.auth.token_scope(caller, &scope);
        let continue_token = match req.continue_token.as_str() {
            "" => String::new(),
            sealed => self.sealer.open(sealed)?.to_owned(),
        };
        let req = pb::ListRequest {
            continue_token,
            ..req.clone()
        };
        let mut query = ListQuery::parse(&req, &s.cache.resource, &scope, token_scope)?;
        query.limit = self.user_limits.page(query.limit);
        let mut page = self.list_page(s, query, &entered.identity).await?;
        page.continue_token = self.sealer.seal(&page.continue_token);
        // A digest of every object of the resource: only for a rule that
        // covers it whole.
        if !scope.covers_whole(&req.namespace) {
            page.state_digest.clear();
        }
        Ok(page)
    }

    pub async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::Object>, Status> {
        let (meta, req) = CallMeta::of(request);
        let info = CallInfo {
            method: "Get",
            resource: &req.resource,
            label_selector: "",
            field_selector: "",
        };
        self.answer(&meta.metadata, info, self.get_for(&meta, &req))
            .await
    }

    /// A Get as every face asks for it.
    pub async fn get_for(
        &self,
        meta: &CallMeta,
        req: &pb::GetRequest,
    ) -> Result<pb::Object, ApiError> {
        let entered = self.enter_read(meta)?;
        let (s, scope) = self.admit(&entered, Verb::Get, &req.resource, &req.namespace)?;
        let query = GetQuery::parse(req, &s.cache.resource, &scope)?;
        self.get_object(s, query, &entered.identity).await
    }

    /// Starts a Watch; its stream yields each event encoded for the wire.
    /// A caller that reads the deliveries of several watches in one task
    /// passes their [`Inbox`] as a request extension; otherwise the watch
    /// gets one of its own. Timed and traced until the stream starts; how
    /// a watch ends is counted in `watchproxy_watchers_ended_total`.
    pub async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let (meta, req) = CallMeta::of(request);
        let inbox = (meta.extensions)
            .get::<Arc<Inbox>>()
            .cloned()
            .unwrap_or_else(Inbox::solo);
        let info = CallInfo {
            method: "Watch",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        self.answer(&meta.metadata, info, self.watch_for(&meta, &req, inbox))
            .await
    }

    /// A Watch as every face starts it: the caller entered, held to its
    /// watch limits and admitted, its grant held for the watch's life.
    pub async fn watch_for(
        &self,
        meta: &CallMeta,
        req: &pb::WatchRequest,
        inbox: Arc<Inbox>,
    ) -> Result<WatchStream, ApiError> {
        let entered = self.enter(meta)?;
        let place = self.user_limits.watch(&entered.identity)?;
        let (s, scope) = self.admit(&entered, Verb::Watch, &req.resource, &req.namespace)?;
        let query = WatchQuery::parse(req, &s.cache.resource, &scope)?;
        let resource = s.cache.resource.clone();
        let Entered { judged, identity } = entered;
        let grant = Grant::new(identity, Verb::Watch, resource, &req.namespace, scope);
        let held = self.auth.hold(grant, &judged);
        self.start_watch(s, query, inbox, (place, held)).await
    }
}

/// Answers a call of `watchproxy.v1` with its gRPC handler: responses up
/// to `max` bytes, requests up to `max_request`.
pub async fn answer(
    api: Api,
    max: usize,
    max_request: usize,
    req: http::Request<Body>,
) -> http::Response<Body> {
    match req.uri().path() {
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
        // Each event's bytes as the dispatcher encoded them once for all
        // its watchers. Compressed, when the client accepts an offered
        // codec, by tonic for each stream on its own: the plain path; the
        // service's own path compresses each message once for all the
        // streams that send it.
        _ => {
            let codecs = api.watch_codecs().to_vec();
            let latency = api.metrics().delivery_latency(ServePathLabel::tonic);
            let mut grpc = grpc(PreEncoded(latency), max, max_request, &codecs);
            grpc.server_streaming(WatchCall(api), req).await
        }
    }
}

struct ListCall(Api);

impl UnaryService<pb::ListRequest> for ListCall {
    type Response = pb::ListResponse;
    type Future = BoxFuture<'static, Result<Response<pb::ListResponse>, Status>>;

    fn call(&mut self, request: Request<pb::ListRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.list(request).await })
    }
}

struct GetCall(Api);

impl UnaryService<pb::GetRequest> for GetCall {
    type Response = pb::Object;
    type Future = BoxFuture<'static, Result<Response<pb::Object>, Status>>;

    fn call(&mut self, request: Request<pb::GetRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.get(request).await })
    }
}

struct ProgressCall(Api);

impl UnaryService<pb::ProgressRequest> for ProgressCall {
    type Response = pb::ProgressResponse;
    type Future = BoxFuture<'static, Result<Response<pb::ProgressResponse>, Status>>;

    fn call(&mut self, request: Request<pb::ProgressRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.request_progress(request).await })
    }
}

struct WatchCall(Api);

impl ServerStreamingService<pb::WatchRequest> for WatchCall {
    type Response = WatchMessage;
    type ResponseStream = WatchStream;
    type Future = BoxFuture<'static, Result<Response<WatchStream>, Status>>;

    fn call(&mut self, request: Request<pb::WatchRequest>) -> Self::Future {
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
