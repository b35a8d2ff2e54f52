//! What a watcher follows (the resource, its selection, the list's page
//! size) and how long it waits between retries.

use std::time::Duration;

use crate::pb::{HashRange, ListRequest, ShardSelector, WatchRequest};

/// What a watcher follows and how it retries.
#[derive(Debug, Clone)]
pub struct Config {
    pub(super) query: ListRequest,
    pub(super) first_wait: Duration,
    pub(super) longest_wait: Duration,
}

impl Config {
    /// Every object of `resource`, in every namespace.
    pub fn new(resource: impl Into<String>) -> Config {
        Config {
            query: ListRequest {
                resource: resource.into(),
                limit: 500,
                ..Default::default()
            },
            first_wait: Duration::from_millis(200),
            longest_wait: Duration::from_secs(30),
        }
    }

    /// The resource followed.
    pub fn resource(&self) -> &str {
        &self.query.resource
    }

    /// Only this namespace (all namespaces when empty).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Config {
        self.query.namespace = namespace.into();
        self
    }

    /// Only the objects whose labels match, e.g. `app=web,tier!=db`.
    pub fn label_selector(mut self, selector: impl Into<String>) -> Config {
        self.query.label_selector = selector.into();
        self
    }

    /// Only the objects whose fields match, e.g. `spec.nodeName=node-7`.
    pub fn field_selector(mut self, selector: impl Into<String>) -> Config {
        self.query.field_selector = selector.into();
        self
    }

    /// Keeps only these dotted paths of each value (`spec.nodeName`,
    /// `status.phase`); selectors still see whole objects.
    pub fn fields(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Config {
        self.query.fields = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps only the `metadata` of each value.
    pub fn metadata_only(mut self) -> Config {
        self.query.metadata_only = true;
        self
    }

    /// Only the objects whose `field` (`metadata.uid`, `metadata.name`,
    /// `metadata.namespace` or a selectable field) hashes into one of
    /// `ranges`: `[start, end)` of 64-bit FNV-1a, `end` 0 for 2^64, as
    /// Kubernetes' sharded List and Watch.
    pub fn shard(
        mut self,
        field: impl Into<String>,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Config {
        self.query.shard = Some(ShardSelector {
            field: field.into(),
            ranges: (ranges.into_iter())
                .map(|(start, end)| HashRange { start, end })
                .collect(),
        });
        self
    }

    /// Items per List page (500 unless set).
    pub fn page_size(mut self, items: i64) -> Config {
        self.query.limit = items;
        self
    }

    /// The first and the longest wait between retries (200 ms and 30 s
    /// unless set); never shorter than the server advises.
    pub fn backoff(mut self, first: Duration, longest: Duration) -> Config {
        self.first_wait = first;
        self.longest_wait = longest;
        self
    }

    pub(super) fn watch_from(&self, version: u64) -> WatchRequest {
        let q = &self.query;
        WatchRequest {
            resource: q.resource.clone(),
            namespace: q.namespace.clone(),
            label_selector: q.label_selector.clone(),
            field_selector: q.field_selector.clone(),
            fields: q.fields.clone(),
            metadata_only: q.metadata_only,
            shard: q.shard.clone(),
            resource_version: version.to_string(),
            allow_bookmarks: true,
            ..Default::default()
        }
    }
}
