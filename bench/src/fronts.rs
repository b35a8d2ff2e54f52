//! The servers the watchers talk to: etcd's grpc-proxy, the floor, one
//! watchproxy (plain, TLS, with identities, etcd's API, tonic's path or a
//! baseline build) or a core and its edges.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use watchproxy_testkit::{free_port, Etcd, Spawned};

use crate::args::{Args, Target};
use crate::PREFIX;

/// The config of the watchproxy targets: one resource of pods, indexed
/// by node, and room for every watcher; `queued` for the plain path of
/// `watch.direct_delivery` (named only then: earlier builds, run as
/// baselines, refuse keys they do not know).
pub fn watchproxy_yaml(etcd_url: &str, port: u16, queued: bool) -> String {
    format!(
        "etcd: {{endpoints: [\"{etcd_url}\"]}}\nlisten: 127.0.0.1:{port}\nwatch: {{watcher_queue: 1024{}}}\nlimits: {{max_watchers: 1000000, max_watchers_per_resource: 1000000}}\nresources:\n  - name: pods\n    prefix: {PREFIX}\n    selectable_fields: [spec.nodeName]\n    indexed_fields: [spec.nodeName]\n",
        if queued { ", direct_delivery: false" } else { "" }
    )
}

/// Starts `bin` serving `config` (with `args`), once it listens on `port`.
pub async fn start_watchproxy(
    bin: &std::path::Path,
    config: &std::path::Path,
    args: &[&str],
    port: u16,
) -> anyhow::Result<Spawned> {
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut p = Spawned(child);
    wait_port(&mut p, "watchproxy", port).await?;
    Ok(p)
}

/// The CPU seconds of the processes in front so far, together.
pub fn fronts_cpu(fronts: &[Spawned]) -> f64 {
    fronts.iter().map(|p| p.figures().cpu_seconds()).sum()
}

/// Waits until `proc` listens on `port`.
pub async fn wait_port(proc: &mut Spawned, what: &str, port: u16) -> anyhow::Result<()> {
    for _ in 0..200 {
        proc.check_running(what)?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what}: nothing listens on {port}")
}

