//! Values as the Kubernetes apiserver stores them (`format: kubernetes`):
//! built-in types as protobuf in the storage envelope (`k8s\0`, then a
//! `runtime.Unknown` naming the kind and holding the object's own
//! protobuf), custom resources as JSON. The envelope, labels, the uid and
//! the declared fields are read in place by their tags in `k8s-pb`'s
//! types, which the tests encode with, so nothing is copied. The
//! value is kept and sent as stored, for clients that read Kubernetes'
//! protobuf.

use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;

use super::decode::DecodeError;
use super::{Labels, Resource};

/// The prefix of the apiserver's protobuf encoding.
const ENVELOPE: &[u8] = b"k8s\0";

/// The prefix of a value the apiserver encrypted at rest, followed by the
/// provider, its version and the key's name.
const ENCRYPTED: &[u8] = b"k8s:enc:";

/// How a field's last tag is read.
#[derive(Clone, Copy)]
enum Scalar {
    Text,
    Flag,
}

/// A selectable field of a kind: its JSON path, the protobuf tags that
/// lead to it from the object (as in k8s-pb's types, which the tests
/// encode with), and how it reads.
type FieldAt = (&'static str, &'static [u32], Scalar);

/// The apiserver's own field selectors of the kinds users watch most.
fn fields_of(kind: &str) -> &'static [FieldAt] {
    use Scalar::*;
    match kind {
        "Pod" => &[
            ("spec.nodeName", &[2, 10], Text),
            ("spec.restartPolicy", &[2, 3], Text),
            ("spec.schedulerName", &[2, 19], Text),
            ("spec.serviceAccountName", &[2, 8], Text),
            ("spec.hostNetwork", &[2, 11], Flag),
            ("status.phase", &[3, 1], Text),
            ("status.podIP", &[3, 6], Text),
            ("status.nominatedNodeName", &[3, 11], Text),
        ],
        "Node" => &[
            ("spec.podCIDR", &[2, 1], Text),
            ("spec.providerID", &[2, 3], Text),
            ("spec.unschedulable", &[2, 4], Flag),
        ],
        "Service" => &[
            ("spec.clusterIP", &[2, 3], Text),
            ("spec.type", &[2, 4], Text),
        ],
        "Secret" => &[("type", &[3], Text)],
        "Namespace" => &[("status.phase", &[3, 1], Text)],
        "EndpointSlice" => &[("addressType", &[4], Text)],
        _ => &[],
    }
}

/// Every Kubernetes object holds its `ObjectMeta` at field 1, and that its
/// uid at 5 and its labels at 11.
const METADATA: u32 = 1;
/// `runtime.Unknown`: its `typeMeta` (whose `kind` is field 2) and `raw`.
const UNKNOWN_TYPE_META: u32 = 1;
const TYPE_META_KIND: u32 = 2;
const UNKNOWN_RAW: u32 = 2;
const UID: u32 = 5;
const LABELS: u32 = 11;

/// One field of a protobuf message as read in place.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn bad(what: impl std::fmt::Display) -> DecodeError {
    DecodeError::NotProtobuf(what.to_string())
}

/// The fields of a message, in order, read without copying.
fn each_field<'a>(
    mut buf: &'a [u8],
    mut f: impl FnMut(u32, Payload<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf).map_err(bad)?;
        let payload = match wire {
            WireType::Varint => Payload::Varint(decode_varint(&mut buf).map_err(bad)?),
            WireType::LengthDelimited => {
                let len = decode_varint(&mut buf).map_err(bad)? as usize;
                if len > buf.len() {
                    return Err(bad("a field runs past the end of its message"));
                }
                let (bytes, rest) = buf.split_at(len);
                buf = rest;
                Payload::Bytes(bytes)
            }
            WireType::ThirtyTwoBit | WireType::SixtyFourBit => {
                let n = if wire == WireType::ThirtyTwoBit { 4 } else { 8 };
                if n > buf.len() {
                    return Err(bad("a field runs past the end of its message"));
                }
                buf = &buf[n..];
                Payload::Fixed
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(bad("groups are not used by Kubernetes' types"))
            }
        };
        f(tag, payload)?;
    }
    Ok(())
}

