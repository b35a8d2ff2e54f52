//! etcd's own API: the messages of package `etcdserverpb` and those it
//! uses, generated from etcd's protos in `proto/etcd`. Only the etcd facade
//! (`etcd_api`) speaks them.

#[allow(clippy::all, missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

#[allow(clippy::all, missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

#[allow(clippy::all, missing_docs)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// The encoded descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("etcd_descriptor");
