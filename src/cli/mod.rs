//! The client commands, shaped like kubectl's: `get`, `list` and `watch`
//! of a running watchproxy, made through the Rust client (its TLS, bearer
//! tokens and decoded error details), with kubectl's flags and outputs.

pub mod demo;
pub mod kubeconfig;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::Code;
use watchproxy_client::pb::{GetRequest, ListRequest, WatchRequest};
use watchproxy_client::{Client, Error};

use output::Printer;
pub use output::{say, Format};

/// The exit codes, so that a script can tell what happened.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  any other failure
  2  a bad command line or request (INVALID_ARGUMENT)
  3  no such resource or object (NOT_FOUND)
  4  not allowed (UNAUTHENTICATED, PERMISSION_DENIED)
  5  the server cannot be reached or is not ready (UNAVAILABLE, DEADLINE_EXCEEDED)
  6  the resource version is too old (OUT_OF_RANGE): list again
  74 the output cannot be written";

/// Where the server is and who the caller is.
#[derive(Args, Clone)]
pub struct Connection {
    /// The server: host:port, http://host:port or https://host:port. Without
    /// a scheme, https when --ca is given, else http.
    #[arg(
        long,
        env = "WATCHPROXY_SERVER",
        default_value = "127.0.0.1:50051",
        value_name = "ADDRESS"
    )]
    server: String,
    /// The CA certificate (PEM) that signed the server's certificate: calls
    /// go over TLS.
    #[arg(long, env = "WATCHPROXY_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// A client certificate (PEM), for a server that asks for one; with --key.
    #[arg(long, env = "WATCHPROXY_CERT", requires = "key", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "WATCHPROXY_KEY", requires = "cert", value_name = "FILE")]
    key: Option<PathBuf>,
    /// The name the server's certificate carries, when it is not the host
    /// of --server.
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// A file holding the bearer token sent with every call; read again
    /// when it changes (a rotated service-account token). Sent in plain
    /// text only to a loopback address, unless --insecure-plaintext-token.
    #[arg(long, env = "WATCHPROXY_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Sends --token-file's token without TLS to an address other than
    /// loopback: anyone on the way can read it and call as its owner.
    #[arg(long)]
    insecure_plaintext_token: bool,
}

/// Which objects, and how they are shown.
#[derive(Args)]
pub struct Selection {
    /// The resource, as the server's configuration names it (e.g. pods).
    resource: String,
    /// Only the objects of this namespace. Without it, every namespace.
    #[arg(short, long, conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// Every namespace (the default, accepted as kubectl's flag).
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// A label selector, e.g. `app=web,tier!=db` or `env in (prod,qa)`.
    #[arg(short = 'l', long, default_value = "", value_name = "SELECTOR")]
    selector: String,
    /// A field selector over metadata.name, metadata.namespace and the
    /// resource's selectable fields, e.g. `spec.nodeName=node-7`.
    #[arg(long, default_value = "", value_name = "SELECTOR")]
    field_selector: String,
    /// How objects are printed: a table (with `wide`, their labels too),
    /// `json` or `yaml` documents (a List for several; one
    /// `{"type","object"}` per event for a watch), or `name` (resource/name).
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
    #[command(flatten)]
    connection: Connection,
}

/// How a list is read.
#[derive(Args)]
pub struct Paging {
    /// At most this many objects in all; 0: every one.
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Objects per List call; the pages are read at one resource version.
    /// 0: everything in one call.
    #[arg(long, default_value_t = 500, value_name = "N")]
    chunk_size: usize,
}

/// `get RESOURCE [NAME]`.
#[derive(Args)]
pub struct Get {
    #[command(flatten)]
    selection: Selection,
    /// One object by name (with -n for a namespaced resource); without it,
    /// every selected object, as `list`.
    name: Option<String>,
    #[command(flatten)]
    paging: Paging,
    /// After the objects, go on printing their changes, as `watch`.
    #[arg(short, long)]
    watch: bool,
    /// For a list or get: unset, the newest state (as consistent as etcd);
    /// `0`, whatever state the server holds now; `N`, a state not older
    /// than N. For a watch: unset, the current objects then their changes;
    /// `N`, the changes after N.
    #[arg(long, default_value = "", value_name = "VERSION")]
    resource_version: String,
}

