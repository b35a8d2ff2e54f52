//! An object's `watchproxy.v1.Object` encoding, written once when it is
//! read, straight from its parts: no message is built to encode it, and
//! the value, the last field, is copied once, to the encoding's end.

use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use super::Revision;

/// What goes before the value, in field order.
pub struct Head<'a, L> {
    pub key: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub revision: Revision,
    /// In key order, as the message's map encodes them.
    pub labels: L,
}

/// The encoding of the object `head` describes, holding `value`: the same
/// bytes prost writes for the message.
pub fn encode<'a, L>(head: Head<'a, L>, value: &[u8]) -> Bytes
where
    L: Iterator<Item = (&'a str, &'a str)> + Clone,
{
    let mut digits = [0u8; 20];
    let revision = decimal(head.revision, &mut digits);
    let strings = [
        (1, head.key.as_bytes()),
        (2, head.namespace.as_bytes()),
        (3, head.name.as_bytes()),
        (4, revision),
    ];
    let entry = |k: &str, v: &str| field_len(k.as_bytes()) + field_len(v.as_bytes());
    let labels: usize = (head.labels.clone())
        .map(|(k, v)| entry(k, v))
        .map(|n| 1 + encoded_len_varint(n as u64) + n)
        .sum();
    let len = strings.iter().map(|(_, s)| field_len(s)).sum::<usize>() + labels + field_len(value);
    let mut out = Vec::with_capacity(len);
    for (tag, s) in strings {
        put(tag, s, &mut out);
    }
    for (k, v) in head.labels {
        encode_key(5, WireType::LengthDelimited, &mut out);
        encode_varint(entry(k, v) as u64, &mut out);
        put(1, k.as_bytes(), &mut out);
        put(2, v.as_bytes(), &mut out);
    }
    put(6, value, &mut out);
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

/// The key an encoding starts with (field 1, written first); empty if it
/// does not.
pub fn key_in(wire: &[u8]) -> &[u8] {
    if wire.first() != Some(&0x0a) {
        return &[];
    }
    let mut rest = &wire[1..];
    let len = prost::encoding::decode_varint(&mut rest).unwrap_or(0) as usize;
    rest.get(..len).unwrap_or_default()
}

/// A length-delimited field, left out when empty as proto3 leaves it.
fn put(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
}

/// What [`put`] writes (every tag here takes one byte).
fn field_len(bytes: &[u8]) -> usize {
    match bytes.len() {
        0 => 0,
        n => 1 + encoded_len_varint(n as u64) + n,
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::object::Labels;

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn the_encoding_is_prosts_own(
            key in "\\PC{0,40}",
            namespace in "\\PC{0,10}",
            name in "\\PC{0,10}",
            revision in proptest::prelude::any::<u64>(),
            labels in proptest::collection::btree_map("\\PC{0,8}", "\\PC{0,8}", 0..5),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let labels: Labels = labels;
            let head = Head {
                key: &key,
                namespace: &namespace,
                name: &name,
                revision,
                labels: labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            };
            let wire = encode(head, &value);
            let whole = crate::pb::Object {
                key: key.clone(),
                namespace,
                name,
                resource_version: revision.to_string(),
                labels,
                value: value.into(),
            };
            proptest::prop_assert_eq!(&wire[..], &whole.encode_to_vec()[..]);
            let want: &[u8] = if key.is_empty() { &[] } else { key.as_bytes() };
            proptest::prop_assert_eq!(key_in(&wire), want);
        }
    }
}
