//! The client stubs, from the service's own proto (one source for the
//! server and every client).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The service's own proto, linked into the crate so it is packaged.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    tonic_prost_build::configure()
        .build_server(false)
        .btree_map(".")
        .compile_protos(
            &[root.join("watchproxy/v1/watchproxy.proto")],
            std::slice::from_ref(&root),
        )?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
