//! Reading a resource's objects from etcd at a past revision, for the
//! reads the cache cannot answer (a version older than its window, or a
//! cache that did not catch up in time).

use std::sync::Arc;

use super::{Etcd, EtcdError};
use crate::object::{range_end, Object, Resource, Revision};
use crate::selector::Predicate;
use crate::telemetry::{EtcdRequest, ResourceMetrics};

/// One page of the objects a predicate selects at a revision.
pub struct ObjectsPage {
    /// In key order, at most the page's limit.
    pub items: Vec<Arc<Object>>,
    /// More objects follow the page.
    pub more: bool,
    /// How many follow, when the predicate selects by key range only (so
    /// etcd can count them).
    pub remaining: Option<usize>,
}

impl Etcd {
    /// The objects `predicate` selects at `revision`, after the key
    /// `after`, at most `limit` of them. Values that cannot be decoded are
    /// skipped, as the cache skips them.
    pub async fn objects_at(
        &self,
        m: &ResourceMetrics,
        resource: &Resource,
        predicate: &Predicate,
        revision: Revision,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ObjectsPage, EtcdError> {
        let prefix = match resource.single_key(predicate.namespace(), predicate.name()) {
            Some(key) => key,
            None => resource.namespace_prefix(predicate.namespace().unwrap_or("")),
        };
        let end = if predicate.name().is_some() {
            format!("{prefix}\0")
        } else {
            range_end(&prefix)
        };
        let mut from = match after {
            Some(a) if a >= prefix.as_str() => format!("{a}\0"),
            _ => prefix.clone(),
        };
        let mut items = Vec::new();
        let page_size = limit.saturating_add(1).clamp(1, 1000) as i64;
        loop {
            let page = self
                .page(
                    m,
                    EtcdRequest::exact_list_page,
                    &from,
                    &end,
                    Some(revision),
                    page_size,
                )
                .await?;
            for (k, v, rev) in &page.kvs {
                if let Ok(o) = resource.decode(k, v, *rev) {
                    if predicate.matches(&o) {
                        items.push(Arc::new(o));
                    }
                }
            }
            let last = page
                .kvs
                .last()
                .map(|(k, _, _)| String::from_utf8_lossy(k).into_owned());
            match last {
                Some(k) if page.more && items.len() <= limit => from = format!("{k}\0"),
                _ => break,
            }
        }
        let more = items.len() > limit;
        items.truncate(limit);
        // The keys left in the range are the objects left only when the
        // range is the namespace's: a key layout can put the namespace
        // after the name.
        let counted = !predicate.has_selectors()
            && predicate
                .namespace()
                .is_none_or(|_| prefix != resource.key_prefix());
        let remaining = match items.last() {
            Some(last) if more && counted => {
                let after_last = format!("{}\0", last.key);
                let (n, _) = self
                    .count(
                        m,
                        EtcdRequest::exact_list_page,
                        &after_last,
                        &end,
                        Some(revision),
                        None,
                    )
                    .await?;
                Some(n as usize)
            }
            _ => None,
        };
        Ok(ObjectsPage {
            items,
            more,
            remaining,
        })
    }
}
