//! KV.Range from the caches: a range checked into a typed query, read from
//! a snapshot (or from etcd, for a revision the cache cannot show), then
//! filtered, sorted and cut as etcd does.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::keys::{current, End, KeyRange};
use super::wire::{header, key_value};
use super::EtcdApi;
use crate::api::error::{etcd_status, ApiError};
use crate::api::{origin_failed, CallInfo, CallMeta, ReadFrom, Served};
use crate::cache::Snapshot;
use crate::config::Verb;
use crate::etcdpb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::etcdpb::etcdserverpb::{RangeRequest, RangeResponse};
use crate::etcdpb::mvccpb;
use crate::object::{Object, RequestedVersion, Revision};
use crate::selector::Predicate;
use crate::source::PageStart;

/// Which state a Range reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// `serializable`: the cache as it is.
    Serializable,
    /// The default: the cache once it has caught up with etcd's revision
    /// at the time of the call.
    Consistent,
    Exact(Revision),
}

/// A Range request, checked.
#[derive(Debug)]
pub struct RangeQuery {
    pub range: KeyRange,
    at: At,
    /// 0: all of them.
    limit: usize,
    sort: Option<(SortTarget, bool)>,
    keys_only: bool,
    count_only: bool,
    /// `[min, max]` of the mod and the create revisions; 0 leaves a side
    /// open.
    mod_revisions: (i64, i64),
    create_revisions: (i64, i64),
}

