//! watchproxy-check: proves watchproxy's watch streams against etcd.
//!
//! A watch of the checker's own, straight on etcd, records the true
//! history under the prefix. Informers with random selections (namespace,
//! one object, label, node; bookmarks and initial events on or off) follow
//! watchproxy, resuming and relisting as client-go's do, while the checker
//! writes (or only watches someone else's writes). When the writes end,
//! every informer must catch up within a bound; then each stream is proven
//! segment by segment: exactly the selection's transitions of etcd's
//! history after its start, in order, once each; nothing it did not ask
//! for; bookmarks never ahead of an undelivered event; initial state and
//! lists equal to etcd's at their version; resyncs ending in etcd's state;
//! and the store each informer built equal to etcd's.

pub mod etcd_informer;
pub mod history;
pub mod informer;
pub mod model;
pub mod verify;
pub mod writer;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use watchproxy::pb::watch_proxy_client::WatchProxyClient;

use history::History;
use informer::{Manner, Shared, Transcript};
use model::Selection;

/// What to check, and how hard.
#[derive(Debug, Clone)]
pub struct Options {
    /// etcd's client URLs, separated by commas.
    pub etcd: String,
    /// One URL per replica: informers move between them.
    pub watchproxy: Vec<String>,
    /// The resource's name in watchproxy and its etcd prefix.
    pub resource: String,
    pub prefix: String,
    pub watchers: usize,
    /// Writes per second, for `duration`; 0 only watches.
    pub rate: u64,
    pub duration: Duration,
    /// How long every informer may take to catch up once writes end.
    pub settle: Duration,
    pub seed: u64,
    /// Some informers read slowly, stall for seconds, or drop their
    /// streams and resume.
    pub misbehave: bool,
    /// Callers: bearer tokens, each with the node an authorization rule
    /// (`spec.nodeName={user}`) narrows it to. Informer i calls with the
    /// i-th modulo their number; none: no token.
    pub identities: Vec<(String, String)>,
    pub writes: writer::Writes,
    /// Tasks that make consistent Lists of the whole resource without
    /// pause, each proven equal to etcd's state at its version.
    pub readers: usize,
    /// Which of watchproxy's APIs the informers speak.
    pub api: Api,
}

/// The API the informers read watchproxy through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Api {
    /// `watchproxy.v1`, with every kind of selection.
    #[default]
    WatchProxy,
    /// etcd's own KV.Range and Watch (`etcd_api.enabled`), with the
    /// selections a key range makes: everything, a namespace, one object.
    Etcd,
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub watchers: usize,
    pub writes: u64,
    pub history_events: usize,
    pub checked: usize,
    pub lost: usize,
    pub duplicates: usize,
    pub cross: usize,
    pub resyncs: usize,
    pub relists: u64,
    pub resumes: usize,
    /// Consistent Lists the readers made and proved.
    pub lists: usize,
    /// Of those, the ones that differed from etcd's state at their version.
    pub bad_lists: usize,
    /// From the end of the writes until every informer's store was etcd's.
    pub caught_up_in: Option<Duration>,
    /// The first problems of each bad stream.
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
            && self.lost == 0
            && self.duplicates == 0
            && self.cross == 0
            && self.bad_lists == 0
            && self.caught_up_in.is_some()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} watchers, {} writes ({} events in etcd's history): {} events checked, {} lost, {} duplicated, {} not asked for, {} resyncs proven, {} lists, {} resumes, {} consistent lists proven ({} wrong)",
            self.watchers, self.writes, self.history_events, self.checked, self.lost,
            self.duplicates, self.cross, self.resyncs, self.relists, self.resumes, self.lists,
            self.bad_lists
        )?;
        match self.caught_up_in {
            Some(d) => writeln!(
                f,
                "every informer caught up {:.2} s after the last write",
                d.as_secs_f64()
            )?,
            None => writeln!(f, "some informers never caught up (a stall)")?,
        }
        for failure in &self.failures {
            writeln!(f, "  {failure}")?;
        }
        write!(f, "{}", if self.passed() { "PASS" } else { "FAIL" })
    }
}

/// A check under way: writes and informers running.
pub struct Check {
    options: Options,
    stop: CancellationToken,
    history: watch::Receiver<History>,
    informers: Vec<(Shared, JoinHandle<()>)>,
    writer: Option<JoinHandle<(u64, u64)>>,
    writes: u64,
    /// The revision of the last write: etcd's history must reach it
    /// before the informers can be judged caught up.
    last_write: u64,
    readers: Vec<JoinHandle<Vec<(u64, history::State)>>>,
}

