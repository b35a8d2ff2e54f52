//! Every request watchproxy makes to etcd, each with a deadline and a count.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, GetOptions, GetResponse, KeyValue, KvClient, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchStream,
};

use super::revival::Revival;
use crate::cache::OverBudget;
use crate::object::Revision;
use crate::telemetry::{EtcdRequest, ResourceMetrics};

/// An etcd failure, as the reflector and the API need to tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd request failed: {0}")]
    Client(#[source] etcd_client::Error),
    #[error("etcd request timed out")]
    Timeout,
    /// The revision asked for has been compacted away.
    #[error("revision compacted (etcd keeps revisions from {compacted})")]
    Compacted { compacted: Revision },
    /// The revision asked for is newer than etcd's.
    #[error("revision is newer than etcd's current revision")]
    FutureRevision,
    #[error("etcd cancelled the watch: {0}")]
    WatchCanceled(String),
    #[error("etcd closed the watch stream")]
    StreamEnded,
    /// A watchproxy upstream (`upstream:`) failed the call.
    #[error("the upstream watchproxy failed: {0}")]
    Upstream(String),
    /// A watchproxy upstream resynced: the history since our version is
    /// lost, and listing it again gives the difference.
    #[error("the upstream watchproxy resynced with etcd; its history since our version is lost")]
    UpstreamResynced,
    /// Not etcd's: the resource's objects do not fit its `max_bytes`.
    #[error("the resource is over its budget: {0}")]
    OverBudget(#[from] OverBudget),
}

impl From<etcd_client::Error> for EtcdError {
    fn from(e: etcd_client::Error) -> Self {
        if let etcd_client::Error::GRpcStatus(s) = &e {
            if s.message().contains("required revision has been compacted") {
                return EtcdError::Compacted { compacted: 0 };
            }
            if s.message()
                .contains("required revision is a future revision")
            {
                return EtcdError::FutureRevision;
            }
        }
        EtcdError::Client(e)
    }
}

/// One key/value pair as listed.
pub type ListedKv = KeyValue;

/// A page of a range read.
pub struct Page {
    pub kvs: Vec<ListedKv>,
    /// The revision the page was read at.
    pub revision: Revision,
    pub more: bool,
}

/// A range read page by page; see [`Etcd::pages`].
pub struct Pages<'a> {
    etcd: &'a Etcd,
    m: &'a ResourceMetrics,
    /// Where the next page starts; none once the last was read.
    from: Option<String>,
    end: String,
    revision: Option<Revision>,
}

impl Pages<'_> {
    /// The next page's pairs; none after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<ListedKv>>, EtcdError> {
        let Some(from) = self.from.take() else {
            return Ok(None);
        };
        let (etcd, size) = (self.etcd, self.etcd.page_size);
        let page = etcd
            .page(
                self.m,
                EtcdRequest::list_page,
                &from,
                &self.end,
                self.revision,
                size,
            )
            .await?;
        self.revision = Some(page.revision);
        if page.more {
            if let Some(kv) = page.kvs.last() {
                let mut after = kv.key().to_vec();
                after.push(0); // the smallest key after the last one
                self.from = Some(String::from_utf8(after).map_err(|_| {
                    EtcdError::Client(etcd_client::Error::InvalidArgs("key is not UTF-8".into()))
                })?);
            }
        }
        Ok(Some(page.kvs))
    }

    /// The revision the pages are cut from, once the first was read.
    pub fn revision(&self) -> Option<Revision> {
        self.revision
    }
}

/// The etcd client of the service, shared by every resource (one HTTP/2
/// connection; each reflector's watch is a stream of its own on it).
#[derive(Clone)]
pub struct Etcd {
    pub(super) client: Client,
    /// The client of the watch streams: `client`, or one of its own on
    /// `etcd.watch_endpoints`.
    pub(super) watcher: Client,
    pub(super) timeout: Duration,
    pub(super) page_size: i64,
    /// Shared by the reflectors of every resource read through it.
    pub(super) revival: Arc<Revival>,
}

/// The largest answer of etcd read: as large as the Kubernetes apiserver
/// reads (2 GiB). etcd bounds its requests, not its answers: a list page
/// of many large objects, or a watch catching up (etcd sends up to 1,000
/// revisions in one response), passes gRPC's default of 4 MiB.
const MAX_ANSWER: usize = i32::MAX as usize;

