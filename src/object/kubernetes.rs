//! Values as the Kubernetes apiserver stores them (`format: kubernetes`):
//! built-in types as protobuf in the storage envelope (`k8s\0`, then a
//! `runtime.Unknown` naming the kind and holding the object's own
//! protobuf), custom resources as JSON. Labels, the uid and the declared
//! fields are read with the types of `k8s-pb`; the value is kept and sent
//! as stored, for clients that read Kubernetes' protobuf.

use k8s_pb::api::core::v1 as core;
use k8s_pb::api::discovery::v1 as discovery;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;

use super::decode::DecodeError;
use super::{Labels, Resource};

/// The prefix of the apiserver's protobuf encoding.
const ENVELOPE: &[u8] = b"k8s\0";

/// The prefix of a value the apiserver encrypted at rest, followed by the
/// provider, its version and the key's name.
const ENCRYPTED: &[u8] = b"k8s:enc:";

/// Any object of any kind, for its metadata: every Kubernetes type holds
/// its `ObjectMeta` at field 1.
#[derive(Clone, PartialEq, Message)]
struct Metadata {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// A built-in object read for its selectable fields (boxed: a pod is
/// 2 KiB before its heap).
enum Typed {
    Pod(Box<core::Pod>),
    Node(Box<core::Node>),
    Service(Box<core::Service>),
    Secret(Box<core::Secret>),
    Namespace(Box<core::Namespace>),
    EndpointSlice(Box<discovery::EndpointSlice>),
    /// Another kind: its metadata only.
    Other,
}

impl Typed {
    fn decode(kind: &str, raw: &[u8]) -> Result<Self, prost::DecodeError> {
        Ok(match kind {
            "Pod" => Typed::Pod(Box::new(Message::decode(raw)?)),
            "Node" => Typed::Node(Box::new(Message::decode(raw)?)),
            "Service" => Typed::Service(Box::new(Message::decode(raw)?)),
            "Secret" => Typed::Secret(Box::new(Message::decode(raw)?)),
            "Namespace" => Typed::Namespace(Box::new(Message::decode(raw)?)),
            "EndpointSlice" => Typed::EndpointSlice(Box::new(Message::decode(raw)?)),
            _ => Typed::Other,
        })
    }

