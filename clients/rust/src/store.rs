//! The informer's local copy of a resource, with user-defined indexes:
//! readable from any thread while the informer keeps it up to date.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::pb::Object;

/// The values an object is filed under in one index.
pub type IndexFn = Arc<dyn Fn(&Object) -> Vec<String> + Send + Sync>;

/// An object's identity within its resource.
pub type ObjectKey = (String, String);

fn key_of(object: &Object) -> ObjectKey {
    (object.namespace.clone(), object.name.clone())
}

/// A change the store took, as handlers see it.
#[derive(Debug, Clone)]
pub enum Change {
    Added(Arc<Object>),
    Modified {
        old: Arc<Object>,
        new: Arc<Object>,
    },
    /// The object's last state (on a watch, with the deletion's version).
    Deleted(Arc<Object>),
}

/// A shared handle on the store; clones see the same objects.
#[derive(Clone, Default)]
pub struct Store {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    objects: HashMap<ObjectKey, Arc<Object>>,
    indexers: BTreeMap<String, IndexFn>,
    /// index name → value → objects filed under it.
    indices: HashMap<String, HashMap<String, HashSet<ObjectKey>>>,
}

impl Inner {
    fn file(&mut self, key: &ObjectKey, object: &Object, add: bool) {
        for (name, index) in &self.indexers {
            let values = self.indices.entry(name.clone()).or_default();
            for value in index(object) {
                if add {
                    values.entry(value).or_default().insert(key.clone());
                } else if let Some(keys) = values.get_mut(&value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        values.remove(&value);
                    }
                }
            }
        }
    }

    fn put(&mut self, object: Arc<Object>) -> Option<Arc<Object>> {
        let key = key_of(&object);
        let old = self.objects.insert(key.clone(), object.clone());
        if let Some(old) = &old {
            self.file(&key, old, false);
        }
        self.file(&key, &object, true);
        old
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<Object>> {
        let old = self.objects.remove(key)?;
        self.file(key, &old, false);
        Some(old)
    }
}

impl Store {
    pub(crate) fn with_indexers(indexers: BTreeMap<String, IndexFn>) -> Store {
        let store = Store::default();
        store.inner.write().indexers = indexers;
        store
    }

    /// One object by namespace and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Object>> {
        let key = (namespace.to_owned(), name.to_owned());
        self.inner.read().objects.get(&key).cloned()
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<Object>> {
        self.inner.read().objects.values().cloned().collect()
    }

    /// The objects `index` files under `value`.
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<Object>> {
        let inner = self.inner.read();
        let keys = inner
            .indices
            .get(index)
            .and_then(|values| values.get(value));
        keys.into_iter()
            .flatten()
            .filter_map(|key| inner.objects.get(key).cloned())
            .collect()
    }

    /// The values `index` holds objects under.
    pub fn index_values(&self, index: &str) -> Vec<String> {
        let inner = self.inner.read();
        inner
            .indices
            .get(index)
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.inner.read().objects.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes one watch event's object.
    pub(crate) fn apply(&self, object: Object, deleted: bool) -> Option<Change> {
        let mut inner = self.inner.write();
        if deleted {
            inner.remove(&key_of(&object))?;
            return Some(Change::Deleted(Arc::new(object)));
        }
        let new = Arc::new(object);
        Some(match inner.put(new.clone()) {
            Some(old) => Change::Modified { old, new },
            None => Change::Added(new),
        })
    }

    /// Replaces the contents with a list's items: the difference, as the
    /// changes that make the old contents the new (objects whose version
    /// is unchanged are no change).
    pub(crate) fn replace(&self, items: Vec<Object>) -> Vec<Change> {
        let mut inner = self.inner.write();
        let mut gone: HashSet<ObjectKey> = inner.objects.keys().cloned().collect();
        let mut changes = Vec::new();
        for object in items {
            let key = key_of(&object);
            gone.remove(&key);
            let same = inner.objects.get(&key).is_some_and(|o| {
                o.resource_version == object.resource_version && o.value == object.value
            });
            if same {
                continue;
            }
            let new = Arc::new(object);
            changes.push(match inner.put(new.clone()) {
                Some(old) => Change::Modified { old, new },
                None => Change::Added(new),
            });
        }
        for key in gone {
            if let Some(old) = inner.remove(&key) {
                changes.push(Change::Deleted(old));
            }
        }
        changes
    }
}