/// The field at `tags` below `buf`, as protobuf reads it: the last
/// occurrence wins, and a message given more than once is merged.
fn find<'a>(buf: &'a [u8], tags: &[u32]) -> Result<Option<Payload<'a>>, DecodeError> {
    let mut found = None;
    each_field(buf, |tag, payload| {
        if tag != tags[0] {
            return Ok(());
        }
        match (&tags[1..], payload) {
            ([], p) => found = Some(p),
            (rest, Payload::Bytes(sub)) => {
                if let Some(p) = find(sub, rest)? {
                    found = Some(p);
                }
            }
            _ => return Err(bad("a message field holds a scalar")),
        }
        Ok(())
    })?;
    Ok(found)
}

fn text(p: Payload<'_>) -> Result<String, DecodeError> {
    match p {
        Payload::Bytes(b) => std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| bad("a string is not UTF-8")),
        _ => Err(bad("a string field holds no bytes")),
    }
}

/// `metadata.labels`: map entries of a key (1) and a value (2).
fn labels(object: &[u8]) -> Result<Labels, DecodeError> {
    let mut labels = Labels::new();
    each_field(object, |tag, meta| match (tag, meta) {
        (METADATA, Payload::Bytes(meta)) => each_field(meta, |tag, entry| {
            if let (LABELS, Payload::Bytes(entry)) = (tag, entry) {
                let (key, value) = (find(entry, &[1])?, find(entry, &[2])?);
                let key = key.map(text).transpose()?.unwrap_or_default();
                let value = value.map(text).transpose()?.unwrap_or_default();
                labels.insert(key, value);
            }
            Ok(())
        }),
        _ => Ok(()),
    })?;
    Ok(labels)
}

/// What a kubernetes value holds for the cache: labels, the selectable
/// fields (in the resource's order) and the uid.
pub(super) type Read = (Labels, Box<[String]>, String);

