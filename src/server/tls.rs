//! TLS for clients: the service's certificate and, for mutual TLS, the
//! CAs client certificates are verified against, read again when their
//! files change. New handshakes use the new files; open connections keep
//! the keys they agreed. A file that cannot be used is logged and counted,
//! and the files in use stay in use.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::RwLock;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::access::{baseline, spawn_reloader, Baseline, ClientCa};
use crate::config::{ClientAuth, TlsConfig};
use crate::telemetry::{Metrics, TlsOutcome};

/// How long a client may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Tls {
    files: TlsConfig,
    /// For gRPC (ALPN `h2`), and for HTTP/1.1 as well (`h2`,
    /// `http/1.1`).
    current: RwLock<[Arc<ServerConfig>; 2]>,
    /// The client CA connections' certificates are judged by after their
    /// handshake; the files' reader sets it.
    client_ca: Arc<ClientCa>,
    /// The client CA file's contents in use, to tell its change.
    ca_read: parking_lot::Mutex<Option<Vec<u8>>>,
    metrics: Metrics,
    /// What the files held before the ones in use were read, for their
    /// reloader's first comparison.
    first_seen: parking_lot::Mutex<Option<Baseline>>,
}

impl Tls {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn load(
        files: &TlsConfig,
        client_ca: Arc<ClientCa>,
        metrics: Metrics,
    ) -> anyhow::Result<Arc<Self>> {
        let first_seen = baseline(&paths(files));
        let ca_read = ca_contents(files);
        let (config, verifier) = server_config(files)?;
        client_ca.set(verifier, false);
        info!(
            cert = %files.cert_file.display(),
            mutual = files.client_ca_file.is_some(),
            "serving TLS"
        );
        Ok(Arc::new(Self {
            files: files.clone(),
            current: RwLock::new(both(config)),
            client_ca,
            ca_read: parking_lot::Mutex::new(ca_read),
            metrics,
            first_seen: parking_lot::Mutex::new(Some(first_seen)),
        }))
    }

    /// Completes the handshake of an accepted connection with the files in
    /// use now, for HTTP/2 alone.
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.accept_with(0, tcp).await
    }

    /// [`Tls::accept`] for a listener that speaks HTTP/1.1 as well.
    pub async fn accept_http(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.accept_with(1, tcp).await
    }

    async fn accept_with(
        &self,
        alpn: usize,
        tcp: TcpStream,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let acceptor = TlsAcceptor::from(self.current.read()[alpn].clone());
        let accepted = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(accepted) => accepted,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        };
        match &accepted {
            Ok(_) => self.metrics.tls_handshake(TlsOutcome::ok),
            Err(e) => {
                debug!(error = %e, "TLS handshake failed");
                self.metrics.tls_handshake(TlsOutcome::failed);
            }
        }
        accepted
    }

    /// Reads the files again, after one of them changed; true when the
    /// client CA changed with them.
    fn reload(&self) -> bool {
        let ca_read = ca_contents(&self.files);
        match server_config(&self.files) {
            Ok((config, verifier)) => {
                *self.current.write() = both(config);
                let changed = *self.ca_read.lock() != ca_read;
                if changed {
                    self.client_ca.set(verifier, true);
                    *self.ca_read.lock() = ca_read;
                }
                self.metrics.tls_reload(TlsOutcome::ok);
                info!(
                    client_ca_changed = changed,
                    "TLS files changed; new handshakes use them"
                );
                changed
            }
            Err(e) => {
                self.metrics.tls_reload(TlsOutcome::failed);
                warn!(
                    error = format!("{e:#}"),
                    "TLS files changed but cannot be used; keeping the ones in use"
                );
                false
            }
        }
    }

    /// Reads the files again whenever they change, until `shutdown`;
    /// `ca_changed` is called when the client CA did.
    pub fn spawn_reload(
        self: Arc<Self>,
        shutdown: CancellationToken,
        ca_changed: impl Fn() + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let paths = paths(&self.files);
        let seen = (self.first_seen.lock().take()).unwrap_or_else(|| baseline(&paths));
        spawn_reloader(paths, seen, shutdown, move || {
            if self.reload() {
                ca_changed();
            }
        })
    }
}

/// `config` for HTTP/2 alone, and for HTTP/1.1 as well.
fn both(config: ServerConfig) -> [Arc<ServerConfig>; 2] {
    let mut http = config.clone();
    http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    [Arc::new(config), Arc::new(http)]
}

/// What the client CA file holds now, if there is one.
fn ca_contents(files: &TlsConfig) -> Option<Vec<u8>> {
    std::fs::read(files.client_ca_file.as_ref()?).ok()
}

/// The files a TLS section names.
fn paths(files: &TlsConfig) -> Vec<std::path::PathBuf> {
    [
        Some(&files.cert_file),
        Some(&files.key_file),
        files.client_ca_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect()
}

/// TLS 1.2 and 1.3 with rustls' safe defaults (rustls never renegotiates),
/// HTTP/2 only.
/// The client verifier, if clients are asked for certificates.
type Verifier = Option<Arc<dyn ClientCertVerifier>>;

fn server_config(files: &TlsConfig) -> anyhow::Result<(ServerConfig, Verifier)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("reading certificates from {}", files.cert_file.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{} holds no certificate",
        files.cert_file.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key_file)
        .with_context(|| format!("reading a private key from {}", files.key_file.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let mut kept = None;
    let builder = match &files.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("reading client CAs from {}", ca.display()))?;
            for cert in cas {
                roots
                    .add(cert)
                    .with_context(|| format!("a client CA in {}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match files.client_auth.unwrap_or(ClientAuth::Required) {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            let verifier = verifier
                .build()
                .with_context(|| format!("client CAs from {}", ca.display()))?;
            kept = Some(verifier.clone());
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).with_context(|| {
        format!(
            "{} and {} do not make a certificate and its key",
            files.cert_file.display(),
            files.key_file.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, kept))
}
