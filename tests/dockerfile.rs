//! The image's build stage can load the workspace: what the Dockerfile
//! copies before its dependency layer, and the stubs it writes there, laid
//! out in a temporary directory, where cargo must read every member and
//! resolve the locked dependencies. No Docker daemon is needed.

use std::path::Path;
use std::process::Command;

/// The build stage's instructions up to its first build, with line
/// continuations joined.
fn dependency_layer(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut layer = Vec::new();
    for line in joined.lines().map(str::trim) {
        if line.starts_with("COPY src ") {
            break;
        }
        if line.starts_with("COPY ") || line.starts_with("RUN mkdir") {
            layer.push(line.to_owned());
        }
    }
    layer
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
    let layer = dependency_layer(&dockerfile);
    assert!(
        layer.iter().any(|l| l.starts_with("RUN mkdir")),
        "the stub step: {layer:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    for step in &layer {
        if let Some(args) = step.strip_prefix("COPY ") {
            let words: Vec<&str> = args.split_whitespace().collect();
            let (dest, sources) = words.split_last().unwrap();
            for source in sources {
                let target = match dest.ends_with('/') || *dest == "./" {
                    true => dir.path().join(dest).join(source),
                    false => dir.path().join(dest),
                };
                copy(&root.join(source), &target);
            }
        } else {
            // The stubs, as the image writes them; its build is left out.
            let stubs = step.trim_start_matches("RUN ").split("&& cargo").next();
            let status = Command::new("sh")
                .args(["-c", stubs.unwrap()])
                .current_dir(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "{step}");
        }
    }
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
