//! A typed client over the generated stubs: one or more replicas (calls
//! are balanced across them, and move when one goes away), TLS, and a
//! bearer token sent with every call: a fixed one, or one read again from
//! a file or a function, so that a watch the server ends for its
//! credential resumes with a fresh one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use crate::error::Error;
use crate::pb::watch_proxy_client::WatchProxyClient;
use crate::pb::{GetRequest, ListRequest, ListResponse, Object, WatchEvent, WatchRequest};

type Stub = WatchProxyClient<InterceptedService<Channel, Credentials>>;

/// A connection to watchproxy; cheap to clone, and clones share it.
#[derive(Clone)]
pub struct Client {
    stub: Stub,
    /// Its token is read again for every call.
    renewable: bool,
}

/// How a [`Client`] connects.
#[derive(Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    tls: Option<ClientTlsConfig>,
    token: Option<Token>,
    connect_timeout: Duration,
}

/// The token file's contents as last read, and when it was written.
type Seen = Arc<Mutex<Option<(SystemTime, MetadataValue<Ascii>)>>>;

/// Where the bearer token comes from.
#[derive(Clone)]
enum Token {
    Fixed(String),
    /// Read again when the file changes (a projected service-account
    /// token is rewritten before it expires).
    File {
        path: PathBuf,
        seen: Seen,
    },
    Function(Arc<dyn Fn() -> String + Send + Sync>),
}

fn bearer(token: &str) -> Result<MetadataValue<Ascii>, tonic::Status> {
    format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| tonic::Status::invalid_argument("the token is not valid header text"))
}

impl Token {
    fn current(&self) -> Result<MetadataValue<Ascii>, tonic::Status> {
        match self {
            Token::Fixed(token) => bearer(token),
            Token::Function(f) => bearer(&f()),
            Token::File { path, seen } => {
                let unreadable = |e: std::io::Error| {
                    tonic::Status::unauthenticated(format!(
                        "reading the token file {}: {e}",
                        path.display()
                    ))
                };
                let modified = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .map_err(unreadable)?;
                let mut seen = seen.lock();
                match &*seen {
                    Some((at, value)) if *at == modified => Ok(value.clone()),
                    _ => {
                        let value = bearer(&std::fs::read_to_string(path).map_err(unreadable)?)?;
                        *seen = Some((modified, value.clone()));
                        Ok(value)
                    }
                }
            }
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Credentials(Option<Token>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.current()?);
        }
        Ok(request)
    }
}

impl ClientBuilder {
    /// Another replica to balance calls over; a call whose replica goes
    /// away is retried by its caller on the others.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints.push(endpoint.into());
        self
    }

    /// TLS to the server (an `https://` endpoint): the CA to trust, and a
    /// client certificate where the server asks for one.
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A bearer token (a static token or a JWT) sent with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(Token::Fixed(token.into()));
        self
    }

    /// A bearer token read from `path`, again whenever the file changes:
    /// a projected service-account token, rotated before it expires.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token = Some(Token::File {
            path: path.into(),
            seen: Arc::default(),
        });
        self
    }

    /// A bearer token `token` gives for every call.
    pub fn token_fn(mut self, token: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.token = Some(Token::Function(Arc::new(token)));
        self
    }

    /// How long a connection may take to open (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// A client that connects on its first call, and reconnects as needed:
    /// what an informer that must outlive a replica wants.
    pub fn connect_lazy(self) -> Result<Client, Error> {
        let mut endpoints = self.endpoints()?;
        let channel = match endpoints.len() {
            1 => endpoints.remove(0).connect_lazy(),
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        self.client(channel)
    }

    /// Connects now, so a wrong address or certificate fails here (with
    /// several replicas, connections are made as calls need them).
    pub async fn connect(self) -> Result<Client, Error> {
        let mut endpoints = self.endpoints()?;
        let channel = match endpoints.len() {
            1 => endpoints.remove(0).connect().await?,
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        self.client(channel)
    }

    fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        if self.endpoints.is_empty() {
            return Err(Error::local(Code::InvalidArgument, "no endpoint"));
        }
        let mut endpoints = Vec::with_capacity(self.endpoints.len());
        for uri in &self.endpoints {
            let mut endpoint = Endpoint::from_shared(uri.clone())
                .map_err(|e| Error::local(Code::InvalidArgument, format!("endpoint {uri:?}: {e}")))?
                .connect_timeout(self.connect_timeout)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .keep_alive_while_idle(true);
            if let Some(tls) = &self.tls {
                endpoint = endpoint.tls_config(tls.clone())?;
            }
            endpoints.push(endpoint);
        }
        Ok(endpoints)
    }

    fn client(&self, channel: Channel) -> Result<Client, Error> {
        if let Some(Token::Fixed(token)) = &self.token {
            bearer(token).map_err(|_| {
                Error::local(Code::InvalidArgument, "the token is not valid header text")
            })?;
        }
        let renewable = matches!(self.token, Some(Token::File { .. } | Token::Function(_)));
        let stub = WatchProxyClient::with_interceptor(channel, Credentials(self.token.clone()))
            .max_decoding_message_size(usize::MAX);
        Ok(Client { stub, renewable })
    }
}

impl Client {
    /// `endpoint` is `http://host:port` or, with [`ClientBuilder::tls`],
    /// `https://host:port`.
    pub fn builder(endpoint: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            endpoints: vec![endpoint.into()],
            tls: None,
            token: None,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// A plain-text client of `endpoint`, connected now.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client, Error> {
        Client::builder(endpoint).connect().await
    }

    /// Whether a call after a credential's end can carry a fresh one: its
    /// token comes from a file or a function.
    pub fn renewable(&self) -> bool {
        self.renewable
    }

    /// One page of a List.
    pub async fn list(&self, request: ListRequest) -> Result<ListResponse, Error> {
        Ok(self.stub.clone().list(request).await?.into_inner())
    }

    /// Every page of a List at one version: the items and that version.
    pub async fn list_all(&self, mut request: ListRequest) -> Result<(Vec<Object>, String), Error> {
        let mut items = Vec::new();
        loop {
            let page = self.list(request.clone()).await?;
            items.extend(page.items);
            if page.continue_token.is_empty() {
                return Ok((items, page.resource_version));
            }
            request.continue_token = page.continue_token;
        }
    }

    /// One object by namespace and name.
    pub async fn get(&self, request: GetRequest) -> Result<Object, Error> {
        Ok(self.stub.clone().get(request).await?.into_inner())
    }

    /// A watch's stream of events; an error here is the server refusing
    /// it, one from [`Watch::next`] the server ending it.
    pub async fn watch(&self, request: WatchRequest) -> Result<Watch, Error> {
        let stream = self.stub.clone().watch(request).await?.into_inner();
        Ok(Watch { stream })
    }

    /// The generated stub, for what this client does not wrap.
    pub fn stub(&self) -> Stub {
        self.stub.clone()
    }
}

/// An open watch; also a `Stream` of its events.
pub struct Watch {
    stream: tonic::Streaming<WatchEvent>,
}

impl futures_core::Stream for Watch {
    type Item = Result<WatchEvent, Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = std::pin::Pin::new(&mut self.stream).poll_next(cx);
        next.map(|event| event.map(|e| e.map_err(Error::from)))
    }
}

impl Watch {
    /// The next event; `Ok(None)` when the server ended the watch without
    /// an error (its `timeout_seconds` passed).
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, Error> {
        Ok(self.stream.message().await?)
    }
}
