//! The example informers of other languages, run as their users run them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The Python example, on the package in this tree.
pub fn python_informer() -> Command {
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, grpc_status"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "python3 with grpcio, grpcio-tools and grpcio-status is required: run ./scripts/install-deps.sh (pip install grpcio grpcio-tools grpcio-status)");
    let mut c = Command::new("python3");
    c.env(
        "PYTHONPATH",
        concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"),
    )
    .arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python/informer.py"
    ));
    c
}

pub fn node_informer() -> Command {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/node");
    let ok = Command::new("node")
        .arg("--version")
        .status()
        .is_ok_and(|s| s.success())
        && std::path::Path::new(dir)
            .join("node_modules/@grpc/grpc-js")
            .is_dir();
    assert!(ok, "Node.js with the example's packages is required: run ./scripts/install-deps.sh (npm ci --prefix examples/node)");
    let mut c = Command::new("node");
    c.arg(format!("{dir}/informer.js"));
    c
}

/// A running example informer and the log lines it wrote so far.
pub struct External {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl External {
    /// Mirrors `resource` with `selector` from `target` until an object
    /// named `until` appears.
    pub fn spawn(mut informer: Command, target: &str, selector: &str, until: &str) -> External {
        let mut child = informer
            .args([target, "pods", "--selector", selector, "--until", until])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        External {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (blocking) for the informer to log `event` for the `nth` time.
    pub fn wait_for_log(&mut self, event: &str, nth: usize) {
        while self.seen.iter().filter(|l| l.contains(event)).count() < nth {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "no {event:?} #{nth} from the informer; it said: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits (blocking) for it to exit; what it printed on stdout.
    pub fn finish(mut self) -> (serde_json::Value, Vec<String>) {
        let out = self.child.wait_with_output().unwrap();
        self.seen.extend(self.lines.try_iter());
        assert!(out.status.success(), "informer failed: {:#?}", self.seen);
        (serde_json::from_slice(&out.stdout).unwrap(), self.seen)
    }
}
