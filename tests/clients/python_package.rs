//! The Python package as its users get it: `python -m build` makes an
//! sdist and a wheel from it; the wheel installs into fresh virtual
//! environments, one with exactly the lowest versions `pyproject.toml`
//! allows and one with the newest releases, and the README's two examples
//! (the informers and asyncio) run in each against watchproxy and a real
//! etcd.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python");

fn run(what: &str, command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The package's requirements as `name>=floor`, each pinned to its floor.
fn floors() -> Vec<String> {
    let pyproject = std::fs::read_to_string(format!("{PACKAGE}/pyproject.toml")).unwrap();
    let start = pyproject.find("dependencies = [").expect("dependencies");
    let list = &pyproject[start..pyproject[start..].find(']').unwrap() + start];
    let pins: Vec<String> = (list.lines().skip(1))
        .filter_map(|l| l.trim().trim_end_matches(',').strip_prefix('"'))
        .map(|req| {
            let req = req.trim_end_matches('"');
            let (name, floor) = req
                .split_once(">=")
                .unwrap_or_else(|| panic!("{req}: every requirement has a floor (name>=version)"));
            format!("{name}=={floor}")
        })
        .collect();
    assert!(pins.len() >= 4, "{pins:?}");
    pins
}

/// A fresh virtual environment with the wheel and `requirements`.
fn venv(dir: &Path, wheel: &Path, requirements: &[String]) -> PathBuf {
    let python = crate::common::python3().get_program().to_owned();
    run(
        "python -m venv",
        Command::new(&python).args(["-m", "venv"]).arg(dir),
    );
    let python = dir.join("bin/python3");
    run(
        "pip install",
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .arg(wheel)
            .args(requirements),
    );
    run(
        "pip check",
        Command::new(&python).args(["-m", "pip", "check"]),
    );
    python
}

/// The README's ```python blocks, pointed at `addr`.
fn readme_examples(addr: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(format!("{PACKAGE}/README.md")).unwrap();
    let blocks: Vec<String> = (readme.split("```python\n").skip(1))
        .map(|b| {
            b.split("```")
                .next()
                .unwrap()
                .replace("127.0.0.1:50051", addr)
        })
        .collect();
    assert_eq!(blocks.len(), 2, "the informers and the asyncio examples");
    blocks
}

/// The installed versions of the packages that bound the range.
fn versions(python: &Path) -> String {
    run(
        "versions",
        Command::new(python).args([
            "-c",
            "import importlib.metadata as m; print(*(f'{p}=={m.version(p)}' for p in ('grpcio', 'protobuf')))",
        ]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wheel_installs_with_its_oldest_and_newest_dependencies_and_its_readme_runs() {
    let etcd = Etcd::start().await;
    let mut ec = etcd.client().await;
    for i in 0..12 {
        let app = if i % 3 == 0 { "db" } else { "web" };
        let node = format!("node-{}", i % 2);
        put_pod(
            &mut ec,
            &format!("ns-{}", i % 4),
            &format!("p{i}"),
            &[("app", app)],
            &node,
        )
        .await;
    }
    let (proxy, _client) = proxy_ready(&etcd).await;
    let addr = proxy.addr.to_string();

    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let python = crate::common::python3().get_program().to_owned();
    tokio::task::block_in_place(|| {
        run(
            "python -m build",
            Command::new(&python)
                .args(["-m", "build", "--outdir"])
                .arg(&dist)
                .arg(PACKAGE),
        )
    });
    let wheel = (std::fs::read_dir(&dist).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel");
    let built: Vec<_> = std::fs::read_dir(&dist).unwrap().collect();
    assert_eq!(built.len(), 2, "an sdist and a wheel: {built:?}");

    let [informers, aio] = <[String; 2]>::try_from(readme_examples(&addr)).unwrap();
    let oldest = floors();
    for (name, requirements) in [("oldest", oldest.clone()), ("newest", vec![])] {
        let python =
            tokio::task::block_in_place(|| venv(&tmp.path().join(name), &wheel, &requirements));
        let installed = versions(&python);
        if name == "oldest" {
            for pin in oldest
                .iter()
                .filter(|p| p.starts_with("grpcio==") || p.starts_with("protobuf=="))
            {
                assert!(installed.contains(pin.as_str()), "{installed} has {pin}");
            }
        }
        eprintln!("{name}: {installed}");

        // The informers example, run from a directory without the
        // package's sources: the installed wheel is what it imports.
        let out = tokio::task::block_in_place(|| {
            run(
                &format!("the informers example ({name})"),
                Command::new(&python)
                    .args(["-c", &informers])
                    .current_dir(tmp.path()),
            )
        });
        assert!(out.contains("8 web pods, 4 on node-1"), "{name}: {out}");
        let ns1: Vec<&str> = out.lines().filter(|l| l.starts_with("ns-1 ")).collect();
        assert_eq!(ns1.len(), 2, "{name}: {out}");

        // The asyncio example prints the current pods, then the next
        // change, and ends.
        let mut child = Command::new(&python)
            .args(["-c", &aio])
            .current_dir(tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let synced = tokio::task::block_in_place(|| lines.next())
            .unwrap()
            .unwrap();
        assert!(synced.starts_with("8 web pods at "), "{name}: {synced}");
        let added = format!("{name}-pod");
        put_pod(&mut ec, "ns-9", &added, &[("app", "web")], "node-0").await;
        let printed: Vec<String> = tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut printed = Vec::new();
            while std::time::Instant::now() < deadline {
                match child.try_wait().unwrap() {
                    Some(status) => {
                        printed.extend(lines.by_ref().map_while(Result::ok));
                        let mut stderr = String::new();
                        let pipe = child.stderr.take().unwrap();
                        std::io::Read::read_to_string(&mut { pipe }, &mut stderr).unwrap();
                        assert!(status.success(), "{name}: {printed:?}\n{stderr}");
                        return printed;
                    }
                    None => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the asyncio example did not end");
        });
        assert_eq!(
            printed.last().unwrap(),
            &format!("ADDED ns-9 {added}"),
            "{name}: {printed:?}"
        );
        // The eight pods it started from, then the new one.
        assert_eq!(printed.len(), 9, "{name}: {printed:?}");
        // The next environment starts from etcd's pods as they are now.
        delete_key(&mut ec, &format!("/registry/pods/ns-9/{added}")).await;
    }
}
