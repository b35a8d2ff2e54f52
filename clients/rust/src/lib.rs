#![warn(missing_docs)]
#![doc = include_str!("../README.md")]

mod backoff;
mod client;
mod error;
mod informer;
mod object;
pub mod reflector;
mod store;
mod subscription;
pub mod watcher;

/// The generated messages and stub of `watchproxy.v1`.
#[allow(missing_docs)] // generated: the proto's comments are the docs it has
pub mod pb {
    tonic::include_proto!("watchproxy.v1");

    impl Object {
        /// The value as JSON, when it is JSON.
        pub fn json(&self) -> Option<serde_json::Value> {
            serde_json::from_slice(&self.value).ok()
        }

        /// The string at a dotted path of the JSON value, such as
        /// `spec.nodeName`: what an index usually files an object under.
        pub fn field(&self, path: &str) -> Option<String> {
            let value = self.json()?;
            let found = path.split('.').try_fold(&value, |v, step| v.get(step))?;
            found.as_str().map(String::from)
        }
    }
}

pub use client::{Client, ClientBuilder, Watch};
pub use error::{Error, FieldViolation, Reason, DOMAIN};
pub use informer::{Event, EventStream, Informer, Running, Stats};
pub use object::{Codec, Decoded, Json, KubernetesProtobuf, Meta, Protobuf, Resource, Typed};
pub use reflector::reflector;
pub use store::{Change, IndexFn, ObjectKey, Store, WriterDropped};
pub use subscription::Subscription;
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
