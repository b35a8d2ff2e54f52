//! A real single-member etcd on free loopback ports, its data in a
//! temporary directory; killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use etcd_client::Client;

use super::{etcd_binary, free_port, http_get, metric_value, ETCD_INSTALL_HINT};

/// How an etcd is run.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `--experimental-watch-progress-notify-interval`; none: etcd's
    /// default of ten minutes, as most deployments run it.
    pub progress_interval: Option<&'static str>,
    pub log_level: &'static str,
    pub quota_backend_bytes: Option<u64>,
    /// Data on tmpfs (`/dev/shm`) where there is one, so that the disk's
    /// fsync latency is not part of what is measured.
    pub tmpfs: bool,
    /// The etcd to run; none: [`etcd_binary`].
    pub binary: Option<PathBuf>,
    /// More flags, e.g. `--auth-token-ttl=3`.
    pub extra_args: Vec<String>,
    /// Serve clients over TLS (`extra_args` then name the certificate
    /// files); the test kit's own clients connect with these options.
    pub client_tls: Option<etcd_client::TlsOptions>,
}

impl EtcdOptions {
    /// For load runs: `binary`, data on tmpfs (the disk's fsync latency is
    /// not what is measured, and it is the same for every target), an
    /// 8 GiB quota, no progress notifications, errors only in the log.
    pub fn for_load(binary: PathBuf) -> Self {
        Self {
            progress_interval: None,
            log_level: "error",
            quota_backend_bytes: Some(8 << 30),
            tmpfs: true,
            binary: Some(binary),
            ..Self::default()
        }
    }
}

impl Default for EtcdOptions {
    /// Progress notifications every second, so idle resources advance
    /// quickly in tests.
    fn default() -> Self {
        Self {
            progress_interval: Some("1s"),
            log_level: "warn",
            quota_backend_bytes: None,
            tmpfs: false,
            binary: None,
            extra_args: Vec::new(),
            client_tls: None,
        }
    }
}

pub struct Etcd {
    pub client_url: String,
    peer_url: String,
    /// Unique member name: a port picked free may be taken by another
    /// etcd before this one binds it, so readiness checks that the member
    /// answering is this one.
    name: String,
    options: EtcdOptions,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

enum Launch {
    Ready,
    PortTaken,
}

impl Etcd {
    /// An etcd for a test, with [`EtcdOptions::default`]; fails the test
    /// with how to install etcd when it is missing.
    pub async fn start() -> Etcd {
        Self::start_with(EtcdOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// An etcd with etcd's own default of ten minutes between progress
    /// notifications.
    pub async fn start_with_default_progress() -> Etcd {
        let options = EtcdOptions {
            progress_interval: None,
            ..EtcdOptions::default()
        };
        Self::start_with(options)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    pub async fn start_with(options: EtcdOptions) -> anyhow::Result<Etcd> {
        let dir = match options.tmpfs && std::path::Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm")?,
            false => tempfile::tempdir()?,
        };
        let name = dir.path().file_name().unwrap().to_string_lossy().into();
        let mut etcd = Etcd {
            client_url: String::new(),
            peer_url: String::new(),
            name,
            options,
            dir,
            child: None,
        };
        for _ in 0..5 {
            let scheme = match etcd.options.client_tls {
                Some(_) => "https",
                None => "http",
            };
            etcd.client_url = format!("{scheme}://127.0.0.1:{}", free_port());
            etcd.peer_url = format!("http://127.0.0.1:{}", free_port());
            match etcd.launch().await? {
                Launch::Ready => return Ok(etcd),
                Launch::PortTaken => continue,
            }
        }
        bail!("etcd found no free ports in 5 attempts")
    }

    /// Starts the member and waits until it, not another process on its
    /// port, answers.
    async fn launch(&mut self) -> anyhow::Result<Launch> {
        let binary = match &self.options.binary {
            Some(b) => b.clone(),
            None => etcd_binary().context(ETCD_INSTALL_HINT)?,
        };
        let log = std::fs::File::create(self.dir.path().join("etcd.log"))?;
        let mut command = Command::new(&binary);
        command
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.client_url])
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .arg(format!("--initial-cluster={}={}", self.name, self.peer_url))
            .args(["--logger", "zap", "--log-level", self.options.log_level]);
        if let Some(interval) = self.options.progress_interval {
            command.args(["--experimental-watch-progress-notify-interval", interval]);
        }
        if let Some(bytes) = self.options.quota_backend_bytes {
            command.arg(format!("--quota-backend-bytes={bytes}"));
        }
        command.args(&self.options.extra_args);
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}. {ETCD_INSTALL_HINT}", binary.display()))?;
        self.child = Some(child);
        for _ in 0..200 {
            if let Ok(mut c) = Client::connect([&self.client_url], self.connect_options()).await {
                if let Ok(members) = c.member_list().await {
                    if members.members().iter().any(|m| m.name() == self.name) {
                        return Ok(Launch::Ready);
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait()? {
                self.child = None;
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                if log.contains("address already in use") {
                    let _ = std::fs::remove_dir_all(self.dir.path().join("data"));
                    return Ok(Launch::PortTaken);
                }
                bail!("etcd exited with {status}:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("etcd did not become healthy at {}", self.client_url)
    }

    fn connect_options(&self) -> Option<etcd_client::ConnectOptions> {
        let tls = self.options.client_tls.clone()?;
        Some(etcd_client::ConnectOptions::new().with_tls(tls))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The temporary directory the member's data and log are in.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The process id of the running member.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the same member again on the same data and ports.
    pub async fn restart(&mut self) {
        self.stop();
        match self.launch().await {
            Ok(Launch::Ready) => {}
            Ok(Launch::PortTaken) => panic!("another process took etcd's port {}", self.client_url),
            Err(e) => panic!("{e:#}"),
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect([&self.client_url], self.connect_options())
            .await
            .unwrap()
    }

    /// A number from etcd's own Prometheus metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let addr = self.client_url.trim_start_matches("http://");
        metric_value(&http_get(addr, "/metrics"), name, "")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
