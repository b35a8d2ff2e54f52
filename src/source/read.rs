//! Reading a resource's objects at a past revision from its origin (etcd,
//! or the upstream watchproxy), for the reads the cache cannot answer (a
//! version older than its window, or a cache that did not catch up in
//! time).

use std::sync::Arc;

use super::tier::{Tier, PAGE};
use super::{Etcd, EtcdError, Origin};
use crate::object::{range_end, Object, Resource, Revision};
use crate::pb;
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
    /// Where the upstream watchproxy's list goes on, for the next page.
    pub upstream: Option<String>,
}

/// Where a page starts: after a key (etcd), or where the upstream
/// watchproxy's list left off.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageStart<'a> {
    pub after: Option<&'a str>,
    pub upstream: Option<&'a str>,
}

impl Origin {
    /// The objects `predicate` selects at `revision`, from `start`, at most
    /// `limit` of them. Values that cannot be decoded are skipped, as the
    /// cache skips them.
    pub async fn objects_at(
        &self,
        m: &ResourceMetrics,
        resource: &Resource,
        predicate: &Predicate,
        revision: Revision,
        start: PageStart<'_>,
        limit: usize,
    ) -> Result<ObjectsPage, EtcdError> {
        match self {
            Origin::Etcd(etcd) => {
                (etcd.objects_at(m, resource, predicate, revision, start.after, limit)).await
            }
            Origin::Tier(tier) => {
                tier.objects_at(predicate, revision, start.upstream, limit)
                    .await
            }
        }
    }
}

impl Tier {
    /// Pages of the upstream's objects at exactly `revision`, filtered
    /// here. Each asks for no more than the page still lacks, so the
    /// upstream's list goes on after the last object this page returns.
    async fn objects_at(
        &self,
        predicate: &Predicate,
        revision: Revision,
        upstream: Option<&str>,
        limit: usize,
    ) -> Result<ObjectsPage, EtcdError> {
        let mut items = Vec::new();
        let mut token = upstream.unwrap_or_default().to_owned();
        let mut remaining;
        loop {
            let want = limit.saturating_sub(items.len()).min(PAGE as usize);
            // Later pages are cut from the revision their token carries.
            let (resource_version, resource_version_match) = match token.is_empty() {
                true => (revision.to_string(), pb::ResourceVersionMatch::Exact.into()),
                false => (String::new(), pb::ResourceVersionMatch::Unspecified.into()),
            };
            let page = (self.list_page(pb::ListRequest {
                resource: self.resource.name.clone(),
                namespace: predicate.namespace().unwrap_or_default().to_owned(),
                field_selector: (predicate.name())
                    .map(|n| format!("metadata.name={n}"))
                    .unwrap_or_default(),
                resource_version,
                resource_version_match,
                limit: want as i64,
                continue_token: token,
                ..Default::default()
            }))
            .await?;
            let objects = page.items.iter().filter_map(|o| self.object(o));
            items.extend(objects.filter(|o| predicate.matches(o)).map(Arc::new));
            token = page.continue_token;
            remaining = page.remaining_item_count;
            if token.is_empty() || items.len() >= limit {
                break;
            }
        }
        let more = !token.is_empty();
        Ok(ObjectsPage {
            items,
            more,
            remaining: remaining
                .filter(|_| more && !predicate.has_selectors())
                .map(|n| n as usize),
            upstream: more.then_some(token),
        })
    }
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
            for kv in &page.kvs {
                if let Ok(o) = super::decode(resource, kv) {
                    if predicate.matches(&o) {
                        items.push(Arc::new(o));
                    }
                }
            }
            let last = page
                .kvs
                .last()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
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
                let after_last = format!("{}\0", last.key());
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
            upstream: None,
        })
    }
}

impl Etcd {
    /// The objects `predicate` selects among the keys `[start, end)` at
    /// `revision`, in key order, read in pages of `PAGE` keys: a read of
    /// one key reads that key alone. Values that cannot be decoded are
    /// skipped, as the cache skips them.
    pub async fn objects_in(
        &self,
        m: &ResourceMetrics,
        resource: &Resource,
        predicate: &Predicate,
        (start, end): (&[u8], &[u8]),
        revision: Revision,
    ) -> Result<Vec<Arc<Object>>, EtcdError> {
        let mut items = Vec::new();
        let mut from = start.to_vec();
        loop {
            m.etcd_request(EtcdRequest::exact_list_page);
            let options = etcd_client::GetOptions::new()
                .with_range(end)
                .with_limit(PAGE)
                .with_revision(revision as i64);
            let page = self.range(from, options).await?;
            let decoded = page
                .kvs()
                .iter()
                .filter_map(|kv| super::decode(resource, kv).ok());
            items.extend(decoded.filter(|o| predicate.matches(o)).map(Arc::new));
            match page.kvs().last() {
                Some(last) if page.more() => from = [last.key(), &[0]].concat(),
                _ => return Ok(items),
            }
        }
    }
}