/// `list RESOURCE`.
#[derive(Args)]
pub struct List {
    #[command(flatten)]
    selection: Selection,
    #[command(flatten)]
    paging: Paging,
    /// Unset, the newest state (as consistent as etcd); `0`, whatever state
    /// the server holds now; `N`, a state not older than N.
    #[arg(long, default_value = "", value_name = "VERSION")]
    resource_version: String,
}

/// `watch RESOURCE`.
#[derive(Args)]
pub struct Watch {
    #[command(flatten)]
    selection: Selection,
    /// Unset, the current objects (as ADDED) then their changes; `N`, the
    /// changes after N. A watch the server ends where it can be resumed
    /// (a replica going away, a rotated token) goes on from its last event.
    #[arg(long, default_value = "", value_name = "VERSION")]
    resource_version: String,
}

/// Why a command failed: its call, or what came before it.
pub enum Failure {
    Call(Error),
    Setup(anyhow::Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Call(e)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Setup(e)
    }
}

impl Failure {
    /// Prints what failed, with everything the status' details say, and
    /// gives the exit code that says what happened.
    pub fn report(self) -> ExitCode {
        match self {
            Failure::Setup(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
            Failure::Call(e) => {
                eprintln!("error: {:?}: {}", e.code(), e.message());
                if let Some(reason) = e.reason() {
                    eprintln!("  reason: {reason}");
                }
                for (key, value) in e.metadata() {
                    eprintln!("  {key}: {value}");
                }
                for v in e.field_violations() {
                    eprintln!("  field {}: {}", v.field, v.description);
                }
                if let Some(delay) = e.retry_delay() {
                    eprintln!("  retry after: {delay:?}");
                }
                ExitCode::from(exit_code(e.code()))
            }
        }
    }
}

fn exit_code(code: Code) -> u8 {
    match code {
        Code::Ok => 0,
        Code::InvalidArgument => 2,
        Code::NotFound => 3,
        Code::Unauthenticated | Code::PermissionDenied => 4,
        Code::Unavailable | Code::DeadlineExceeded => 5,
        Code::OutOfRange => 6,
        _ => 1,
    }
}

/// The server's address as a URI: `host:port` gets a scheme.
fn server_uri(c: &Connection) -> String {
    if c.server.contains("://") {
        return c.server.clone();
    }
    let scheme = if c.ca.is_some() { "https" } else { "http" };
    format!("{scheme}://{}", c.server)
}

/// Whether `uri` names a loopback address, where plain text stays on the
/// machine.
fn loopback(uri: &str) -> bool {
    let Some(host) = uri
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
    else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn read(path: &PathBuf, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))
}

async fn connect(c: &Connection) -> Result<Client, Failure> {
    let uri = server_uri(c);
    let mut builder = Client::builder(uri.clone());
    if uri.starts_with("https://") {
        let Some(ca) = &c.ca else {
            return Err(anyhow::anyhow!(
                "{uri} is TLS: give --ca, the CA certificate that signed the server's"
            )
            .into());
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "CA")?));
        if let (Some(cert), Some(key)) = (&c.cert, &c.key) {
            tls = tls.identity(Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        if let Some(name) = &c.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        builder = builder.tls(tls);
    } else if c.ca.is_some() || c.cert.is_some() {
        return Err(anyhow::anyhow!("{uri} is not TLS: --ca and --cert need https://").into());
    }
    if let Some(path) = &c.token_file {
        if !uri.starts_with("https://") && !c.insecure_plaintext_token && !loopback(&uri) {
            return Err(anyhow::anyhow!(
                "refusing to send --token-file's token in plain text to {uri}: give --ca (TLS), or --insecure-plaintext-token"
            )
            .into());
        }
        // Read once here, so a missing file fails before the call.
        read(path, "token file")?;
        builder = builder.token_file(path.clone());
    }
    Ok(builder.connect().await?)
}

