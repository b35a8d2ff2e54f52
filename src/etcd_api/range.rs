//! KV.Range from the caches: a range checked into a typed query, read from
//! a snapshot (or from etcd, for a revision the cache cannot show), then
//! filtered, sorted and cut as etcd does.

use std::cmp::Ordering;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::keys::{current, KeyRange};
use super::wire::{header, key_value};
use super::EtcdApi;
use crate::access::Identity;
use crate::api::error::{etcd_status, ApiError};
use crate::api::{origin_failed, CallInfo, CallMeta, ReadFrom, Served};
use crate::config::Verb;
use crate::etcdpb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::etcdpb::etcdserverpb::{RangeRequest, RangeResponse};
use crate::etcdpb::mvccpb;
use crate::object::{Object, RequestedVersion, Resource, Revision};
use crate::selector::Predicate;
use crate::source::Origin;

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

    /// Whether the answer needs every pair of the range: to sort them
    /// other than by key, or to filter them by revision (etcd reads them
    /// all then too). Otherwise the first of them in key order make it.
    fn needs_every_pair(&self) -> bool {
        self.sort.is_some() || self.mod_revisions != (0, 0) || self.create_revisions != (0, 0)
    }

    /// The pairs of the range one answer holds at most: the limit asked
    /// for (0: all), within `max_page`.
    fn page(&self, max_page: impl Fn(usize) -> usize) -> usize {
        max_page(match self.limit {
            0 => usize::MAX,
            n => n,
        })
    }

    /// The answer etcd gives from `kvs`, in key order, of the `count`
    /// pairs of the range at `revision`: all of them when the answer
    /// [needs every pair](Self::needs_every_pair), else the first in key
    /// order. The revision filters, the sort and `page` apply in that
    /// order; `more` when pairs are left out.
    fn answer(
        &self,
        revision: Revision,
        kvs: Vec<mvccpb::KeyValue>,
        count: usize,
        page: usize,
    ) -> RangeResponse {
        let read = kvs.len();
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
        let more = kept.len() > page || count > read;
        kept.truncate(page);
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
            count: count as i64,
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
        let placed = (query.as_ref().ok()).and_then(|q| self.place(&q.range, |_| false).ok());
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
            let readable =
                |r: &Resource| (entered.judged.auth).reaches(caller, Verb::List, &r.name);
            let placement = self.place(&q.range, readable)?;
            if !placement.gaps.is_empty() {
                (entered.judged.auth).authorize_unserved(caller, Verb::List)?;
            }
            let reader = &entered.identity;
            let page = q.page(|n| self.core.user_limits().page(n));
            if placement.parts.is_empty() {
                // etcd's own read, charged as a read the caches cannot
                // answer.
                self.core.user_limits().costly_read(reader)?;
                return self.forward_range(&req, page).await;
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
            // Each part and gap in key order, until the answer has the
            // pairs it shows; every part counts its own.
            let mut want = match (q.count_only, q.needs_every_pair()) {
                (true, _) => 0,
                (false, true) => usize::MAX,
                (false, false) => page,
            };
            let mut pieces: Vec<Piece> = (parts.iter().enumerate())
                .map(|(i, (.., range))| Piece::Part(range.start.as_slice(), i))
                .collect();
            if let At::Exact(_) = at {
                if !placement.gaps.is_empty() {
                    self.core.user_limits().costly_read(reader)?;
                }
                pieces.extend(placement.gaps.iter().map(Piece::Gap));
            }
            pieces.sort_by(|a, b| a.start().cmp(b.start()));
            let (mut revision, mut count, mut kvs) = (0, 0, Vec::new());
            for piece in pieces {
                let (r, n, read) = match (piece, at) {
                    (Piece::Part(_, i), _) => {
                        let (s, predicate, range) = &parts[i];
                        let cut = Cut { range, want };
                        self.range_part(s, cut, at, predicate, reader).await?
                    }
                    (Piece::Gap(gap), At::Exact(n)) => {
                        let (count, kvs) = self.read_gap(gap, n, want).await?;
                        (0, count, kvs)
                    }
                    (Piece::Gap(_), _) => continue,
                };
                revision = revision.max(r);
                count += n;
                want = want.saturating_sub(read.len());
                kvs.extend(read);
            }
            Ok(q.answer(revision, kvs, count, page))
        };
        self.core
            .answer_with(&meta.metadata, info, call, etcd_status)
            .await
            .map(Response::new)
    }

    /// Of the objects of `cut.range` the caller may see: how many there
    /// are, the first `cut.want` of them in key order as etcd's pairs, and
    /// etcd's revision at the time (what etcd's header names, whichever
    /// state was read). A snapshot is read through the narrowest of its
    /// key range and field indexes, as a List page is.
    async fn range_part(
        &self,
        s: &Served,
        cut: Cut<'_>,
        at: At,
        predicate: &Predicate,
        reader: &Identity,
    ) -> Result<(Revision, usize, Vec<mvccpb::KeyValue>), ApiError> {
        let source = match at {
            At::Serializable => self.core.source_for(s, RequestedVersion::Any).await?,
            At::Consistent => self.core.source_for(s, RequestedVersion::Latest).await?,
            At::Exact(n) => self.exactly_at(s, n, reader).await?,
        };
        let revision = match source {
            ReadFrom::Cache(snapshot) => {
                let (from, to) = cut.range.bounds();
                let it = snapshot.select_between(&s.cache.resource, predicate, from, to);
                let (count, kvs) = cut.take(it);
                return Ok((current(s).max(snapshot.revision), count, kvs));
            }
            ReadFrom::Origin(revision) => revision,
        };
        let Origin::Etcd(etcd) = &s.origin else {
            return Err(ApiError::NotFresh {
                resource: s.cache.resource.name.clone(),
            });
        };
        let end = cut.range.end_key().unwrap_or_else(|| vec![0]);
        let keys = (cut.range.start.as_slice(), end.as_slice());
        let read =
            (etcd.objects_in(&s.metrics, &s.cache.resource, predicate, keys, revision)).await;
        let objects = read.map_err(|e| origin_failed(s, revision, e))?;
        let (count, kvs) = cut.take(objects.iter());
        Ok((current(s).max(revision), count, kvs))
    }

    /// The state at `n`: a snapshot of the cache, else etcd's at `n`
    /// (charged to `reader`). A revision etcd has not reached is refused
    /// at once, as etcd refuses it.
    async fn exactly_at(
        &self,
        s: &Served,
        n: Revision,
        reader: &Identity,
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

/// A part of a Range's keys, read in key order: a cache's (by its index
/// among the parts) or a gap between the served prefixes.
enum Piece<'a> {
    Part(&'a [u8], usize),
    Gap(&'a KeyRange),
}

impl Piece<'_> {
    fn start(&self) -> &[u8] {
        match self {
            Piece::Part(start, _) => start,
            Piece::Gap(gap) => &gap.start,
        }
    }
}

/// How much of a part's range an answer takes.
struct Cut<'a> {
    range: &'a KeyRange,
    /// The pairs still wanted, in key order.
    want: usize,
}

