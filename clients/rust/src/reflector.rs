//! A reflector, as kube-runtime has it: a watcher's events kept in a
//! [`Store`]. A list's objects are gathered and replace the store's at its
//! end, so a reader never sees half of one; the store is ready from the
//! first list on.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_core::Stream;
use tokio::sync::watch;
use tokio_stream::StreamExt;

use crate::error::Error;
use crate::object::Resource;
use crate::store::{Change, IndexFn, Store};
use crate::watcher::Event;

/// The one writer of a [`Store`].
pub struct Writer<K: Resource> {
    store: Store<K>,
    ready: watch::Sender<bool>,
    /// The objects of the list under way.
    listing: Vec<Arc<K>>,
}

/// A store and its writer, with no indexes.
pub fn store<K: Resource>() -> (Store<K>, Writer<K>) {
    let writer = Writer::new(BTreeMap::new());
    (writer.as_reader(), writer)
}

/// A store and its writer, with indexes: each says which values an object
/// is filed under, read with [`Store::by_index`].
pub fn store_with_indexes<K: Resource>(
    indexes: impl IntoIterator<Item = (String, IndexFn<K>)>,
) -> (Store<K>, Writer<K>) {
    let writer = Writer::new(indexes.into_iter().collect());
    (writer.as_reader(), writer)
}

/// What the store took of one event.
#[derive(Debug)]
pub struct Applied<K> {
    /// The event, its object the one the store holds.
    pub event: Event<Arc<K>>,
    /// The changes the store took: one for a watch event (none for a
    /// deletion of an object it did not hold), the difference for the end
    /// of a list.
    pub changes: Vec<Change<K>>,
}

impl<K: Resource> Writer<K> {
    fn new(indexers: BTreeMap<String, IndexFn<K>>) -> Writer<K> {
        let (store, ready) = Store::new(indexers);
        Writer {
            store,
            ready,
            listing: Vec::new(),
        }
    }

    /// Another reader of the store.
    pub fn as_reader(&self) -> Store<K> {
        self.store.clone()
    }

    /// Takes one watcher event.
    pub fn apply(&mut self, event: Event<K>) -> Applied<K> {
        let mut changes = Vec::new();
        let event = match event {
            Event::Init => {
                self.listing.clear();
                Event::Init
            }
            Event::InitApply(object) => {
                let object = Arc::new(object);
                self.listing.push(object.clone());
                Event::InitApply(object)
            }
            Event::InitDone { resource_version } => {
                let listed = std::mem::take(&mut self.listing);
                changes = self.store.replace(listed, &resource_version);
                // Ready means the store holds the list, before anyone is
                // told its difference.
                self.ready.send_replace(true);
                Event::InitDone { resource_version }
            }
            Event::Apply(object) => {
                let object = Arc::new(object);
                changes.extend(self.store.apply(object.clone(), false));
                Event::Apply(object)
            }
            Event::Delete(object) => {
                let object = Arc::new(object);
                changes.extend(self.store.apply(object.clone(), true));
                Event::Delete(object)
            }
            Event::Bookmark {
                resource_version,
                resync,
            } => {
                self.store.advance(&resource_version);
                Event::Bookmark {
                    resource_version,
                    resync,
                }
            }
        };
        Applied { event, changes }
    }
}

/// Keeps `writer`'s store as `stream` says, handing each item on, its
/// object shared with the store; the store follows only while the
/// returned stream is read.
pub fn reflector<K, S>(
    mut writer: Writer<K>,
    stream: S,
) -> impl Stream<Item = Result<Event<Arc<K>>, Error>> + Send
where
    K: Resource,
    S: Stream<Item = Result<Event<K>, Error>> + Send,
{
    stream.map(move |item| item.map(|event| writer.apply(event).event))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::Object;

    fn pod(name: &str, version: &str, node: &str) -> Object {
        Object {
            namespace: "ns".into(),
            name: name.into(),
            resource_version: version.into(),
            value: node.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn names(objects: Vec<Arc<Object>>) -> Vec<String> {
        let mut names: Vec<_> = objects.iter().map(|o| o.name.clone()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_list_replaces_the_store_at_its_end_and_makes_it_ready() {
        let by_node: IndexFn =
            Arc::new(|o: &Object| vec![String::from_utf8_lossy(&o.value).into()]);
        let (store, mut writer) = store_with_indexes([("node".to_string(), by_node)]);
        assert!(!store.is_ready());
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(pod("a", "3", "n1")));
        writer.apply(Event::InitApply(pod("b", "4", "n2")));
        assert!(store.is_empty(), "half a list is never seen");
        let done = writer.apply(Event::InitDone {
            resource_version: "5".into(),
        });
        assert_eq!(done.changes.len(), 2);
        store.wait_until_ready().await.unwrap();
        assert_eq!(store.resource_version(), "5");
        assert_eq!(names(store.by_index("node", "n1")), ["a"]);

        // A watch moves a to n2 and deletes b.
        let moved = writer.apply(Event::Apply(pod("a", "6", "n2")));
        assert!(
            matches!(&moved.changes[..], [Change::Modified { old, .. }] if old.resource_version == "3")
        );
        writer.apply(Event::Delete(pod("b", "7", "n2")));
        assert_eq!(names(store.by_index("node", "n2")), ["a"]);
        assert!(store.by_index("node", "n1").is_empty());

        // A relist: b is back, a unchanged (same version: no change).
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(pod("a", "6", "n2")));
        writer.apply(Event::InitApply(pod("b", "9", "n1")));
        let relisted = writer.apply(Event::InitDone {
            resource_version: "9".into(),
        });
        assert!(matches!(&relisted.changes[..], [Change::Added(b)] if b.name == "b"));
        assert_eq!(names(store.state()), ["a", "b"]);

        // A resync's objects keep their older versions; the store's own
        // version only moves forward.
        writer.apply(Event::Apply(pod("c", "8", "n1")));
        assert_eq!(store.resource_version(), "9");
        writer.apply(Event::Bookmark {
            resource_version: "12".into(),
            resync: true,
        });
        assert_eq!(store.resource_version(), "12");
    }

    #[tokio::test]
    async fn a_store_whose_writer_went_away_before_a_list_is_never_ready() {
        let (store, writer) = store::<Object>();
        drop(writer);
        assert!(store.wait_until_ready().await.is_err());
    }
}
