//! The local copy of a resource, with user-defined indexes: readable from
//! any thread while its writer (a reflector, an informer) keeps it up to
//! date.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::object::Resource;
use crate::pb::Object;

/// The values an object is filed under in one index.
pub type IndexFn<K = Object> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// An object's identity within its resource: namespace and name.
pub type ObjectKey = (String, String);

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    (object.namespace().to_owned(), object.name().to_owned())
}

/// A change the store took.
#[derive(Debug)]
pub enum Change<K = Object> {
    /// An object it did not hold.
    Added(Arc<K>),
    /// A new state of an object it held.
    Modified {
        /// The state it held.
        old: Arc<K>,
        /// The state it holds now.
        new: Arc<K>,
    },
    /// The object's last state (on a watch, with the deletion's version).
    Deleted(Arc<K>),
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Added(o) => Change::Added(o.clone()),
            Change::Modified { old, new } => Change::Modified {
                old: old.clone(),
                new: new.clone(),
            },
            Change::Deleted(o) => Change::Deleted(o.clone()),
        }
    }
}

/// A shared handle on the store; clones see the same objects.
pub struct Store<K = Object> {
    inner: Arc<RwLock<Inner<K>>>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
        }
    }
}

struct Inner<K> {
    objects: HashMap<ObjectKey, Arc<K>>,
    indexers: BTreeMap<String, IndexFn<K>>,
    /// index name → value → objects filed under it.
    indices: HashMap<String, HashMap<String, HashSet<ObjectKey>>>,
    /// The version of the last change, list or bookmark taken.
    version: String,
}

impl<K: Resource> Inner<K> {
    fn file(&mut self, key: &ObjectKey, object: &K, add: bool) {
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

    fn put(&mut self, object: Arc<K>) -> Option<Arc<K>> {
        let key = key_of(&*object);
        let old = self.objects.insert(key.clone(), object.clone());
        if let Some(old) = &old {
            self.file(&key, old, false);
        }
        self.file(&key, &object, true);
        old
    }

    /// A resync's objects keep their own, older versions: the store's
    /// only moves forward.
    fn advance(&mut self, version: &str) {
        let number = |v: &str| v.parse::<u64>().unwrap_or(0);
        if number(version) > number(&self.version) {
            self.version = version.to_owned();
        }
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        self.file(key, &old, false);
        Some(old)
    }
}

impl<K: Resource> Store<K> {
    /// A store with these indexes and the sender that marks it ready.
    pub(crate) fn new(indexers: BTreeMap<String, IndexFn<K>>) -> (Store<K>, watch::Sender<bool>) {
        let (ready_tx, ready) = watch::channel(false);
        let inner = Inner {
            objects: HashMap::new(),
            indexers,
            indices: HashMap::new(),
            version: String::new(),
        };
        let inner = Arc::new(RwLock::new(inner));
        (Store { inner, ready }, ready_tx)
    }

    /// One object by namespace and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let key = (namespace.to_owned(), name.to_owned());
        self.inner.read().objects.get(&key).cloned()
    }

    /// Every object, in no particular order.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.inner.read().objects.values().cloned().collect()
    }

    /// Every object, in no particular order (as [`Store::state`]).
    pub fn list(&self) -> Vec<Arc<K>> {
        self.state()
    }

    /// The objects `index` files under `value`.
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<K>> {
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

    /// The version of the last change, list or bookmark it took (empty
    /// before the first list).
    pub fn resource_version(&self) -> String {
        self.inner.read().version.clone()
    }

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first list is in; an error when its writer went
    /// away before.
    pub async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut ready = self.ready.clone();
        let waited = ready.wait_for(|r| *r).await.map(|_| ());
        waited.map_err(|_| WriterDropped)
    }

    /// Takes one watch event's object.
    pub(crate) fn apply(&self, object: Arc<K>, deleted: bool) -> Option<Change<K>> {
        let mut inner = self.inner.write();
        inner.advance(object.resource_version());
        if deleted {
            inner.remove(&key_of(&*object))?;
            return Some(Change::Deleted(object));
        }
        Some(match inner.put(object.clone()) {
            Some(old) => Change::Modified { old, new: object },
            None => Change::Added(object),
        })
    }

    /// Replaces the contents with a list's items at `version`: the
    /// difference, as the changes that make the old contents the new
    /// (objects in the same state are no change).
    pub(crate) fn replace(&self, items: Vec<Arc<K>>, version: &str) -> Vec<Change<K>> {
        let mut inner = self.inner.write();
        inner.version = version.to_owned();
        let mut gone: HashSet<ObjectKey> = inner.objects.keys().cloned().collect();
        let mut changes = Vec::new();
        for new in items {
            let key = key_of(&*new);
            gone.remove(&key);
            if inner.objects.get(&key).is_some_and(|o| o.same_state(&new)) {
                continue;
            }
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

    /// A bookmark: the store has every change up to `version`.
    pub(crate) fn advance(&self, version: &str) {
        self.inner.write().advance(version);
    }
}

/// The store's writer went away before the first list was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterDropped;

impl std::fmt::Display for WriterDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the store's writer went away before the first list was in")
    }
}

impl std::error::Error for WriterDropped {}