/// Starts what `target` puts in front of `etcd` (nothing for etcd itself):
/// the processes, and the endpoints the watchers dial.
pub async fn start(
    args: &Args,
    target: Target,
    etcd: &Etcd,
    start_rev: i64,
    tls: Option<&RunTls>,
) -> anyhow::Result<(Vec<Spawned>, Vec<String>)> {
    let etcd_url = etcd.client_url.clone();
    let identities = target == Target::WatchproxyTlsNodes;
    let nodes = args.nodes();
    Ok(match target {
        Target::Etcd => (vec![], vec![etcd_url.clone()]),
        Target::GrpcProxy => {
            let port = free_port();
            let child = Command::new(&args.etcd_bin)
                .args([
                    "grpc-proxy",
                    "start",
                    "--endpoints",
                    etcd_url.trim_start_matches("http://"),
                ])
                .arg(format!("--listen-addr=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting etcd grpc-proxy")?;
            let mut p = Spawned(child);
            wait_port(&mut p, "etcd grpc-proxy", port).await?;
            (vec![p], vec![format!("http://127.0.0.1:{port}")])
        }
        Target::Floor => {
            let port = free_port();
            let child = Command::new(std::env::current_exe()?)
                .arg(format!("--floor-listen=127.0.0.1:{port}"))
                .arg(format!("--floor-etcd={etcd_url}"))
                .arg(format!("--floor-start={}", start_rev + 1))
                .arg(format!("--connections={}", args.connections.max(1)))
                .stdout(Stdio::null())
                .spawn()
                .context("starting the floor")?;
            let mut p = Spawned(child);
            wait_port(&mut p, "floor", port).await?;
            (vec![p], vec![format!("127.0.0.1:{port}")])
        }
        Target::Watchproxy
        | Target::WatchproxyTonic
        | Target::WatchproxyQueued
        | Target::WatchproxyBaseline
        | Target::WatchproxyTls
        | Target::WatchproxyTlsNodes
        | Target::WatchproxyEtcd
        | Target::WatchproxyEtcdBaseline
        | Target::WatchproxyKubernetes => {
            let port = free_port();
            let config = etcd.dir().join("watchproxy.yaml");
            let mut yaml = watchproxy_yaml(&etcd_url, port, target == Target::WatchproxyQueued);
            let kubernetes_port = (target == Target::WatchproxyKubernetes).then(free_port);
            if let Some(k) = kubernetes_port {
                yaml += "    kubernetes: {group: '', version: v1, kind: Pod, plural: pods}\n";
                yaml += &format!("kubernetes_api: {{enabled: true, listen: 127.0.0.1:{k}}}\n");
            }
            if matches!(
                target,
                Target::WatchproxyEtcd | Target::WatchproxyEtcdBaseline
            ) {
                yaml += "etcd_api: {enabled: true}\n";
            }
            if let Some(tls) = &tls {
                yaml += &tls.config(etcd.dir())?;
            }
            if identities {
                yaml += &node_identities(etcd.dir(), nodes)?;
            }
            std::fs::write(&config, yaml)?;
            let bin = match (target, &args.watchproxy_bin) {
                (Target::WatchproxyBaseline | Target::WatchproxyEtcdBaseline, _) => args
                    .baseline_bin
                    .clone()
                    .context("the watchproxy-baseline targets need --baseline-bin")?,
                (_, Some(b)) => b.clone(),
                (_, None) => std::env::current_exe()?.with_file_name("watchproxy"),
            };
            let path: &[&str] = match target {
                Target::WatchproxyTonic => &["--serve-path", "tonic"],
                _ => &[],
            };
            let mut p = start_watchproxy(&bin, &config, path, port).await?;
            if let Some(k) = kubernetes_port {
                wait_port(&mut p, "watchproxy's Kubernetes API", k).await?;
                return Ok((vec![p], vec![format!("127.0.0.1:{k}")]));
            }
            let scheme = if tls.is_some() { "https" } else { "http" };
            (vec![p], vec![format!("{scheme}://127.0.0.1:{port}")])
        }
        Target::WatchproxyTiers | Target::WatchproxyReplicas => {
            let tiered = target == Target::WatchproxyTiers;
            let bin = match &args.watchproxy_bin {
                Some(b) => b.clone(),
                None => std::env::current_exe()?.with_file_name("watchproxy"),
            };
            let core_port = free_port();
            let mut fronts = Vec::new();
            let mut endpoints = Vec::new();
            // Tier 0 is the core, when there is one.
            for tier in usize::from(!tiered)..=args.edges {
                let port = if tier == 0 { core_port } else { free_port() };
                let upstream = match tier {
                    0 => String::new(),
                    _ if !tiered => String::new(),
                    _ => format!("upstream: http://127.0.0.1:{core_port}\n"),
                };
                let config = etcd.dir().join(format!("watchproxy-tier-{tier}.yaml"));
                std::fs::write(&config, upstream + &watchproxy_yaml(&etcd_url, port, false))?;
                fronts.push(start_watchproxy(&bin, &config, &[], port).await?);
                if tier > 0 {
                    endpoints.push(format!("http://127.0.0.1:{port}"));
                }
            }
            (fronts, endpoints)
        }
    })
}

/// A CA, a server certificate and, for mutual TLS, a client certificate
/// made for one run.
pub struct RunTls {
    mutual: bool,
    ca: String,
    cert: String,
    key: String,
    client_cert: String,
    client_key: String,
}

impl RunTls {
    pub fn new(mutual: bool) -> anyhow::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
        let client_key = KeyPair::generate()?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "watchproxy-bench");
        let client_cert = client.signed_by(&client_key, &ca)?;
        Ok(Self {
            mutual,
            ca: ca.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        })
    }

    /// The `tls` section of watchproxy's configuration, its files in `dir`.
    pub fn config(&self, dir: &std::path::Path) -> anyhow::Result<String> {
        let (cert, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        std::fs::write(&cert, &self.cert)?;
        std::fs::write(&key, &self.key)?;
        std::fs::write(&ca, &self.ca)?;
        let client_ca = match self.mutual {
            true => format!(", client_ca_file: {}", ca.display()),
            false => String::new(),
        };
        Ok(format!(
            "tls: {{cert_file: {}, key_file: {}{client_ca}}}\n",
            cert.display(),
            key.display(),
        ))
    }

    pub fn client(&self) -> tonic::transport::ClientTlsConfig {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .domain_name("localhost");
        match self.mutual {
            true => tls.identity(tonic::transport::Identity::from_pem(
                &self.client_cert,
                &self.client_key,
            )),
            false => tls,
        }
    }
}

/// A token per node (`token-node-K` names user `node-K`), and the rule that
/// lets each node watch its own pods.
pub fn node_identities(dir: &std::path::Path, nodes: usize) -> anyhow::Result<String> {
    let tokens = dir.join("tokens.yaml");
    let mut text = String::new();
    for k in 0..nodes {
        writeln!(text, "- {{token: token-node-{k}, user: node-{k}}}")?;
    }
    std::fs::write(&tokens, text)?;
    Ok(format!(
        "auth: {{tokens_file: {}, allow_plaintext_tokens: true}}\nauthorization:\n  rules:\n    - {{subjects: [\"*\"], resources: [pods], namespaces: [\"*\"], verbs: [watch], field_selector: \"spec.nodeName={{user}}\"}}\n",
        tokens.display()
    ))
}
