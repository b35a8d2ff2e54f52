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
    Ok(())
}