impl Cut<'_> {
    /// How many `objects` there are, and the first `want` as pairs.
    fn take<'o>(
        &self,
        mut objects: impl Iterator<Item = &'o Arc<Object>>,
    ) -> (usize, Vec<mvccpb::KeyValue>) {
        let kvs: Vec<mvccpb::KeyValue> = (objects.by_ref())
            .take(self.want)
            .map(|o| key_value(o, true))
            .collect();
        (kvs.len() + objects.count(), kvs)
    }
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

    /// The answer from every pair of the range, with no page bound.
    fn answer(q: &RangeQuery) -> RangeResponse {
        q.answer(10, objects(), 3, q.page(|n| n))
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
        let answer = answer(&q);
        assert_eq!(keys(&answer), ["c"].map(|n| format!("/p/ns/{n}")));
        assert_eq!((answer.count, answer.more), (3, true));
        assert_eq!(answer.header.unwrap().revision, 10);
    }

    #[test]
    fn a_target_other_than_the_key_sorts_ascending_by_default() {
        let q = query(|r| r.sort_target = SortTarget::Value as i32);
        let answer = answer(&q);
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
        let keys_only = answer(&query(|r| r.keys_only = true));
        assert!(keys_only
            .kvs
            .iter()
            .all(|kv| kv.value.is_empty() && kv.version > 0));
        let count_only = answer(&query(|r| r.count_only = true));
        assert_eq!((count_only.kvs.len(), count_only.count), (0, 3));
    }

    #[test]
    fn a_page_bound_cuts_the_answer_as_a_limit_does_and_the_count_stays_whole() {
        let sorted = query(|r| {
            r.sort_target = SortTarget::Value as i32;
            r.limit = 3;
        });
        let cut = sorted.answer(10, objects(), 3, sorted.page(|n| n.min(2)));
        assert_eq!(keys(&cut), ["b", "c"].map(|n| format!("/p/ns/{n}")));
        assert_eq!((cut.count, cut.more), (3, true));
        // In key order only the first pairs are read: the count says how
        // many the range holds.
        let plain = query(|_| {});
        assert!(!plain.needs_every_pair() && sorted.needs_every_pair());
        let first: Vec<_> = objects().into_iter().take(2).collect();
        let cut = plain.answer(10, first, 3, plain.page(|n| n.min(2)));
        assert_eq!((cut.kvs.len(), cut.count, cut.more), (2, 3, true));
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
