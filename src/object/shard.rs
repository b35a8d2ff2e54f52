//! The hash that shards a resource among watchers: 64-bit FNV-1a of a
//! field's string, the hash of Kubernetes' sharded List and Watch
//! (KEP-5866), so controllers sharded that way keep their ranges. Each
//! object version's hashes are computed once, when it is read.

use std::hash::Hasher;

use super::{Object, Resource};

/// The fields every resource can be sharded by, before its selectable
/// fields. An object without a uid hashes the empty string.
const ALWAYS: [&str; 3] = ["metadata.name", "metadata.namespace", "metadata.uid"];

/// 64-bit FNV-1a of `s`'s UTF-8 bytes.
pub fn shard_hash(s: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

impl Resource {
    /// The fields objects can be sharded by, by position: name, namespace,
    /// uid, then the selectable fields.
    pub fn shard_fields(&self) -> impl Iterator<Item = &str> {
        ALWAYS
            .into_iter()
            .chain(self.selectable_fields.iter().map(String::as_str))
    }

    /// The position of `field` among [`Resource::shard_fields`].
    pub fn shard_field(&self, field: &str) -> Option<usize> {
        self.shard_fields().position(|f| f == field)
    }

    /// An object's hashes, in the order of [`Resource::shard_fields`].
    pub(super) fn shard_hashes(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        fields: &[String],
    ) -> Box<[u64]> {
        [name, namespace, uid]
            .into_iter()
            .chain(fields.iter().map(String::as_str))
            .map(shard_hash)
            .collect()
    }
}

impl Object {
    /// The hash of shard field `field` (a position among
    /// [`Resource::shard_fields`]).
    pub fn shard_hash(&self, field: usize) -> u64 {
        self.meta.hash(field).unwrap_or_else(|| shard_hash(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv_1a_64() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(shard_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(shard_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shard_hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn objects_carry_the_hashes_of_their_shard_fields() {
        let r = Resource::for_tests(&["spec.nodeName"]);
        let value = br#"{"metadata":{"uid":"u-1"},"spec":{"nodeName":"n-7"}}"#;
        let o = r.decode(b"/p/ns-1/a", value, 3).unwrap();
        let fields: Vec<&str> = r.shard_fields().collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "metadata.namespace",
                "metadata.uid",
                "spec.nodeName"
            ]
        );
        for (at, want) in ["a", "ns-1", "u-1", "n-7"].into_iter().enumerate() {
            assert_eq!(o.shard_hash(at), shard_hash(want), "{}", fields[at]);
        }
        assert_eq!(r.shard_field("spec.nodeName"), Some(3));
        assert_eq!(r.shard_field("spec.other"), None);
        let bare = r.decode(b"/p/ns-1/b", b"{}", 3).unwrap();
        let uid = r.shard_field("metadata.uid").unwrap();
        assert_eq!(bare.shard_hash(uid), shard_hash(""));
    }
}
