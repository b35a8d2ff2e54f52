//! The example informers of other languages, run as their users run them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// python3 with the Python package in this tree on its path (and its
/// requirements installed, or the test fails saying how to install them).
pub fn python3() -> Command {
    let hint = "run ./scripts/install-deps.sh, which installs the client package and grpcio-tools into the project's .venv";
    let python = watchproxy_testkit::require("python3", hint);
    let ok = Command::new(&python)
        .args(["-c", "import grpc, grpc_tools, grpc_status"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} with grpcio, grpcio-tools and grpcio-status is required: {hint}",
        python.display()
    );
    let mut c = Command::new(python);
    c.env(
        "PYTHONPATH",
        concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"),
    );
    c
}

/// The Python example, a user of the package.
pub fn python_informer() -> Command {
    let mut c = python3();
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python/informer.py"
    ));
    c
}

/// The Python example on asyncio (`watchproxy.aio`).
pub fn python_aio_informer() -> Command {
    let mut c = python3();
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python/informer_aio.py"
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

/// The lines a child writes to `pipe`, read on a thread of their own.
pub fn lines_of(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    lines
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
    pub fn spawn(informer: Command, target: &str, selector: &str, until: &str) -> External {
        Self::spawn_with(informer, target, selector, until, &[])
    }

    /// [`External::spawn`] with more options.
    pub fn spawn_with(
        mut informer: Command,
        target: &str,
        selector: &str,
        until: &str,
        options: &[&str],
    ) -> External {
        let mut child = informer
            .args([target, "pods", "--selector", selector, "--until", until])
            .args(options)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = lines_of(child.stderr.take().unwrap());
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

    /// Waits (blocking, up to a minute) for it to exit; what it printed
    /// on stdout.
    pub fn finish(mut self) -> (serde_json::Value, Vec<String>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.seen.extend(self.lines.try_iter());
                panic!("the informer did not finish in a minute: {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = self.child.wait().unwrap();
        let mut stdout = Vec::new();
        let pipe = self.child.stdout.take().unwrap();
        std::io::Read::read_to_end(&mut { pipe }, &mut stdout).unwrap();
        self.seen.extend(self.lines.try_iter());
        assert!(status.success(), "informer failed: {:#?}", self.seen);
        let seen = std::mem::take(&mut self.seen);
        (serde_json::from_slice(&stdout).unwrap(), seen)
    }
}

impl Drop for External {
    /// A test that fails leaves no informer behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `python -m watchproxy mirror`: the Python package's Informer, its
/// handlers printing each change.
pub struct Mirror {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Its copy, from every change printed so far: key → value.
    objects: std::cell::RefCell<std::collections::BTreeMap<String, String>>,
    /// Changes since the last `take`, as (name, kind); a marker is
    /// ("", "relisted" | "resync").
    recent: std::cell::RefCell<Vec<(String, &'static str)>>,
}

impl Mirror {
    pub fn start(target: &str, selector: &str) -> Mirror {
        Self::start_with(target, &["--selector", selector])
    }

    /// `mirror pods` with these options.
    pub fn start_with(target: &str, options: &[&str]) -> Mirror {
        let mut child = python3()
            .args(["-m", "watchproxy", target, "mirror", "pods"])
            .args(options)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        Mirror {
            child,
            lines,
            objects: Default::default(),
            recent: Default::default(),
        }
    }

    fn read(&self) {
        let printed = self.lines.try_iter();
        for line in printed.filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok()) {
            let kind = match line["type"].as_str().unwrap() {
                "ADDED" => "added",
                "MODIFIED" => "modified",
                "DELETED" => "deleted",
                _ if line["resync"] == true => "resync",
                _ => "relisted",
            };
            let name = line["name"].as_str().unwrap_or("").to_owned();
            if !name.is_empty() {
                let key = format!(
                    "/registry/pods/{}/{name}",
                    line["namespace"].as_str().unwrap()
                );
                let mut objects = self.objects.borrow_mut();
                match kind {
                    "deleted" => objects.remove(&key),
                    _ => objects.insert(key, line["value"].as_str().unwrap().to_owned()),
                };
            }
            self.recent.borrow_mut().push((name, kind));
        }
    }

    /// Its copy: key → value.
    pub fn copy(&self) -> std::collections::BTreeMap<String, String> {
        self.read();
        self.objects.borrow().clone()
    }

    /// Whether a list or resync marker came since the last `take`.
    pub fn saw_marker(&self) -> bool {
        self.read();
        self.recent.borrow().iter().any(|(name, _)| name.is_empty())
    }

    /// The changes since the last `take`.
    pub fn take(&self) -> Vec<(String, &'static str)> {
        self.read();
        std::mem::take(&mut *self.recent.borrow_mut())
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
