//! The routes: every face's methods as one tower service each, behind
//! admission ([`super::admission`]). This is the one file that knows every
//! face: `watchproxy.v1` ([`crate::api::v1`]) and etcd's read API
//! ([`crate::etcd_api`]). List, Get and Range take a slot of a concurrency
//! limit that sheds load (RESOURCE_EXHAUSTED at once) rather than queueing
//! when it is reached; a watch must not hold a slot of that limit for its
//! whole life, so Watch goes around it.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::admission::{Admission, Bounds};
use crate::api::error::ApiError;
use crate::api::{v1, Api};
use crate::config::LimitsConfig;
use crate::etcd_api::{self, EtcdApi};

type HttpService = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

/// A health check's request names one service.
pub const HEALTH_REQUEST_BYTES: usize = 1024;
/// A reflection request names a file, a symbol or an extension.
pub const REFLECTION_REQUEST_BYTES: usize = 4 * 1024;
/// etcd's login: a user name and a password.
pub const AUTHENTICATE_REQUEST_BYTES: usize = 4 * 1024;

/// `grpc.health.v1` behind the bounds a health check needs: its request
/// read whole within the body deadline, at most [`HEALTH_REQUEST_BYTES`];
/// no caller identified (a probe presents nothing).
#[derive(Clone)]
pub struct HealthRoute(HttpService);

impl HealthRoute {
    pub fn new<S: super::routes::Routes + Sync>(health: S, limits: &LimitsConfig) -> Self {
        let bounds = Bounds {
            max_request_bytes: HEALTH_REQUEST_BYTES,
            body_timeout: limits.request_body_timeout,
        };
        Self(BoxCloneSyncService::new(Admission::unidentified(
            health, bounds, None,
        )))
    }
}

impl NamedService for HealthRoute {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<Body>> for HealthRoute {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        self.0.call(req)
    }
}

#[derive(Clone)]
pub struct ApiService {
    watch: HttpService,
    unary: HttpService,
}

impl ApiService {
    pub fn new(calls: Calls, limits: &LimitsConfig) -> Self {
        let api = calls.api.clone();
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
            v1::WATCH_PATH => &self.watch,
            v1::LIST_PATH | v1::GET_PATH | v1::PROGRESS_PATH => &self.unary,
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

/// The faces served: `watchproxy.v1` always, etcd's API when enabled.
#[derive(Clone)]
pub struct Faces {
    pub api: Api,
    pub etcd: Option<EtcdApi>,
}

/// Each call answered by its face's gRPC handler: watchproxy.v1's, and
/// etcd's reads when that face is served.
#[derive(Clone)]
pub struct Calls {
    api: Api,
    etcd: Option<EtcdApi>,
    /// The largest message sent.
    max: usize,
    /// The largest request message read.
    max_request: usize,
}

impl Calls {
    pub fn new(Faces { api, etcd }: Faces, limits: &LimitsConfig) -> Self {
        Self {
            api,
            etcd,
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
        let (max, max_request) = (self.max, self.max_request);
        let etcd = (self.etcd.clone()).filter(|_| req.uri().path().starts_with(etcd_api::PATHS));
        let api = self.api.clone();
        Box::pin(async move {
            Ok(match etcd {
                Some(etcd) => etcd_api::answer(etcd, max, max_request, req).await,
                None => v1::answer(api, max, max_request, req).await,
            })
        })
    }
}

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
    pub fn new(calls: Calls, limits: &LimitsConfig) -> Self {
        let api = calls.api.clone();
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
        // A login names its caller in its body, read before anyone is
        // identified: it may hold no more than a name and a password.
        let login_bounds = Bounds {
            max_request_bytes: AUTHENTICATE_REQUEST_BYTES,
            ..bounds
        };
        let login = Admission::unidentified(calls.clone(), login_bounds, Some(slots));
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
        etcd_api::bearer_from_token(req.headers_mut());
        let route = match req.uri().path() {
            etcd_api::RANGE_PATH => &self.range,
            etcd_api::WATCH_PATH => &self.watch,
            etcd_api::AUTHENTICATE_PATH => &self.login,
            path => {
                let method = path.trim_start_matches(etcd_api::PATHS).replace('/', ".");
                let status = Status::from(ApiError::ReadOnly { method });
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        Box::pin(route.clone().oneshot(req))
    }
}

/// The main port's routes: `base` (health, reflection), `watchproxy.v1`,
/// and etcd's services when that face is served.
pub fn routes(
    faces: &Faces,
    base: tonic::service::Routes,
    limits: &LimitsConfig,
) -> tonic::service::Routes {
    let calls = Calls::new(faces.clone(), limits);
    let routes = base.add_service(ApiService::new(calls.clone(), limits));
    if faces.etcd.is_none() {
        return routes;
    }
    let kv = EtcdService::<names::Kv>::new(calls, limits);
    routes
        .add_service(kv.named::<names::Watch>())
        .add_service(kv.named::<names::Lease>())
        .add_service(kv.named::<names::Cluster>())
        .add_service(kv.named::<names::Maintenance>())
        .add_service(kv.named::<names::Auth>())
        .add_service(kv)
}