impl Selection {
    fn namespace(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }

    fn printer(&self) -> Printer {
        Printer::new(self.output, &self.resource, self.namespace.is_none())
    }
}

pub async fn get(args: Get) -> Result<(), Failure> {
    let s = &args.selection;
    if args.watch {
        return watch_from(s, args.resource_version).await;
    }
    let Some(name) = args.name else {
        return list_of(s, &args.paging, args.resource_version).await;
    };
    let client = connect(&s.connection).await?;
    let object = client
        .get(GetRequest {
            resource: s.resource.clone(),
            namespace: s.namespace(),
            name,
            resource_version: args.resource_version,
            ..Default::default()
        })
        .await?;
    s.printer().one(&object);
    Ok(())
}

pub async fn list(args: List) -> Result<(), Failure> {
    list_of(&args.selection, &args.paging, args.resource_version).await
}

pub async fn watch(args: Watch) -> Result<(), Failure> {
    watch_from(&args.selection, args.resource_version).await
}

/// Pages of `chunk_size` at one version (the first page's), until `limit`.
async fn list_of(s: &Selection, paging: &Paging, resource_version: String) -> Result<(), Failure> {
    let client = connect(&s.connection).await?;
    let mut printer = s.printer();
    let mut request = ListRequest {
        resource: s.resource.clone(),
        namespace: s.namespace(),
        label_selector: s.selector.clone(),
        field_selector: s.field_selector.clone(),
        resource_version,
        ..Default::default()
    };
    let mut shown = 0;
    loop {
        let left = (paging.limit > 0).then(|| paging.limit - shown);
        let page = match (paging.chunk_size, left) {
            (0, None) => 0,
            (0, Some(left)) => left,
            (chunk, None) => chunk,
            (chunk, Some(left)) => chunk.min(left),
        };
        request.limit = page as i64;
        let answer = client.list(request.clone()).await?;
        let take = left.map_or(answer.items.len(), |l| l.min(answer.items.len()));
        printer.page(&answer.items[..take]);
        shown += take;
        if answer.continue_token.is_empty() || left.is_some_and(|l| l == take) {
            printer.end_list(&answer.resource_version);
            return Ok(());
        }
        // The token carries the version the pages are read at.
        request.resource_version.clear();
        request.continue_token = answer.continue_token;
    }
}

/// Attempts in a row, with no event in between, before a watch gives up.
const WATCH_ATTEMPTS: u32 = 30;

/// Prints the watch's events; after an end that says where to resume (a
/// replica going away, a rotated token), watches again from there.
async fn watch_from(s: &Selection, mut resume: String) -> Result<(), Failure> {
    let client = connect(&s.connection).await?;
    let mut printer = s.printer();
    let mut attempts = 0;
    loop {
        let request = WatchRequest {
            resource: s.resource.clone(),
            namespace: s.namespace(),
            label_selector: s.selector.clone(),
            field_selector: s.field_selector.clone(),
            resource_version: resume.clone(),
            allow_bookmarks: true,
            ..Default::default()
        };
        let ended = match client.watch(request).await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Ok(Some(event)) => {
                        attempts = 0;
                        if !event.resume_resource_version.is_empty() {
                            resume.clone_from(&event.resume_resource_version);
                        }
                        printer.event(&event);
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => break e,
                }
            },
            Err(e) => e,
        };
        attempts += 1;
        if let Some(named) = ended.resume_resource_version() {
            resume = named.to_owned();
        }
        let resumable = match ended.code() {
            Code::Unavailable => !resume.is_empty(),
            _ => ended.is_credential_end() && client.renewable(),
        };
        if !resumable || attempts >= WATCH_ATTEMPTS {
            return Err(ended.into());
        }
        eprintln!("# {}; resuming from {resume}", ended.message());
        tokio::time::sleep(ended.retry_delay().unwrap_or(Duration::from_secs(1))).await;
    }
}
