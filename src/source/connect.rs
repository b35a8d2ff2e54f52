//! Connecting to etcd as the configuration says (endpoints, TLS, an etcd
//! user), and the start-up check that each resource's prefix can be read.

use std::time::Duration;

use anyhow::Context;
use etcd_client::{Client, ConnectOptions, GetOptions, TlsOptions};

use super::{Etcd, EtcdError};
use crate::config::{ClientTls, EtcdConfig};

impl Etcd {
    /// Connects lazily: an etcd that is down at start is retried by the
    /// reflectors, not a startup failure.
    pub async fn connect(
        endpoints: &[String],
        timeout: Duration,
        page_size: i64,
    ) -> Result<Self, EtcdError> {
        Self::connect_with_tls(endpoints, None, timeout, page_size).await
    }

    /// The client the configuration describes, TLS files read.
    pub async fn from_config(c: &EtcdConfig) -> anyhow::Result<Self> {
        let tls = c.tls.as_ref().map(tls_options).transpose()?;
        let user = match (&c.username, &c.password_file) {
            (Some(name), Some(file)) => {
                let password = std::fs::read_to_string(file)
                    .with_context(|| format!("reading etcd's password from {}", file.display()))?;
                Some((
                    name.clone(),
                    password.trim_end_matches(['\r', '\n']).to_owned(),
                ))
            }
            _ => None,
        };
        let authenticated = user.is_some();
        let mut etcd = Self::connect_with(
            &c.endpoints,
            tls.clone(),
            user.clone(),
            c.request_timeout,
            c.list_page_size,
        )
        .await
        .map_err(|e| match e {
            EtcdError::Client(etcd_client::Error::GRpcStatus(s)) if authenticated => {
                anyhow::anyhow!(
                    "etcd refused user {:?}: {}",
                    c.username.as_deref().unwrap_or_default(),
                    s.message()
                )
            }
            e => anyhow::Error::new(e).context("configuring the etcd client"),
        })?;
        if let Some(endpoints) = &c.watch_endpoints {
            let watcher =
                Self::connect_with(endpoints, tls, user, c.request_timeout, c.list_page_size)
                    .await
                    .context("configuring the etcd client of the watches")?;
            etcd.watcher = watcher.client;
        }
        Ok(etcd)
    }

    /// Fails when etcd refuses to let this client read `prefix` (a role
    /// without that prefix, say): a setting to fix, not a fault to retry.
    /// Any other failure (etcd down) is left to the reflectors' retries.
    pub async fn check_readable(&self, prefix: &str, end: &str) -> anyhow::Result<()> {
        let options = GetOptions::new().with_range(end).with_count_only();
        match self.get(prefix, options).await {
            Err(EtcdError::Client(etcd_client::Error::GRpcStatus(s)))
                if matches!(
                    s.code(),
                    tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
                ) =>
            {
                anyhow::bail!("etcd denies reading {prefix}: {}", s.message())
            }
            Err(e) => match tls_failure(&e) {
                Some(why) => anyhow::bail!("TLS to etcd failed: {why}; check etcd.tls"),
                None => Ok(()),
            },
            Ok(_) => Ok(()),
        }
    }

    /// As [`Etcd::connect`], with TLS settings for `https://` endpoints.
    pub async fn connect_with_tls(
        endpoints: &[String],
        tls: Option<TlsOptions>,
        timeout: Duration,
        page_size: i64,
    ) -> Result<Self, EtcdError> {
        Self::connect_with(endpoints, tls, None, timeout, page_size).await
    }

    /// As [`Etcd::connect_with_tls`], as an etcd user (name, password): the
    /// user's token is taken at once, and again when etcd says it expired.
    pub async fn connect_with(
        endpoints: &[String],
        tls: Option<TlsOptions>,
        user: Option<(String, String)>,
        timeout: Duration,
        page_size: i64,
    ) -> Result<Self, EtcdError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        if let Some((name, password)) = user {
            options = options.with_user(name, password);
        }
        let client = Client::connect(endpoints, Some(options)).await?;
        Ok(Self {
            watcher: client.clone(),
            client,
            timeout,
            page_size,
            revival: Default::default(),
        })
    }
}

/// The TLS failure behind an etcd error, if there is one: a CA etcd's
/// certificate is not from, or a client certificate etcd refuses. rustls'
/// errors reach here as the text of I/O errors, so they are told by it.
fn tls_failure(e: &EtcdError) -> Option<String> {
    use std::error::Error as _;
    let mut at: Option<&(dyn std::error::Error + 'static)> = match e {
        // etcd-client's error names no source: start from what it holds.
        EtcdError::Client(etcd_client::Error::GRpcStatus(s)) => s.source(),
        EtcdError::Client(etcd_client::Error::TransportError(t)) => Some(t),
        _ => None,
    };
    while let Some(err) = at {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let text = io.to_string();
            if text.contains("certificate") || text.contains("fatal alert") {
                return Some(text);
            }
        }
        at = err.source();
    }
    None
}

/// Reads the PEM files of the etcd TLS settings.
fn tls_options(tls: &ClientTls) -> anyhow::Result<etcd_client::TlsOptions> {
    let read =
        |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &tls.server_name {
        options = options.domain_name(name.clone());
    }
    Ok(options)
}
