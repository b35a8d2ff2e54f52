//! What watchproxy's integration tests and its load generator share: a
//! real etcd on free loopback ports in a temporary directory ([`Etcd`]),
//! the lookup of the tools they run, and reading Prometheus text.

mod cluster;
mod etcd;
mod process;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

pub use cluster::EtcdCluster;
pub use etcd::{Etcd, EtcdOptions};
pub use process::{ProcFigures, Spawned};

/// How to get etcd, said whenever it is missing.
pub const ETCD_INSTALL_HINT: &str = "etcd is required by the integration tests and was not found. \
Install it with `sudo apt-get install -y etcd-server etcd-client` (Debian/Ubuntu), \
run ./scripts/test.sh (which installs it), or set WATCHPROXY_ETCD_BIN to an etcd binary.";

/// Where `scripts/install-deps.sh` installs the tests' tools (grpcurl,
/// Helm, Python with the client packages): the project's own `.venv`.
const PROJECT_TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin");

/// `name` in the project's `.venv`, else on the `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::iter::once(PathBuf::from(PROJECT_TOOLS))
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `name` on the `PATH`; a missing tool fails with `hint`, never skips.
pub fn require(name: &str, hint: &str) -> PathBuf {
    which(name).unwrap_or_else(|| panic!("{name} is required: {hint}"))
}

/// The etcd binary: `WATCHPROXY_ETCD_BIN`, else `etcd` on the `PATH`.
pub fn etcd_binary() -> Option<PathBuf> {
    match std::env::var_os("WATCHPROXY_ETCD_BIN") {
        Some(p) => Some(PathBuf::from(p)),
        None => which("etcd"),
    }
}

/// A loopback port free at the time of the call (another process may take
/// it before it is bound: callers retry).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a loopback port")
}

/// The whole answer to a plain HTTP/1.0 GET, headers included.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// The value of the first sample of `name` whose labels contain `labels`
/// (0 when there is none).
pub fn metric_value(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            (series == name || series.starts_with(&format!("{name}{{"))) && series.contains(labels)
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_found_by_name_and_labels() {
        let text = "# HELP x\nx_total{a=\"1\"} 3\nx_total{a=\"2\"} 4\ny 9\n";
        assert_eq!(metric_value(text, "x_total", "a=\"2\""), 4.0);
        assert_eq!(metric_value(text, "y", ""), 9.0);
        assert_eq!(metric_value(text, "z", ""), 0.0);
    }
}
