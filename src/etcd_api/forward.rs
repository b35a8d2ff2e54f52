//! Keys outside every served prefix, with `etcd_api.outside: forward`:
//! read and watched on etcd through watchproxy's own connection, and
//! counted. etcd's answers are passed on as etcd gave them.

use etcd_client::{GetOptions, SortOrder, SortTarget, WatchOptions};

use super::keys::KeyRange;
use super::wire::header;
use super::EtcdApi;
use crate::api::error::ApiError;
use crate::etcdpb::etcdserverpb::{RangeRequest, RangeResponse};
use crate::etcdpb::mvccpb;
use crate::object::Revision;
use crate::source::{Etcd, Origin};

/// The most pairs one read of etcd for keys between the served prefixes
/// asks for.
const GAP_PAGE: usize = 1000;

impl EtcdApi {
    /// The connection keys outside the served prefixes are read on: the
    /// one the caches read etcd with.
    fn forwarder(&self) -> Result<&Etcd, ApiError> {
        self.core
            .all_served()
            .find_map(|s| match &s.origin {
                Origin::Etcd(etcd) => Some(&**etcd),
                Origin::Tier(_) => None,
            })
            .ok_or_else(|| ApiError::NotFresh {
                resource: "etcd".into(),
            })
    }

    /// A Range wholly outside the served prefixes: etcd's own answer,
    /// at most `page` pairs of it (`more` when cut).
    pub(super) async fn forward_range(
        &self,
        r: &RangeRequest,
        page: usize,
    ) -> Result<RangeResponse, ApiError> {
        let etcd = self.forwarder()?;
        self.core.metrics().etcd_api_forwarded("range");
        // `page` is the request's limit within the bound; none: 0, all.
        let limit = i64::try_from(page).unwrap_or(0);
        let mut o = GetOptions::new()
            .with_limit(limit)
            .with_revision(r.revision)
            .with_min_mod_revision(r.min_mod_revision)
            .with_max_mod_revision(r.max_mod_revision)
            .with_min_create_revision(r.min_create_revision)
            .with_max_create_revision(r.max_create_revision);
        if !r.range_end.is_empty() {
            o = o.with_range(r.range_end.to_vec());
        }
        if let (Ok(target), Ok(order)) = (
            SortTarget::try_from(r.sort_target),
            SortOrder::try_from(r.sort_order),
        ) {
            o = o.with_sort(target, order);
        }
        if r.serializable {
            o = o.with_serializable();
        }
        if r.keys_only {
            o = o.with_keys_only();
        }
        if r.count_only {
            o = o.with_count_only();
        }
        let got = etcd.range(r.key.to_vec(), o).await?;
        Ok(RangeResponse {
            header: header(got.header().map_or(0, |h| h.revision()) as Revision),
            kvs: got.kvs().iter().map(key_value).collect(),
            more: got.more(),
            count: got.count(),
        })
    }

    /// How many pairs `gap` holds at `revision`, and the first `want` of
    /// them in key order, read from etcd in pages of at most
    /// [`GAP_PAGE`].
    pub(super) async fn read_gap(
        &self,
        gap: &KeyRange,
        revision: Revision,
        want: usize,
    ) -> Result<(usize, Vec<mvccpb::KeyValue>), ApiError> {
        let etcd = self.forwarder()?;
        self.core.metrics().etcd_api_forwarded("range");
        let (mut from, end) = gap.etcd_bounds();
        let (mut count, mut kvs) = (None, Vec::new());
        loop {
            let take = want.saturating_sub(kvs.len()).min(GAP_PAGE);
            let mut o = GetOptions::new().with_revision(revision as i64);
            if !end.is_empty() {
                o = o.with_range(end.clone());
            }
            o = match take {
                0 => o.with_count_only(),
                n => o.with_limit(n as i64),
            };
            let got = etcd.range(from, o).await?;
            // The first page's count is the whole gap's.
            count.get_or_insert(got.count() as usize);
            kvs.extend(got.kvs().iter().map(key_value));
            match got.kvs().last() {
                Some(last) if got.more() && kvs.len() < want => from = [last.key(), &[0]].concat(),
                _ => return Ok((count.unwrap_or_default(), kvs)),
            }
        }
    }

    /// A watch of `range` on etcd from `start` (0: from now).
    pub(super) async fn watch_gap(
        &self,
        range: &KeyRange,
        start: Revision,
        prev_kv: bool,
    ) -> Result<etcd_client::WatchStream, ApiError> {
        let etcd = self.forwarder()?;
        self.core.metrics().etcd_api_forwarded("watch");
        let (key, end) = range.etcd_bounds();
        let mut o = WatchOptions::new()
            .with_start_revision(start as i64)
            .with_progress_notify();
        if !end.is_empty() {
            o = o.with_range(end);
        }
        if prev_kv {
            o = o.with_prev_key();
        }
        Ok(etcd.watch(key, o).await?)
    }
}

/// etcd's pair as its own message.
pub fn key_value(kv: &etcd_client::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key().to_vec().into(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        value: kv.value().to_vec().into(),
        lease: kv.lease(),
    }
}

/// etcd's event as its own message.
pub fn event(e: &etcd_client::Event) -> mvccpb::Event {
    let kind = match e.event_type() {
        etcd_client::EventType::Put => mvccpb::event::EventType::Put,
        etcd_client::EventType::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: e.kv().map(key_value),
        prev_kv: e.prev_kv().map(key_value),
    }
}
