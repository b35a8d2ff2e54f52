//! The generated `watchproxy.v1` protobuf types and client stubs. Only the
//! API speaks them, and the object decoder, which encodes each object once
//! as the API will send it.

tonic::include_proto!("watchproxy.v1");

/// The encoded descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("watchproxy_descriptor");