    /// A field by its JSON path, as the apiserver's field selectors name
    /// them for the kind; `None` for one the kind does not have.
    fn field(&self, path: &str) -> Option<String> {
        let text = |s: &Option<String>| s.clone();
        let flag = |b: &Option<bool>| b.map(|b| b.to_string());
        match (self, path) {
            (Typed::Pod(p), _) => {
                let (spec, status) = (p.spec.as_ref(), p.status.as_ref());
                match path {
                    "spec.nodeName" => spec.and_then(|s| text(&s.node_name)),
                    "spec.restartPolicy" => spec.and_then(|s| text(&s.restart_policy)),
                    "spec.schedulerName" => spec.and_then(|s| text(&s.scheduler_name)),
                    "spec.serviceAccountName" => spec.and_then(|s| text(&s.service_account_name)),
                    "spec.hostNetwork" => spec.and_then(|s| flag(&s.host_network)),
                    "status.phase" => status.and_then(|s| text(&s.phase)),
                    "status.podIP" => status.and_then(|s| text(&s.pod_ip)),
                    "status.nominatedNodeName" => status.and_then(|s| text(&s.nominated_node_name)),
                    _ => None,
                }
            }
            (Typed::Node(n), _) => {
                let spec = n.spec.as_ref();
                match path {
                    "spec.unschedulable" => spec.and_then(|s| flag(&s.unschedulable)),
                    "spec.podCIDR" => spec.and_then(|s| text(&s.pod_cidr)),
                    "spec.providerID" => spec.and_then(|s| text(&s.provider_id)),
                    _ => None,
                }
            }
            (Typed::Service(s), "spec.type") => s.spec.as_ref().and_then(|s| text(&s.r#type)),
            (Typed::Service(s), "spec.clusterIP") => {
                s.spec.as_ref().and_then(|s| text(&s.cluster_ip))
            }
            (Typed::Secret(s), "type") => text(&s.r#type),
            (Typed::Namespace(n), "status.phase") => n.status.as_ref().and_then(|s| text(&s.phase)),
            (Typed::EndpointSlice(e), "addressType") => text(&e.address_type),
            _ => None,
        }
    }
}

/// What a kubernetes value holds for the cache: labels, the selectable
/// fields (in the resource's order) and the uid.
pub(super) type Read = (Labels, Box<[String]>, String);

impl Resource {
    /// Reads a value stored by the apiserver: protobuf in its envelope, or
    /// JSON (custom resources, and built-ins stored as JSON).
    pub(super) fn read_kubernetes(&self, value: &[u8]) -> Result<Read, DecodeError> {
        if let Some(rest) = value.strip_prefix(ENCRYPTED) {
            return Err(DecodeError::Encrypted(provider(rest)));
        }
        let Some(envelope) = value.strip_prefix(ENVELOPE) else {
            return match value.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => self.read_json(value),
                _ => Err(DecodeError::NotKubernetes),
            };
        };
        let unknown = Unknown::decode(envelope).map_err(DecodeError::NotProtobuf)?;
        let raw = unknown.raw.unwrap_or_default();
        let kind = (unknown.type_meta).and_then(|t| t.kind).unwrap_or_default();
        let metadata = Metadata::decode(raw.as_slice())
            .map_err(DecodeError::NotProtobuf)?
            .metadata
            .unwrap_or_default();
        let wants_fields = !self.selectable_fields.is_empty();
        let typed = match wants_fields {
            true => Typed::decode(&kind, &raw).map_err(DecodeError::NotProtobuf)?,
            false => Typed::Other,
        };
        let fields = (self.selectable_fields.iter())
            .map(|path| typed.field(path).unwrap_or_default())
            .collect();
        Ok((metadata.labels, fields, metadata.uid.unwrap_or_default()))
    }
}

/// The provider, version and key name of an encrypted value, e.g.
/// `aescbc:v1:key1`; never any of the value itself.
fn provider(rest: &[u8]) -> String {
    let named: Vec<&[u8]> = rest.splitn(4, |&b| b == b':').take(3).collect();
    let text = String::from_utf8_lossy(&named.join(&b':')).into_owned();
    text.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(64)
        .collect()
}

/// `object` encoded the way the apiserver stores a built-in type: the
/// envelope, then a `runtime.Unknown` with its kind and its protobuf.
pub fn storage_encoding(api_version: &str, kind: &str, object: &impl Message) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(object.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [ENVELOPE, &unknown.encode_to_vec()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ValueFormat;

    fn pods(fields: &[&str]) -> Resource {
        Resource {
            format: ValueFormat::Kubernetes,
            ..Resource::for_tests(fields)
        }
    }

    fn pod(node: &str, phase: &str) -> core::Pod {
        core::Pod {
            metadata: Some(ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("default".into()),
                uid: Some("6b1f".into()),
                labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                node_name: Some(node.into()),
                host_network: Some(true),
                ..Default::default()
            }),
            status: Some(core::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_pod_as_the_apiserver_stores_it_gives_its_labels_uid_and_fields() {
        let r = pods(&[
            "spec.nodeName",
            "status.phase",
            "spec.hostNetwork",
            "spec.unknown",
        ]);
        let value = storage_encoding("v1", "Pod", &pod("node-7", "Running"));
        assert!(value.starts_with(b"k8s\0"));
        let o = r.decode(b"/p/default/web-1", &value, 3).unwrap();
        assert_eq!(o.labels.get("app"), Some("web"));
        assert_eq!(&*o.fields, ["node-7", "Running", "true", ""]);
        assert_eq!(o.value, value, "the value is sent as stored");
        assert_eq!(o.shard_hashes[2], crate::object::shard_hash("6b1f"));
    }

    #[test]
    fn other_kinds_json_and_what_cannot_be_read() {
        let r = pods(&["spec.nodeName"]);
        // A kind without declared fields: its metadata only.
        let cm = core::ConfigMap {
            metadata: Some(ObjectMeta {
                labels: [("a".to_string(), "b".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = r
            .decode(b"/p/ns/c", &storage_encoding("v1", "ConfigMap", &cm), 1)
            .unwrap();
        assert_eq!(
            (o.labels.get("a"), &*o.fields),
            (Some("b"), &[String::new()][..])
        );
        // A custom resource, stored as JSON.
        let json = br#"{"metadata":{"labels":{"x":"y"}},"spec":{"nodeName":"n"}}"#;
        let o = r.decode(b"/p/ns/cr", json, 1).unwrap();
        assert_eq!((o.labels.get("x"), o.fields[0].as_str()), (Some("y"), "n"));
        // Encrypted at rest: named as such, the key's name and no more.
        let secret = b"k8s:enc:aescbc:v1:key1:\x9c\x01secret bytes";
        match r.decode(b"/p/ns/s", secret, 1) {
            Err(e @ DecodeError::Encrypted(_)) => {
                let text = e.to_string();
                assert!(text.contains("aescbc:v1:key1"), "{text}");
                assert!(!text.contains("secret"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            r.decode(b"/p/ns/b", b"k8s\0\xff\xff", 1),
            Err(DecodeError::NotProtobuf(_))
        ));
        assert!(matches!(
            r.decode(b"/p/ns/b", b"plain", 1),
            Err(DecodeError::NotKubernetes)
        ));
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_kubernetes_values(mut value in crate::fuzzing::bytes("kubernetes_value")) {
            let r = pods(&["spec.nodeName", "status.phase"]);
            let _ = r.decode(b"/p/ns/a", &value, 1);
            value.splice(0..0, b"k8s\0".iter().copied());
            let _ = r.decode(b"/p/ns/a", &value, 1);
        }
    }
}
