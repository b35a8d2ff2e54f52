fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(false)
        .bytes(".")
        .btree_map(".")
        .file_descriptor_set_path(out.join("watchproxy_descriptor.bin"))
        .compile_protos(&["proto/watchproxy/v1/watchproxy.proto"], &["proto"])?;
    // etcd's own API, served by the facade: messages only, routed by hand.
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .bytes(".mvccpb")
        .bytes(".etcdserverpb")
        .file_descriptor_set_path(out.join("etcd_descriptor.bin"))
        .compile_protos(
            &["proto/etcd/etcd/api/etcdserverpb/rpc.proto"],
            &["proto/etcd"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    build_info();
    Ok(())
}

/// The git commit of the build, for `watchproxy_build_info`: taken from
/// `WATCHPROXY_GIT` when set (an image built without the repository),
/// else from the checkout, else "unknown".
fn build_info() {
    println!("cargo:rerun-if-env-changed=WATCHPROXY_GIT");
    let commit = std::env::var("WATCHPROXY_GIT").ok().or_else(|| {
        let head = std::fs::read_to_string(".git/HEAD").ok()?;
        println!("cargo:rerun-if-changed=.git/HEAD");
        let reference = head
            .trim()
            .strip_prefix("ref: ")
            .map(|r| format!(".git/{r}"));
        for watched in reference
            .iter()
            .map(String::as_str)
            .chain([".git/packed-refs"])
        {
            if std::path::Path::new(watched).exists() {
                println!("cargo:rerun-if-changed={watched}");
            }
        }
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    println!(
        "cargo:rustc-env=WATCHPROXY_GIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
