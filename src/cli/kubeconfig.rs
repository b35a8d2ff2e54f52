//! `watchproxy kubeconfig`: a kubeconfig that points kubectl and every
//! Kubernetes client library at watchproxy's Kubernetes API. Files are
//! named, never copied in: a key or token does not reach the output.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use watchproxy::config::Config;

#[derive(Args)]
pub struct Kubeconfig {
    /// The service's configuration: the server is its
    /// `kubernetes_api.listen`, over TLS when it has a `tls` section.
    #[arg(long, env = "WATCHPROXY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The server's URL, e.g. https://watchproxy.example:6443; overrides
    /// the one the configuration gives.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The CA certificate (PEM) that signed the server's certificate. With
    /// --config and TLS, by default the server's own certificate
    /// (`tls.cert_file`), which clients trust as it is when it is
    /// self-signed.
    #[arg(long, value_name = "FILE")]
    certificate_authority: Option<PathBuf>,
    /// The user's client certificate (PEM); with --client-key.
    #[arg(long, requires = "client_key", value_name = "FILE")]
    client_certificate: Option<PathBuf>,
    /// The private key (PEM) of --client-certificate.
    #[arg(long, requires = "client_certificate", value_name = "FILE")]
    client_key: Option<PathBuf>,
    /// A file holding the user's bearer token (or JWT); clients read it
    /// again as it is rotated.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The name of the cluster, user and context it defines.
    #[arg(long, default_value = "watchproxy")]
    name: String,
}

/// Prints the kubeconfig `args` describe.
pub fn kubeconfig(args: Kubeconfig) -> anyhow::Result<()> {
    let config = (args.config.as_deref())
        .map(|path| Config::from_file(path).with_context(|| format!("reading {}", path.display())))
        .transpose()?;
    let server = match (&args.server, &config) {
        (Some(server), _) => server.clone(),
        (None, Some(config)) => server_of(config, args.config.as_deref().unwrap_or(Path::new("")))?,
        (None, None) => bail!("give --config (the service's configuration) or --server"),
    };
    let ca = (args.certificate_authority.clone())
        .or_else(|| config.as_ref()?.tls.as_ref().map(|t| t.cert_file.clone()));
    let mut cluster = json!({"server": server});
    match (ca, server.starts_with("https://")) {
        (Some(ca), true) => cluster["certificate-authority"] = json!(absolute(&ca)?),
        (_, true) => {}
        // Plain text has no certificate to verify; @kubernetes/client-node
        // refuses an http:// server unless told so.
        (_, false) => cluster["insecure-skip-tls-verify"] = json!(true),
    }
    let mut user = json!({});
    if let (Some(cert), Some(key)) = (&args.client_certificate, &args.client_key) {
        user["client-certificate"] = json!(absolute(cert)?);
        user["client-key"] = json!(absolute(key)?);
    }
    if let Some(token) = &args.token_file {
        user["tokenFile"] = json!(absolute(token)?);
    }
    let name = &args.name;
    let document = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    });
    print!("{}", serde_yaml_ng::to_string(&document)?);
    Ok(())
}

/// The URL of a configuration's Kubernetes API: a wildcard address is
/// reached on loopback.
fn server_of(config: &Config, path: &Path) -> anyhow::Result<String> {
    let api = &config.kubernetes_api;
    let listen = match (api.enabled, api.listen) {
        (true, Some(listen)) => listen,
        _ => bail!(
            "{} does not enable kubernetes_api: set kubernetes_api: {{enabled: true, listen: ...}}",
            path.display()
        ),
    };
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => {
            SocketAddr::from(([127, 0, 0, 1], listen.port()))
        }
        ip if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    };
    let scheme = match config.tls {
        Some(_) => "https",
        None => "http",
    };
    Ok(format!("{scheme}://{host}"))
}

/// A file's absolute path, as a kubeconfig read from anywhere needs.
fn absolute(path: &Path) -> anyhow::Result<String> {
    let path = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    Ok(path.display().to_string())
}