impl RangeQuery {
    pub fn parse(r: &RangeRequest) -> Result<Self, ApiError> {
        let range = KeyRange::parse(&r.key, &r.range_end)?;
        let bad_sort = || ApiError::invalid("sort", "etcdserver: invalid sort option");
        let order = SortOrder::try_from(r.sort_order).map_err(|_| bad_sort())?;
        let target = SortTarget::try_from(r.sort_target).map_err(|_| bad_sort())?;
        // etcd's rules: a target other than the key sorts ascending unless
        // told otherwise; keys ascending is the order they are read in.
        let sort = match (target, order) {
            (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => None,
            (_, SortOrder::Descend) => Some((target, true)),
            (_, _) => Some((target, false)),
        };
        let at = match (r.revision, r.serializable) {
            (n, _) if n > 0 => At::Exact(n as Revision),
            (_, true) => At::Serializable,
            (_, false) => At::Consistent,
        };
        Ok(Self {
            range,
            at,
            limit: r.limit.max(0) as usize,
            sort,
            keys_only: r.keys_only,
            count_only: r.count_only,
            mod_revisions: (r.min_mod_revision, r.max_mod_revision),
            create_revisions: (r.min_create_revision, r.max_create_revision),
        })
    }

    /// The answer etcd gives from these pairs of the range at `revision`,
    /// in key order: `count` is of them all, the revision filters, the
    /// sort and the limit then apply in that order.
    fn answer(&self, revision: Revision, kvs: Vec<mvccpb::KeyValue>) -> RangeResponse {
        let count = kvs.len() as i64;
        let between =
            |v: i64, (min, max): (i64, i64)| (min == 0 || v >= min) && (max == 0 || v <= max);
        let mut kept: Vec<mvccpb::KeyValue> = kvs
            .into_iter()
            .filter(|kv| between(kv.mod_revision, self.mod_revisions))
            .filter(|kv| between(kv.create_revision, self.create_revisions))
            .collect();
        if let Some((target, descending)) = self.sort {
            kept.sort_by(|a, b| {
                let order = compare(target, a, b);
                match descending {
                    true => order.reverse(),
                    false => order,
                }
            });
        }
        let more = self.limit > 0 && kept.len() > self.limit;
        if more {
            kept.truncate(self.limit);
        }
        if self.count_only {
            kept.clear();
        }
        if self.keys_only {
            kept.iter_mut().for_each(|kv| kv.value = Default::default());
        }
        RangeResponse {
            header: header(revision),
            kvs: kept,
            more: more && !self.count_only,
            count,
        }
    }
}

fn compare(target: SortTarget, a: &mvccpb::KeyValue, b: &mvccpb::KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

impl EtcdApi {
    /// etcd's KV.Range, answered from the caches of the resources the
    /// range lies in (and, forwarded, from etcd for keys in none).
    pub async fn etcd_range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let (meta, req) = CallMeta::of(request);
        let query = RangeQuery::parse(&req);
        let placed = (query.as_ref().ok()).and_then(|q| self.place(&q.range).ok());
        let info = CallInfo {
            method: "etcd.Range",
            resource: (placed.as_ref().and_then(|p| p.parts.first()))
                .map_or("", |l| l.served.cache.resource.name.as_str()),
            label_selector: "",
            field_selector: "",
        };
        let call = async {
            let entered = self.core.enter_read(&meta)?;
            let caller = &entered.identity.caller;
            let q = query?;
            let placement = self.place(&q.range)?;
            if !placement.gaps.is_empty() {
                (entered.judged.auth).authorize_unserved(caller, Verb::List)?;
            }
            if placement.parts.is_empty() {
                return self.forward_range(&req).await;
            }
            let verb = match (q.range.is_key(), placement.whole().is_some()) {
                (true, true) => Verb::Get,
                _ => Verb::List,
            };
            let mut parts = Vec::with_capacity(placement.parts.len());
            for part in &placement.parts {
                let resource = &part.served.cache.resource.name;
                let (s, scope) = self.core.admit(&entered, verb, resource, &part.namespace)?;
                let predicate = scope.predicate(&s.cache.resource, &part.namespace, "", "", "")?;
                parts.push((s, predicate, &part.range));
            }
            let reader = &caller.user;
            // One resource: its state as asked; several: each at one
            // revision, with what the gaps hold there.
            let at = match (&parts[..], q.at) {
                ([_], _) if placement.gaps.is_empty() => q.at,
                (_, At::Exact(n)) => At::Exact(n),
                ([(s, ..), ..], At::Consistent) => At::Exact(s.freshness.current_revision().await?),
                (_, _) => At::Exact(
                    (parts.iter())
                        .map(|(s, ..)| s.cache.progress().valid_through)
                        .min()
                        .unwrap_or_default(),
                ),
            };
            let mut revision = 0;
            let mut kvs = Vec::new();
            for (s, predicate, range) in &parts {
                let (r, objects) = self.range_objects(s, range, at, predicate, reader).await?;
                revision = revision.max(r);
                kvs.extend(objects.iter().map(|o| key_value(o, true)));
            }
            if let At::Exact(n) = at {
                for gap in &placement.gaps {
                    kvs.extend(self.read_gap(gap, n).await?);
                }
            }
            if parts.len() + placement.gaps.len() > 1 {
                kvs.sort_by(|a, b| a.key.cmp(&b.key));
            }
            Ok(q.answer(revision, kvs))
        };
        self.core
            .answer_with(&meta.metadata, info, call, etcd_status)
            .await
    }

    /// The objects of `range` the caller may see, in key order, and
    /// etcd's revision at the time (what etcd's header names, whichever
    /// state was read).
    async fn range_objects(
        &self,
        s: &Served,
        range: &KeyRange,
        at: At,
        predicate: &Predicate,
        reader: &str,
    ) -> Result<(Revision, Vec<Arc<Object>>), ApiError> {
        let source = match at {
            At::Serializable => self.core.source_for(s, RequestedVersion::Any).await?,
            At::Consistent => self.core.source_for(s, RequestedVersion::Latest).await?,
            At::Exact(n) => self.exactly_at(s, n, reader).await?,
        };
        let revision = match source {
            ReadFrom::Cache(snapshot) => {
                let objects = in_range(&snapshot, range, predicate).cloned().collect();
                return Ok((current(s).max(snapshot.revision), objects));
            }
            ReadFrom::Origin(revision) => revision,
        };
        let resource = &s.cache.resource;
        let read = (s.origin)
            .objects_at(
                &s.metrics,
                resource,
                predicate,
                revision,
                PageStart::default(),
                usize::MAX,
            )
            .await;
        let page = read.map_err(|e| origin_failed(s, revision, e))?;
        let objects = (page.items.into_iter())
            .filter(|o| range.contains(o.key_bytes()))
            .collect();
        Ok((current(s).max(revision), objects))
    }

    /// The state at `n`: a snapshot of the cache, else etcd's at `n`
    /// (charged to `reader`). A revision etcd has not reached is refused
    /// at once, as etcd refuses it.
    async fn exactly_at(
        &self,
        s: &Served,
        n: Revision,
        reader: &str,
    ) -> Result<ReadFrom, ApiError> {
        if n > s.cache.progress().revision {
            let current = s.freshness.current_revision().await?;
            if n > current {
                return Err(ApiError::TooLarge {
                    requested: n,
                    current,
                });
            }
        }
        if let ReadFrom::Cache(_) = self.core.catch_up(s, Some(n)).await? {
            if !s.cache.has_snapshot(n) {
                self.core.user_limits().costly_read(reader)?;
            }
            if let Ok(snapshot) = s.cache.snapshot_at(n) {
                return Ok(ReadFrom::Cache(snapshot));
            }
        } else {
            self.core.user_limits().costly_read(reader)?;
        }
        Ok(ReadFrom::Origin(n))
    }
}

/// The objects of `snapshot` in `range` that `predicate` selects.
fn in_range<'a>(
    snapshot: &'a Snapshot,
    range: &'a KeyRange,
    predicate: &'a Predicate,
) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
    let start = Bound::Included(range.start.as_slice());
    let end = match &range.end {
        End::Key => Bound::Included(range.start.as_slice()),
        End::Unbounded => Bound::Unbounded,
        End::Before(end) => Bound::Excluded(end.as_slice()),
    };
    (snapshot.store.range::<_, [u8]>((start, end)))
        .map(|s| &s.0)
        .filter(move |o| predicate.matches(o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{KvMeta, Resource};

    fn objects() -> Vec<mvccpb::KeyValue> {
        let r = Resource::raw_for_tests();
        // (name, value, mod revision, create revision, version)
        [
            ("a", "3", 7, 2, 3),
            ("b", "1", 5, 5, 1),
            ("c", "2", 9, 4, 2),
        ]
        .into_iter()
        .map(|(name, value, m, c, v)| {
            let key = format!("/p/ns/{name}");
            let o = r.decode(key.as_bytes(), value.as_bytes(), m).unwrap();
            let o = o.stored_as(KvMeta {
                create_revision: c,
                version: v,
                lease: 0,
            });
            key_value(&o, true)
        })
        .collect()
    }

    fn keys(r: &RangeResponse) -> Vec<String> {
        let key = |kv: &mvccpb::KeyValue| String::from_utf8_lossy(&kv.key).into();
        r.kvs.iter().map(key).collect()
    }

    fn query(f: impl FnOnce(&mut RangeRequest)) -> RangeQuery {
        let mut r = RangeRequest {
            key: b"/p/".to_vec().into(),
            range_end: b"/p0".to_vec().into(),
            ..Default::default()
        };
        f(&mut r);
        RangeQuery::parse(&r).unwrap()
    }

    #[test]
    fn count_is_of_the_range_and_the_limit_cuts_after_the_filters_and_sort() {
        let q = query(|r| {
            r.sort_target = SortTarget::Mod as i32;
            r.sort_order = SortOrder::Descend as i32;
            r.limit = 1;
            r.min_create_revision = 3;
        });
        let answer = q.answer(10, objects());
        assert_eq!(keys(&answer), ["c"].map(|n| format!("/p/ns/{n}")));
        assert_eq!((answer.count, answer.more), (3, true));
        assert_eq!(answer.header.unwrap().revision, 10);
    }

    #[test]
    fn a_target_other_than_the_key_sorts_ascending_by_default() {
        let q = query(|r| r.sort_target = SortTarget::Value as i32);
        let answer = q.answer(10, objects());
        assert_eq!(keys(&answer), ["b", "c", "a"].map(|n| format!("/p/ns/{n}")));
        let kv = &answer.kvs[0];
        assert_eq!(
            (
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                &kv.value[..]
            ),
            (5, 5, 1, &b"1"[..])
        );
    }

    #[test]
    fn keys_only_and_count_only_leave_out_what_they_say() {
        let keys_only = query(|r| r.keys_only = true).answer(10, objects());
        assert!(keys_only
            .kvs
            .iter()
            .all(|kv| kv.value.is_empty() && kv.version > 0));
        let count_only = query(|r| r.count_only = true).answer(10, objects());
        assert_eq!((count_only.kvs.len(), count_only.count), (0, 3));
    }

    #[test]
    fn bad_sort_options_and_a_missing_key_are_refused_as_etcd_refuses_them() {
        let bad = RangeRequest {
            key: b"/p/".to_vec().into(),
            sort_order: 9,
            ..Default::default()
        };
        let e = etcd_status(RangeQuery::parse(&bad).unwrap_err());
        assert_eq!(e.message(), "etcdserver: invalid sort option");
        let e = etcd_status(RangeQuery::parse(&RangeRequest::default()).unwrap_err());
        assert_eq!(e.message(), "etcdserver: key is not provided");
    }
}
