//! Projected objects kept for a while, so that the watchers that are
//! shown one object version through one projection (live, reading the
//! event window after falling behind, or starting from the state) cut and
//! encode it once between them.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::object::{Object, Projection};

/// The bytes of cut objects a resource keeps; the oldest go first.
const BUDGET: usize = 8 << 20;

/// One cut: which projection it is, and the cut object (with the key and
/// revision of the version it was cut from).
struct Cut {
    projection: Arc<Projection>,
    object: Arc<Object>,
}

impl Cut {
    fn bytes(&self) -> usize {
        self.object.wire.len()
    }
}

/// The cuts of one resource, found by a hash of projection, key and
/// revision (a colliding entry is checked and replaced).
#[derive(Default)]
pub struct Cuts {
    inner: Mutex<Inner>,
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Default)]
struct Inner {
    by_hash: HashMap<u64, Cut>,
    /// In the order they were made, to let the oldest go.
    order: VecDeque<u64>,
    bytes: usize,
}

impl Cuts {
    /// `o` cut to `p`: the kept cut when there is one, else a new one,
    /// kept for the next watcher.
    pub fn cut(&self, p: &Arc<Projection>, o: &Arc<Object>) -> Arc<Object> {
        let h = self.hash(p, o);
        if let Some(c) = self.inner.lock().by_hash.get(&h) {
            let same = c.object.revision == o.revision && c.object.key_bytes() == o.key_bytes();
            if same && *c.projection == **p {
                return c.object.clone();
            }
        }
        // Cut outside the lock: two watchers may cut the same at once, and
        // the second one's is kept.
        let object = p.apply(o);
        if Arc::ptr_eq(&object, o) {
            return object;
        }
        let cut = Cut {
            projection: p.clone(),
            object: object.clone(),
        };
        let mut inner = self.inner.lock();
        inner.bytes += cut.bytes();
        if let Some(old) = inner.by_hash.insert(h, cut) {
            inner.bytes -= old.bytes();
        } else {
            inner.order.push_back(h);
        }
        while inner.bytes > BUDGET {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some(gone) = inner.by_hash.remove(&oldest) {
                inner.bytes -= gone.bytes();
            }
        }
        object
    }

    fn hash(&self, p: &Projection, o: &Object) -> u64 {
        let mut h = self.hasher.build_hasher();
        p.hash(&mut h);
        o.key_bytes().hash(&mut h);
        o.revision.hash(&mut h);
        h.finish()
    }

    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.by_hash.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Resource;

    #[test]
    fn a_cut_is_made_once_per_projection_and_object_version() {
        let r = Resource::for_tests(&[]);
        let pad = "x".repeat(4096);
        let value = format!(r#"{{"metadata":{{"name":"a"}},"spec":{{"pad":"{pad}"}}}}"#);
        let o = |rev| Arc::new(r.decode(b"/p/ns/a", value.as_bytes(), rev).unwrap());
        let meta = Arc::new(
            Projection::new(&["metadata".into()], false)
                .unwrap()
                .unwrap(),
        );
        let spec = Arc::new(Projection::new(&["spec".into()], false).unwrap().unwrap());
        let cuts = Cuts::default();
        let (v1, v2) = (o(1), o(2));
        let first = cuts.cut(&meta, &v1);
        assert!(Arc::ptr_eq(&first, &cuts.cut(&meta, &v1)), "kept");
        // An equal projection from another request finds it too.
        let same = Arc::new(
            Projection::new(&["metadata".into()], false)
                .unwrap()
                .unwrap(),
        );
        assert!(Arc::ptr_eq(&first, &cuts.cut(&same, &v1)));
        assert!(
            !Arc::ptr_eq(&first, &cuts.cut(&meta, &v2)),
            "another version"
        );
        let other = cuts.cut(&spec, &v1);
        assert!(!Arc::ptr_eq(&first, &other), "another projection");
        assert_eq!(*other, *spec.apply(&v1));
        assert_eq!(cuts.kept().0, 3);
    }

    #[test]
    fn the_oldest_cuts_go_past_the_budget() {
        let r = Resource::for_tests(&[]);
        let pad = "x".repeat(64 << 10);
        let value = format!(r#"{{"metadata":{{"name":"a"}},"pad":"{pad}"}}"#);
        let pad = Arc::new(Projection::new(&["pad".into()], false).unwrap().unwrap());
        let cuts = Cuts::default();
        for rev in 1..=400 {
            let o = Arc::new(r.decode(b"/p/ns/a", value.as_bytes(), rev).unwrap());
            cuts.cut(&pad, &o);
        }
        let (kept, bytes) = cuts.kept();
        assert!(bytes <= BUDGET, "{bytes}");
        assert!((BUDGET / (66 << 10)..400).contains(&kept), "{kept}");
    }
}
