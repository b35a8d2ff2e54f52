//! The README's quick start, as a newcomer follows it: `scripts/demo.sh`
//! reaches a served demo, and every command the quick start shows returns
//! what it says on the demo's data.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The demo script, in a process group of its own: ended as Ctrl-C would.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-INT", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

/// The commands of the README's shell blocks after `marker`, up to the
/// next section, continuation lines joined, comments dropped.
fn quick_start_commands(readme: &str, marker: &str) -> Vec<String> {
    let start = readme.find(marker).expect("the quick start");
    let section = &readme[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut current = String::new();
    for line in section.lines() {
        if line.starts_with("```") {
            in_block = !in_block && line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let line = match line.find("  # ") {
            Some(at) if !line[..at].contains('\'') || line[..at].matches('\'').count() % 2 == 0 => {
                &line[..at]
            }
            _ => line,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(part) => current += part,
            None => {
                current += line.trim_end();
                commands.push(std::mem::take(&mut current).trim().to_owned());
            }
        }
    }
    commands.retain(|c| !c.is_empty());
    commands
}

fn free_port() -> u16 {
    watchproxy_testkit::free_port()
}

#[test]
fn the_demo_serves_and_every_quick_start_command_returns_what_it_says() {
    let bin = env!("CARGO_BIN_EXE_watchproxy");
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut script = Command::new(format!("{ROOT}/scripts/demo.sh"));
    script
        .env("WATCHPROXY_BIN", bin)
        .env("WATCHPROXY_LISTEN", &listen)
        .env("WATCHPROXY_METRICS_LISTEN", &metrics)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = script.spawn().expect("scripts/demo.sh runs");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let demo = Demo(child);
    let (tx, lines) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx2.send(line);
        }
    });
    // The demo says it loaded the pods, then serves.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut etcd = String::new();
    while Instant::now() < deadline {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            if let Some(at) = line.strip_prefix("etcd:") {
                etcd = at.split_whitespace().next().unwrap().to_owned();
            }
            seen.push(line);
        }
        let ready = Command::new(bin)
            .args([
                "list", "pods", "--limit", "1", "-o", "name", "--server", &listen,
            ])
            .output()
            .unwrap();
        if ready.status.success() && !ready.stdout.is_empty() {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.starts_with("wrote 3000 pods")),
        "the demo did not load its pods:\n{}",
        seen.join("\n")
    );
    assert!(etcd.starts_with("http://127.0.0.1:"), "{seen:?}");

    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let commands = quick_start_commands(&readme, "With the demo running");
    assert!(commands.len() >= 9, "{commands:#?}");
    let path = format!(
        "{}:{}",
        std::path::Path::new(bin).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let tools = format!("{ROOT}/.venv/bin");
    for command in &commands {
        let command = command.replace("127.0.0.1:50051", &listen);
        // The client commands' default server is the demo's usual address.
        let command = match command.starts_with("watchproxy ") {
            true => format!("{command} --server {listen}"),
            false => command,
        };
        let command = command.replace("<address>", &etcd);
        let watch = command.starts_with("watchproxy watch");
        let mut run = Command::new("timeout");
        run.args([if watch { "3" } else { "30" }, "sh", "-c", &command])
            .env("PATH", format!("{tools}:{path}"));
        let out = run.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A watch goes on until it is stopped: the timeout's 124.
        let ended = match watch {
            true => out.status.code() == Some(124),
            false => out.status.success(),
        };
        assert!(ended, "`{command}`: {:?}\n{stdout}\n{stderr}", out.status);
        assert!(
            stdout.lines().filter(|l| !l.trim().is_empty()).count() >= 2,
            "`{command}` printed too little:\n{stdout}\n{stderr}"
        );
        for (shown, want) in [
            ("web-5 -n ns-5", "name: web-5"),
            ("watchproxy.v1.WatchProxy/Get", "\"name\": \"web-5\""),
            ("-o name", "pods/web-"),
            ("node-7 -o wide", "LABELS"),
            ("metadata.uid", "\"name\""),
            ("get pods -n ns-3", "NAME"),
            ("etcdctl", "/registry/pods/ns-5/"),
        ] {
            if command.contains(shown) {
                assert!(stdout.contains(want), "`{command}`:\n{stdout}");
            }
        }
        if watch {
            assert!(stdout.contains("ADDED"), "`{command}`:\n{stdout}");
        }
    }
    drop(demo);
}
