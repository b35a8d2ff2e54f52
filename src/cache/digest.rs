//! A digest of a cache's objects by key and version, the same for the
//! same objects whatever history led to them: a tier and its upstream
//! prove they hold the same objects by comparing digests, where the
//! revisions of their newest changes differ (a list, a restart, a resync).

use std::fmt;

use crate::object::{Object, Revision};

/// The wrapping sum of a 128-bit hash of each object's key and version,
/// so adding or removing one object costs one hash. The hash is
/// cryptographic, so no written key can be chosen to cancel another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest(u128);

impl Digest {
    pub fn of<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Self {
        let mut d = Self::default();
        objects.into_iter().for_each(|o| d.add(o));
        d
    }

    pub fn add(&mut self, o: &Object) {
        self.0 = self.0.wrapping_add(item(o.key_bytes(), o.revision));
    }

    pub fn remove(&mut self, o: &Object) {
        self.0 = self.0.wrapping_sub(item(o.key_bytes(), o.revision));
    }

    /// Reads the form [`Digest`]'s `Display` writes.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 32)
            .then(|| u128::from_str_radix(text, 16).ok().map(Self))
            .flatten()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

fn item(key: &[u8], revision: Revision) -> u128 {
    let mut ctx = ::ring::digest::Context::new(&::ring::digest::SHA256);
    ctx.update(&(key.len() as u64).to_be_bytes());
    ctx.update(key);
    ctx.update(&revision.to_be_bytes());
    let hash = ctx.finish();
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash.as_ref()[..16]);
    u128::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Resource;

    #[test]
    fn the_same_objects_have_the_same_digest_whatever_their_order_and_history() {
        let r = Resource::for_tests(&[]);
        let o = |key: &str, v: Revision| r.decode(key.as_bytes(), b"{}", v).unwrap();
        let (a, b, b2, c) = (
            o("/p/ns/a", 3),
            o("/p/ns/b", 4),
            o("/p/ns/b", 6),
            o("/p/ns/c", 5),
        );
        let listed = Digest::of([&a, &b2]);
        assert_eq!(listed, Digest::of([&b2, &a]));
        let mut followed = Digest::of([&a, &b]);
        followed.add(&c);
        followed.remove(&b);
        followed.add(&b2);
        followed.remove(&c);
        assert_eq!(followed, listed);
        assert_ne!(Digest::of([&a, &b]), listed, "another version of a key");
        assert_ne!(Digest::of([&a]), Digest::default());
        assert_eq!(Digest::parse(&listed.to_string()), Some(listed));
        assert_eq!(Digest::parse("12"), None);
    }
}
