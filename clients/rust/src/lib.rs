#![warn(missing_docs)]
#![doc = include_str!("../README.md")]

mod backoff;
mod client;
mod error;
mod informer;
mod object;
pub mod pb;
pub mod reflector;
mod store;
pub mod watcher;

pub use client::{Client, ClientBuilder, Watch};
pub use error::{Error, FieldViolation, Reason, DOMAIN};
pub use informer::{Event, EventStream, Informer, Running, Stats, Subscription};
pub use object::{Codec, Decoded, Json, KubernetesProtobuf, Meta, Protobuf, Resource, Typed};
pub use reflector::reflector;
pub use store::{Change, IndexFn, ObjectKey, Store, WriterDropped};
pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
pub use tonic::Code;
pub use watcher::watcher;

#[cfg(test)]
mod tests {
    use super::pb::Object;

    #[test]
    fn a_field_is_read_at_its_dotted_path() {
        let pod = Object {
            value: br#"{"spec":{"nodeName":"node-7","replicas":3},"status":{}}"#.to_vec(),
            ..Default::default()
        };
        assert_eq!(pod.field("spec.nodeName").as_deref(), Some("node-7"));
        assert_eq!(pod.field("spec.replicas"), None, "not a string");
        assert_eq!(pod.field("status.phase"), None);
        let raw = Object {
            value: b"\x00\x01".to_vec(),
            ..Default::default()
        };
        assert_eq!(raw.field("spec.nodeName"), None);
    }
}