impl Etcd {
    async fn deadline<T>(
        &self,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(EtcdError::from),
            Err(_) => Err(EtcdError::Timeout),
        }
    }

    /// `call` on the KV client; once more with a new token after etcd
    /// said the last one expired.
    async fn kv<T, F>(&self, call: impl Fn(KvClient) -> F) -> Result<T, EtcdError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let kv = || {
            self.client
                .kv_client()
                .max_decoding_message_size(MAX_ANSWER)
        };
        match self.deadline(call(kv())).await {
            Err(e) if token_expired(&e) => {
                self.refresh_token().await?;
                self.deadline(call(kv())).await
            }
            r => r,
        }
    }

    pub(super) async fn get(
        &self,
        key: &str,
        options: GetOptions,
    ) -> Result<GetResponse, EtcdError> {
        self.kv(|mut kv| {
            let options = options.clone();
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }

    /// Reads in one read-only transaction: the revision they were read at,
    /// and each read's answer, in order.
    pub(super) async fn reads(
        &self,
        reads: Vec<TxnOp>,
    ) -> Result<(Revision, Vec<GetResponse>), EtcdError> {
        let asked = reads.len();
        let txn = Txn::new().and_then(reads);
        let resp = self
            .kv(|mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision() as Revision);
        let gets: Vec<GetResponse> = (resp.op_responses().into_iter())
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        if gets.len() != asked {
            return Err(EtcdError::Client(etcd_client::Error::InvalidArgs(
                "etcd answered a transaction of reads with another number".into(),
            )));
        }
        Ok((revision, gets))
    }

    /// Takes a new auth token after etcd said the last one expired.
    async fn refresh_token(&self) -> Result<(), EtcdError> {
        self.deadline(self.client.refresh_token()).await
    }

    async fn refresh_watch_token(&self) -> Result<(), EtcdError> {
        self.deadline(self.watcher.refresh_token()).await
    }

    /// One page of `[start, end)` at `revision` (None: the latest).
    pub async fn page(
        &self,
        m: &ResourceMetrics,
        request: EtcdRequest,
        start: &str,
        end: &str,
        revision: Option<Revision>,
        limit: i64,
    ) -> Result<Page, EtcdError> {
        m.etcd_request(request);
        let mut options = GetOptions::new().with_range(end).with_limit(limit);
        if let Some(r) = revision {
            options = options.with_revision(r as i64);
        }
        let mut resp = self.get(start, options).await?;
        let revision = resp.header().map_or(0, |h| h.revision() as Revision);
        let more = resp.more();
        let kvs = resp.take_kvs();
        Ok(Page {
            kvs,
            revision,
            more,
        })
    }

    /// The pairs of `[start, end)` in pages all cut from one revision:
    /// the latest at the first page.
    pub fn pages<'a>(&'a self, m: &'a ResourceMetrics, start: &str, end: &str) -> Pages<'a> {
        Pages {
            etcd: self,
            m,
            from: Some(start.to_owned()),
            end: end.to_owned(),
            revision: None,
        }
    }

    /// The number of keys in `[start, end)` at `revision` (None: latest)
    /// with a mod revision of at least `min_mod`, and the revision read at.
    pub async fn count(
        &self,
        m: &ResourceMetrics,
        request: EtcdRequest,
        start: &str,
        end: &str,
        revision: Option<Revision>,
        min_mod: Option<Revision>,
    ) -> Result<(i64, Revision), EtcdError> {
        m.etcd_request(request);
        let mut options = GetOptions::new().with_range(end).with_count_only();
        if let Some(r) = revision {
            options = options.with_revision(r as i64);
        }
        if let Some(r) = min_mod {
            options = options.with_min_mod_revision(r as i64);
        }
        let resp = self.get(start, options).await?;
        Ok((
            resp.count(),
            resp.header().map_or(0, |h| h.revision() as Revision),
        ))
    }

    /// etcd's current revision `R`, and whether etcd holds the same keys
    /// and values in `[start, end)` at `R` as at `since`: each key at `R`
    /// was last written at or before `since` (so it held the same value
    /// then), and there are as many as at `since`.
    ///
    /// This is a proof about objects, not history: a key created and
    /// deleted in between leaves no trace in it. It lets reads be answered
    /// as of `R` from a cache at `since` without relying on requested
    /// progress notifications, which etcd before 3.4.31 / 3.5.13 may send
    /// ahead of undelivered events. When the cache is already at `R` it
    /// costs one small read.
    pub async fn unchanged_since(
        &self,
        m: &ResourceMetrics,
        start: &str,
        end: &str,
        since: Revision,
    ) -> Result<(Revision, bool), EtcdError> {
        self.unchanged_between(m, start, end, since, None).await
    }

    /// As [`Etcd::unchanged_since`], up to `until` instead of the latest
    /// revision.
    ///
    /// One read-only transaction: the two counts and the newest mod
    /// revision are read at one revision in one request, so a burst of
    /// checks costs etcd one request each.
    pub async fn unchanged_between(
        &self,
        m: &ResourceMetrics,
        start: &str,
        end: &str,
        since: Revision,
        until: Option<Revision>,
    ) -> Result<(Revision, bool), EtcdError> {
        if let Some(until) = until.filter(|&u| u <= since) {
            return Ok((until, true));
        }
        m.etcd_request(EtcdRequest::current_revision);
        let at = until.map_or(0, |u| u as i64);
        let range = || GetOptions::new().with_range(end);
        let count = |revision: i64| {
            let options = range().with_count_only().with_revision(revision);
            TxnOp::get(start, Some(options))
        };
        let newest = range()
            .with_revision(at)
            .with_keys_only()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(1);
        // Nothing was there at revision 0 (which etcd would read as the
        // latest): it is not asked.
        let mut ops = vec![count(at), TxnOp::get(start, Some(newest))];
        if since > 0 {
            ops.push(count(since as i64));
        }
        let (read_at, gets) = match self.reads(ops).await {
            Ok(read) => read,
            Err(EtcdError::Compacted { .. }) => {
                let now = match until {
                    Some(u) => u,
                    None => self.current_revision(m, start, end).await?,
                };
                return Ok((now, false));
            }
            Err(e) => return Err(e),
        };
        let now = until.unwrap_or(read_at);
        let (at_now, newest, then) = match &gets[..] {
            [at_now, newest] => (at_now, newest, 0),
            [at_now, newest, then] => (at_now, newest, then.count()),
            _ => unreachable!("as many answers as reads"),
        };
        let newest = newest
            .kvs()
            .first()
            .map_or(0, |kv| kv.mod_revision() as Revision);
        Ok((now, then == at_now.count() && newest <= since))
    }

    /// etcd's current revision, from the header of a one-key read.
    pub(super) async fn current_revision(
        &self,
        m: &ResourceMetrics,
        start: &str,
        end: &str,
    ) -> Result<Revision, EtcdError> {
        m.etcd_request(EtcdRequest::current_revision);
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(1)
            .with_keys_only();
        let resp = self.get(start, options).await?;
        Ok(resp.header().map_or(0, |h| h.revision() as Revision))
    }

    /// Opens a watch on a gRPC stream of its own.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
    ) -> Result<WatchStream, EtcdError> {
        let key: Vec<u8> = key.into();
        let mut w = (self.watcher.watch_client()).max_decoding_message_size(MAX_ANSWER);
        match self
            .deadline(w.watch(key.clone(), Some(options.clone())))
            .await
        {
            Err(e) if token_expired(&e) => {
                self.refresh_watch_token().await?;
                self.deadline(w.watch(key, Some(options))).await
            }
            r => r,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A range read as its caller asked for it, within the request
    /// timeout (once more with a new token when etcd's expired): etcd's
    /// API passed through.
    pub async fn range(&self, key: Vec<u8>, options: GetOptions) -> Result<GetResponse, EtcdError> {
        (self.kv(|mut kv| {
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        }))
        .await
    }
}

/// Whether etcd refused a request because the client's auth token expired.
fn token_expired(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Client(etcd_client::Error::GRpcStatus(s))
        if s.code() == tonic::Code::Unauthenticated && s.message().contains("invalid auth token"))
}