impl Check {
    /// Records etcd's history, starts the informers, then the writes.
    pub async fn start(options: Options) -> anyhow::Result<Check> {
        let stop = CancellationToken::new();
        let mut etcd =
            etcd_client::Client::connect(options.etcd.split(',').collect::<Vec<_>>(), None)
                .await
                .context("connecting to etcd")?;
        let history = history::record(&mut etcd, &options.prefix, stop.clone()).await?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
        let mut informers = Vec::new();
        for id in 0..options.watchers {
            let mut replicas = Vec::new();
            for url in &options.watchproxy {
                let channel = tonic::transport::Endpoint::from_shared(url.clone())
                    .context("a watchproxy URL")?
                    .connect_lazy();
                replicas.push(WatchProxyClient::new(channel).max_decoding_message_size(64 << 20));
            }
            let identity = (!options.identities.is_empty())
                .then(|| options.identities[id % options.identities.len()].clone());
            let mut selection = match options.api {
                Api::WatchProxy => Selection::random(&mut rng),
                Api::Etcd => Selection::random_keys(&mut rng),
            };
            selection.allowed_node = identity.as_ref().map(|(_, node)| node.clone());
            let shared = Arc::new(Mutex::new(Transcript {
                id,
                token: identity.map(|(token, _)| token),
                selection,
                manner: match (options.misbehave, rng.random_range(0..4)) {
                    (false, _) | (true, 0) => Manner::Prompt,
                    (true, 1) => Manner::Slow,
                    (true, 2) => Manner::Stalling,
                    _ => Manner::Vanishing,
                },
                bookmarks: rng.random_bool(0.5),
                initial_events: rng.random_bool(0.3),
                segments: Vec::new(),
                store: Default::default(),
                version: 0,
                complete: 0,
                relists: 0,
            }));
            let task = match options.api {
                Api::WatchProxy => tokio::spawn(informer::run(
                    replicas,
                    options.resource.clone(),
                    shared.clone(),
                    stop.clone(),
                )),
                Api::Etcd => tokio::spawn(etcd_informer::run(
                    options.watchproxy.clone(),
                    options.prefix.clone(),
                    shared.clone(),
                    stop.clone(),
                )),
            };
            informers.push((shared, task));
        }
        let writer = tokio::spawn(writer::write(
            etcd,
            options.prefix.clone(),
            options.rate,
            if options.rate == 0 {
                Duration::ZERO
            } else {
                options.duration
            },
            options.seed,
            options.writes,
            stop.clone(),
        ));
        let mut readers = Vec::new();
        for _ in 0..options.readers {
            let channel = tonic::transport::Endpoint::from_shared(options.watchproxy[0].clone())
                .context("a watchproxy URL")?
                .connect_lazy();
            let client = WatchProxyClient::new(channel).max_decoding_message_size(64 << 20);
            readers.push(tokio::spawn(read(
                client,
                options.resource.clone(),
                stop.clone(),
            )));
        }
        Ok(Check {
            options,
            stop,
            history,
            informers,
            writer: Some(writer),
            writes: 0,
            last_write: 0,
            readers,
        })
    }

    /// Waits until the writes are over (or, only watching, the duration).
    pub async fn writes_done(&mut self) -> anyhow::Result<()> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        (self.writes, self.last_write) = match self.options.rate {
            0 => {
                tokio::time::sleep(self.options.duration).await;
                (0, 0)
            }
            _ => writer.await.context("the writer")?,
        };
        Ok(())
    }

    /// Waits for the writes, then for every informer to catch up (timed
    /// from this call), and proves what each saw.
    pub async fn finish(mut self) -> anyhow::Result<Report> {
        self.writes_done().await?;
        let writes = self.writes;
        let ended = Instant::now();
        let deadline = ended + self.options.settle;
        let mut caught_up_in = None;
        while Instant::now() < deadline {
            if self.all_caught_up().await {
                caught_up_in = Some(ended.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Whatever is still in flight has its moment, then everything stops.
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop.cancel();
        let history = self.history.borrow().clone();
        let mut report = Report {
            watchers: self.informers.len(),
            writes,
            history_events: history.changes.len(),
            caught_up_in,
            ..Report::default()
        };
        for reader in self.readers {
            for (revision, items) in reader.await.context("a reader")? {
                report.lists += 1;
                let want = history.state_at(revision);
                if items != want {
                    report.bad_lists += 1;
                    let extra = items.keys().find(|k| !want.contains_key(*k));
                    let missing = want.keys().find(|k| !items.contains_key(*k));
                    if report.bad_lists <= 5 {
                        report.failures.push(format!(
                            "a consistent list at {revision} differs from etcd's: extra {extra:?}, missing {missing:?}"
                        ));
                    }
                }
            }
        }
        for (shared, task) in self.informers {
            let _ = task.await;
            let t = shared.lock().await;
            let v = verify::verify(&t, &history, &self.options.prefix);
            report.checked += v.checked;
            report.lost += v.lost;
            report.duplicates += v.duplicates;
            report.cross += v.cross;
            report.resyncs += v.resyncs;
            report.relists += t.relists;
            report.resumes += t
                .segments
                .iter()
                .filter(|s| matches!(s.start, informer::Start::Resumed { .. }))
                .count();
            report.failures.extend(v.failures);
        }
        Ok(report)
    }

    /// Whether every informer's store is etcd's state at the head of the
    /// history now.
    async fn all_caught_up(&self) -> bool {
        let state = {
            let h = self.history.borrow();
            if h.head() < self.last_write {
                return false;
            }
            h.state_at(h.head())
        };
        let history = self.history.borrow().clone();
        for (shared, _) in &self.informers {
            let t = shared.lock().await;
            // The store alone can match while events are still on their
            // way (a key that came and went): every event up to the head
            // must have arrived too.
            if t.store != t.selection.filter(&self.options.prefix, &state)
                || verify::verify(&t, &history, &self.options.prefix).lost > 0
            {
                return false;
            }
        }
        true
    }
}

/// Makes consistent Lists of the whole resource until `stop`.
async fn read(
    mut client: WatchProxyClient<tonic::transport::Channel>,
    resource: String,
    stop: CancellationToken,
) -> Vec<(u64, history::State)> {
    let mut lists = Vec::new();
    while !stop.is_cancelled() {
        if let Ok(list) = informer::list(&mut client, &resource, &Selection::default(), None).await
        {
            lists.push(list);
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    lists
}

/// Runs a whole check.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    Check::start(options).await?.finish().await
}