impl Resource {
    /// Reads a value stored by the apiserver: protobuf in its envelope, or
    /// JSON (custom resources, and built-ins stored as JSON). Only the
    /// fields wanted are read, in place: a pod's containers, annotations
    /// and managed fields are stepped over, never decoded.
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
        let raw = match find(envelope, &[UNKNOWN_RAW])? {
            Some(Payload::Bytes(raw)) => raw,
            None => &[],
            Some(_) => return Err(bad("runtime.Unknown's raw holds no bytes")),
        };
        let kind = find(envelope, &[UNKNOWN_TYPE_META, TYPE_META_KIND])?
            .map(text)
            .transpose()?
            .unwrap_or_default();
        let known = fields_of(&kind);
        let fields = (self.selectable_fields.iter())
            .map(|path| {
                let Some(&(_, tags, scalar)) = known.iter().find(|(p, ..)| p == path) else {
                    return Ok(String::new());
                };
                Ok(match (find(raw, tags)?, scalar) {
                    (None, _) => String::new(),
                    (Some(p), Scalar::Text) => text(p)?,
                    (Some(Payload::Varint(v)), Scalar::Flag) => (v != 0).to_string(),
                    (Some(_), Scalar::Flag) => return Err(bad("a bool field holds no varint")),
                })
            })
            .collect::<Result<_, DecodeError>>()?;
        let uid = find(raw, &[METADATA, UID])?.map(text).transpose()?;
        Ok((labels(raw)?, fields, uid.unwrap_or_default()))
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

/// A pod given as Kubernetes JSON, encoded the way the apiserver stores it
/// (see [`storage_encoding`]): its name, namespace, uid, labels and
/// annotations, node, containers' names and images, phase and IP. For the
/// demo data and the measurement programs.
pub fn pod_as_stored(pod: &serde_json::Value) -> Vec<u8> {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let text = |path: &str| pod.pointer(path).and_then(|v| v.as_str()).map(String::from);
    let map = |path: &str| -> Labels {
        (pod.pointer(path)
            .and_then(|v| v.as_object())
            .into_iter()
            .flatten())
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
    };
    let containers = (pod
        .pointer("/spec/containers")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten())
    .map(|c| core::Container {
        name: c["name"].as_str().map(String::from),
        image: c["image"].as_str().map(String::from),
        ..Default::default()
    })
    .collect();
    let pb = core::Pod {
        metadata: Some(ObjectMeta {
            name: text("/metadata/name"),
            namespace: text("/metadata/namespace"),
            uid: text("/metadata/uid"),
            labels: map("/metadata/labels"),
            annotations: map("/metadata/annotations"),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            node_name: text("/spec/nodeName"),
            containers,
            ..Default::default()
        }),
        status: Some(core::PodStatus {
            phase: text("/status/phase"),
            pod_ip: text("/status/podIP"),
            ..Default::default()
        }),
    };
    storage_encoding("v1", "Pod", &pb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ValueFormat;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::discovery::v1 as discovery;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    fn resource(fields: &[&str]) -> Resource {
        Resource {
            format: ValueFormat::Kubernetes,
            ..Resource::for_tests(fields)
        }
    }

    fn meta(labels: &[(&str, &str)]) -> Option<ObjectMeta> {
        Some(ObjectMeta {
            name: Some("web-1".into()),
            namespace: Some("default".into()),
            uid: Some("6b1f".into()),
            labels: (labels.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: [("a".to_string(), "x".repeat(300))].into(),
            managed_fields: vec![ManagedFieldsEntry {
                manager: Some("kubelet".into()),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn pod(node: &str, phase: &str) -> core::Pod {
        core::Pod {
            metadata: meta(&[("app", "web"), ("tier", "a")]),
            spec: Some(core::PodSpec {
                node_name: Some(node.into()),
                restart_policy: Some("Always".into()),
                scheduler_name: Some("default-scheduler".into()),
                service_account_name: Some("sa".into()),
                host_network: Some(true),
                containers: vec![core::Container {
                    name: Some("web".into()),
                    image: Some("registry.example/web:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(core::PodStatus {
                phase: Some(phase.into()),
                pod_ip: Some("10.0.0.7".into()),
                nominated_node_name: Some("node-9".into()),
                ..Default::default()
            }),
        }
    }

    /// Every field of every kind's table, read from an object k8s-pb
    /// encoded with it set.
    #[test]
    fn every_declared_field_is_where_k8s_pb_puts_it() {
        // (kind, its stored value, each field and what it holds)
        type Case = (&'static str, Vec<u8>, Vec<(&'static str, &'static str)>);
        let kinds: Vec<Case> = vec![
            (
                "Pod",
                storage_encoding("v1", "Pod", &pod("node-7", "Running")),
                vec![
                    ("spec.nodeName", "node-7"),
                    ("spec.restartPolicy", "Always"),
                    ("spec.schedulerName", "default-scheduler"),
                    ("spec.serviceAccountName", "sa"),
                    ("spec.hostNetwork", "true"),
                    ("status.phase", "Running"),
                    ("status.podIP", "10.0.0.7"),
                    ("status.nominatedNodeName", "node-9"),
                ],
            ),
            (
                "Node",
                storage_encoding(
                    "v1",
                    "Node",
                    &core::Node {
                        metadata: meta(&[]),
                        spec: Some(core::NodeSpec {
                            pod_cidr: Some("10.1.0.0/24".into()),
                            provider_id: Some("cloud://n1".into()),
                            unschedulable: Some(false),
                            ..Default::default()
                        }),
                        status: None,
                    },
                ),
                vec![
                    ("spec.podCIDR", "10.1.0.0/24"),
                    ("spec.providerID", "cloud://n1"),
                    ("spec.unschedulable", "false"),
                ],
            ),
            (
                "Service",
                storage_encoding(
                    "v1",
                    "Service",
                    &core::Service {
                        metadata: meta(&[]),
                        spec: Some(core::ServiceSpec {
                            cluster_ip: Some("10.96.0.1".into()),
                            r#type: Some("ClusterIP".into()),
                            ..Default::default()
                        }),
                        status: None,
                    },
                ),
                vec![("spec.clusterIP", "10.96.0.1"), ("spec.type", "ClusterIP")],
            ),
            (
                "Secret",
                storage_encoding(
                    "v1",
                    "Secret",
                    &core::Secret {
                        metadata: meta(&[]),
                        r#type: Some("Opaque".into()),
                        ..Default::default()
                    },
                ),
                vec![("type", "Opaque")],
            ),
            (
                "Namespace",
                storage_encoding(
                    "v1",
                    "Namespace",
                    &core::Namespace {
                        metadata: meta(&[]),
                        spec: None,
                        status: Some(core::NamespaceStatus {
                            phase: Some("Active".into()),
                            ..Default::default()
                        }),
                    },
                ),
                vec![("status.phase", "Active")],
            ),
            (
                "EndpointSlice",
                storage_encoding(
                    "discovery.k8s.io/v1",
                    "EndpointSlice",
                    &discovery::EndpointSlice {
                        metadata: meta(&[]),
                        address_type: Some("IPv4".into()),
                        ..Default::default()
                    },
                ),
                vec![("addressType", "IPv4")],
            ),
        ];
        for (kind, value, want) in kinds {
            let paths: Vec<&str> = want.iter().map(|(p, _)| *p).collect();
            assert_eq!(
                paths.len(),
                fields_of(kind).len(),
                "{kind}: every field is tried"
            );
            let r = resource(&paths);
            let o = r.decode(b"/p/default/web-1", &value, 3).unwrap();
            let got: Vec<(&str, &str)> = paths.iter().copied().zip(o.fields().iter()).collect();
            assert_eq!(got, want, "{kind}");
            assert_eq!(
                o.shard_hash(2),
                crate::object::shard_hash("6b1f"),
                "{kind}: the uid"
            );
            assert_eq!(o.value(), value, "the value is sent as stored");
        }
    }

    #[test]
    fn labels_and_fields_another_kind_lacks_read_as_absent() {
        let r = resource(&["spec.nodeName", "spec.unknown"]);
        let value = storage_encoding("v1", "Pod", &pod("node-7", "Running"));
        let o = r.decode(b"/p/default/web-1", &value, 3).unwrap();
        assert_eq!(
            o.labels().to_map(),
            [
                ("app".to_string(), "web".to_string()),
                ("tier".into(), "a".into())
            ]
            .into()
        );
        assert_eq!(o.fields().iter().collect::<Vec<_>>(), ["node-7", ""]);
        let cm = core::ConfigMap {
            metadata: meta(&[("a", "b")]),
            ..Default::default()
        };
        let o = r
            .decode(b"/p/ns/c", &storage_encoding("v1", "ConfigMap", &cm), 1)
            .unwrap();
        assert_eq!(
            (o.labels().get("a"), o.fields().iter().collect::<Vec<_>>()),
            (Some("b"), vec!["", ""])
        );
    }

    #[test]
    fn json_encrypted_and_broken_values() {
        let r = resource(&["spec.nodeName"]);
        // A custom resource, stored as JSON.
        let json = br#"{"metadata":{"labels":{"x":"y"}},"spec":{"nodeName":"n"}}"#;
        let o = r.decode(b"/p/ns/cr", json, 1).unwrap();
        assert_eq!(
            (o.labels().get("x"), o.fields().get(0)),
            (Some("y"), Some("n"))
        );
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
        let whole = storage_encoding("v1", "Pod", &pod("node-7", "Running"));
        for cut in [whole.len() - 1, whole.len() - 40, 20] {
            assert!(
                matches!(
                    r.decode(b"/p/ns/b", &whole[..cut], 1),
                    Err(DecodeError::NotProtobuf(_))
                ),
                "cut at {cut}"
            );
        }
        assert!(matches!(
            r.decode(b"/p/ns/b", b"plain", 1),
            Err(DecodeError::NotKubernetes)
        ));
    }

    proptest::proptest! {
        /// What is read in place equals what k8s-pb decodes, whatever else
        /// the pod holds.
        #[test]
        fn fields_read_in_place_equal_k8s_pb_decoding(
            node in "[a-z0-9-]{0,12}",
            phase in proptest::option::of("[A-Za-z]{0,8}"),
            labels in proptest::collection::btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 0..5),
            containers in 0usize..4,
        ) {
            let mut p = pod(&node, "");
            p.status.as_mut().unwrap().phase = phase.clone();
            p.metadata.as_mut().unwrap().labels = labels.clone();
            p.spec.as_mut().unwrap().containers = (0..containers)
                .map(|i| core::Container { name: Some(format!("c{i}")), ..Default::default() })
                .collect();
            let value = storage_encoding("v1", "Pod", &p);
            let o = resource(&["spec.nodeName", "status.phase"]).decode(b"/p/ns/a", &value, 1).unwrap();
            let phase = phase.unwrap_or_default();
            proptest::prop_assert_eq!(o.fields().iter().collect::<Vec<_>>(), [node.as_str(), phase.as_str()]);
            proptest::prop_assert_eq!(o.labels().to_map(), labels);
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_kubernetes_values(value in crate::fuzzing::bytes("kubernetes_value")) {
            let r = resource(&["spec.nodeName", "status.phase"]);
            let _ = r.decode(b"/p/ns/a", &value, 1);
        }
    }
}
