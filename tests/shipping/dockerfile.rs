//! The image's build stage can load the workspace: what the Dockerfile
//! copies before its dependency layer, and the stubs it writes there, laid
//! out in a temporary directory, where cargo must read every member and
//! resolve the locked dependencies. No Docker daemon is needed.

use std::path::Path;
use std::process::Command;

/// The build stage's COPY and stub steps, with line continuations joined:
/// up to its first build (`whole` false), or all of them.
fn build_steps(dockerfile: &str, whole: bool) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut layer = Vec::new();
    for line in joined.lines().map(str::trim) {
        if (line.starts_with("COPY src ") && !whole) || line.starts_with("FROM gcr.io") {
            break;
        }
        if (line.starts_with("COPY ") && !line.contains("--from")) || line.starts_with("RUN mkdir")
        {
            layer.push(line.to_owned());
        }
    }
    layer
}

/// Lays `steps` out in `dir` as the image's build stage does.
fn lay_out(root: &Path, dir: &Path, steps: &[String]) {
    for step in steps {
        if let Some(args) = step.strip_prefix("COPY ") {
            let words: Vec<&str> = args.split_whitespace().collect();
            let (dest, sources) = words.split_last().unwrap();
            for source in sources {
                let target = match dest.ends_with('/') || *dest == "./" {
                    true => dir.join(dest).join(source),
                    false => dir.join(dest),
                };
                copy(&root.join(source), &target);
            }
        } else {
            // The stubs, as the image writes them; its build is left out.
            let stubs = step.trim_start_matches("RUN ").split("&& cargo").next();
            let status = Command::new("sh")
                .args(["-c", stubs.unwrap()])
                .current_dir(dir)
                .status()
                .unwrap();
            assert!(status.success(), "{step}");
        }
    }
}

/// The files of `from` missing from `to` or different there.
fn differences(from: &Path, to: &Path, out: &mut Vec<String>) {
    if from.is_dir() {
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            differences(&entry.path(), &to.join(entry.file_name()), out);
        }
    } else if std::fs::read(to).ok() != std::fs::read(from).ok() {
        out.push(from.display().to_string());
    }
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

#[test]
fn the_images_dependency_layer_loads_the_whole_workspace_with_the_locked_dependencies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let layer = build_steps(&dockerfile, false);
    assert!(
        layer.iter().any(|l| l.starts_with("RUN mkdir")),
        "the stub step: {layer:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    lay_out(root, dir.path(), &layer);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo cannot load the workspace the Dockerfile lays out:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members = metadata["workspace_members"].as_array().unwrap().len();
    assert_eq!(members, 5, "every member of the workspace is read");
}

/// What the final build compiles is the source, not a stub: the binary's
/// own sources, and every workspace crate it depends on (the Rust client,
/// which the command line uses), with the protos their build scripts read.
#[test]
fn the_images_build_compiles_the_real_sources_of_everything_the_binary_uses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    lay_out(root, dir.path(), &build_steps(&dockerfile, true));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .unwrap();
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let binary = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "watchproxy")
        .unwrap();
    let mut used = vec![".".to_owned()];
    for dep in binary["dependencies"].as_array().unwrap() {
        if let (Some(path), true) = (dep["path"].as_str(), dep["kind"].is_null()) {
            let relative = Path::new(path).strip_prefix(root).unwrap();
            used.push(relative.display().to_string());
        }
    }
    assert!(used.len() > 1, "the binary uses the Rust client: {used:?}");
    let mut missing = Vec::new();
    for crate_dir in &used {
        for part in ["src", "build.rs", "proto"] {
            let from = root.join(crate_dir).join(part);
            if from.exists() {
                differences(&from, &dir.path().join(crate_dir).join(part), &mut missing);
            }
        }
    }
    differences(&root.join("proto"), &dir.path().join("proto"), &mut missing);
    assert!(
        missing.is_empty(),
        "the image builds without these files as they are: {missing:?}"
    );
}
