//! What a watcher or a store holds: the server's objects as they come
//! (bytes), or each value decoded once into a type of the caller's, JSON
//! through serde (`k8s-openapi`'s types, a struct of one's own) or the
//! apiserver's protobuf through prost (`k8s-pb`'s types).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use crate::error::Error;
use crate::pb::Object;
use prost::Message;
use serde::de::DeserializeOwned;

/// An object a watcher can hand out and a store can hold: made from the
/// server's object once, and known by its namespace, name and version.
pub trait Resource: Sized + Send + Sync + 'static {
    /// Made from the object as the server sent it.
    fn from_object(object: Object) -> Result<Self, Error>;
    /// Its namespace (empty for a cluster-wide object).
    fn namespace(&self) -> &str;
    /// Its name.
    fn name(&self) -> &str;
    /// The version of its last change (etcd's modification revision).
    fn resource_version(&self) -> &str;
    /// Whether `other` is the same state of the same object, so a list
    /// that brings it again is no change.
    fn same_state(&self, other: &Self) -> bool {
        self.resource_version() == other.resource_version()
    }
}

/// The raw form: the value as stored, read when wanted.
impl Resource for Object {
    fn from_object(object: Object) -> Result<Self, Error> {
        Ok(object)
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn resource_version(&self) -> &str {
        &self.resource_version
    }
    fn same_state(&self, other: &Self) -> bool {
        // Projections of one version are the same when their bytes are.
        self.resource_version == other.resource_version && self.value == other.value
    }
}

/// What the server says of every object, whatever its value's type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// The etcd key.
    pub key: String,
    /// Its namespace (empty for a cluster-wide object).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The version of its last change.
    pub resource_version: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// How a value's bytes become a `T`.
pub trait Codec<T>: Send + Sync + 'static {
    /// The value decoded, or why it cannot be.
    fn decode(value: &[u8]) -> Result<T, String>;
}

/// JSON through serde: for `format: json` resources, and for the JSON
/// values of `format: kubernetes` ones (custom resources, and built-in
/// types where the apiserver stores JSON); `k8s-openapi`'s types read them.
#[derive(Debug)]
pub enum Json {}

impl<T: DeserializeOwned> Codec<T> for Json {
    fn decode(value: &[u8]) -> Result<T, String> {
        if value.starts_with(b"k8s\0") {
            return Err(
                "the value is the apiserver's protobuf, not JSON: read it as Protobuf<T> \
                        with k8s-pb's types"
                    .into(),
            );
        }
        serde_json::from_slice(value).map_err(|e| e.to_string())
    }
}

/// The apiserver's storage protobuf (`k8s\0` and a `runtime.Unknown`
/// holding the object), as `format: kubernetes` resources serve built-in
/// types, into prost types such as `k8s-pb`'s.
#[derive(Debug)]
pub enum KubernetesProtobuf {}

/// `k8s.io.apimachinery.pkg.runtime.Unknown`: the envelope's message.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
}

impl<T: Message + Default> Codec<T> for KubernetesProtobuf {
    fn decode(value: &[u8]) -> Result<T, String> {
        let envelope = (value.strip_prefix(b"k8s\0"))
            .ok_or("not the apiserver's protobuf (no k8s\\0 prefix)")?;
        let unknown = Unknown::decode(envelope).map_err(|e| e.to_string())?;
        T::decode(unknown.raw.unwrap_or_default().as_slice()).map_err(|e| e.to_string())
    }
}

/// An object whose value was decoded once into `T`; it reads as a `T`
/// (`pod.spec`), with the server's [`Meta`] beside it.
pub struct Decoded<T, C = Json> {
    /// What the server says of it.
    pub meta: Meta,
    /// The value.
    pub value: T,
    codec: PhantomData<fn() -> C>,
}

/// An object whose JSON value was decoded into `T` (serde).
pub type Typed<T> = Decoded<T, Json>;

/// An object whose value, the apiserver's protobuf, was decoded into `T`
/// (prost).
pub type Protobuf<T> = Decoded<T, KubernetesProtobuf>;

impl<T, C> Decoded<T, C> {
    /// An object of `value` as the server describes it.
    pub fn new(meta: Meta, value: T) -> Self {
        Decoded {
            meta,
            value,
            codec: PhantomData,
        }
    }
}

impl<T, C> Deref for Decoded<T, C> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: fmt::Debug, C> fmt::Debug for Decoded<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (f.debug_struct("Decoded"))
            .field("meta", &self.meta)
            .field("value", &self.value)
            .finish()
    }
}

impl<T: Clone, C> Clone for Decoded<T, C> {
    fn clone(&self) -> Self {
        Decoded::new(self.meta.clone(), self.value.clone())
    }
}

impl<T, C> Resource for Decoded<T, C>
where
    T: Send + Sync + 'static,
    C: Codec<T>,
{
    fn from_object(object: Object) -> Result<Self, Error> {
        let value = (C::decode(&object.value))
            .map_err(|e| Error::undecodable(format!("{} cannot be decoded: {e}", object.key)))?;
        let meta = Meta {
            key: object.key,
            namespace: object.namespace,
            name: object.name,
            resource_version: object.resource_version,
            labels: object.labels,
        };
        Ok(Decoded::new(meta, value))
    }
    fn namespace(&self) -> &str {
        &self.meta.namespace
    }
    fn name(&self) -> &str {
        &self.meta.name
    }
    fn resource_version(&self) -> &str {
        &self.meta.resource_version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Pod {
        spec: Spec,
    }
    #[derive(Debug, serde::Deserialize)]
    struct Spec {
        #[serde(rename = "nodeName")]
        node_name: String,
    }

    fn object(value: &[u8]) -> Object {
        Object {
            key: "/registry/pods/ns/a".into(),
            namespace: "ns".into(),
            name: "a".into(),
            resource_version: "7".into(),
            value: value.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_json_value_is_decoded_once_into_the_callers_type() {
        let pod = Typed::<Pod>::from_object(object(br#"{"spec":{"nodeName":"n1"}}"#)).unwrap();
        assert_eq!(pod.spec.node_name, "n1");
        assert_eq!(
            (pod.namespace(), pod.name(), pod.resource_version()),
            ("ns", "a", "7")
        );
        let bad = Typed::<Pod>::from_object(object(b"{}")).unwrap_err();
        assert_eq!(bad.code(), tonic::Code::DataLoss);
        assert!(bad.is_undecodable());
        assert!(bad.message().contains("/registry/pods/ns/a"), "{bad}");
    }

    #[test]
    fn the_apiservers_envelope_is_opened_for_prost_types() {
        #[derive(Clone, PartialEq, Message)]
        struct Named {
            #[prost(string, tag = "1")]
            name: String,
        }
        let inner = Named { name: "x".into() }.encode_to_vec();
        let envelope = Unknown { raw: Some(inner) }.encode_to_vec();
        let value = [b"k8s\0".as_slice(), &envelope].concat();
        let named = Protobuf::<Named>::from_object(object(&value)).unwrap();
        assert_eq!(named.name, "x");
        let json = Protobuf::<Named>::from_object(object(b"{}")).unwrap_err();
        assert!(json.message().contains("k8s\\0"), "{json}");
    }
}
