//! The objects and the writes: Kubernetes-shaped values on nodes, each
//! carrying its send time, written at a steady rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use etcd_client::Client;

use crate::args::{Args, Mode};
use crate::PREFIX;

pub fn object(i: usize, nodes: usize, bytes: usize, sent: u128) -> String {
    let pad = "x".repeat(bytes.saturating_sub(260));
    format!(
        r#"{{"kind":"Pod","metadata":{{"name":"pod-{i}","namespace":"bench","labels":{{"app":"bench"}},"annotations":{{"sent":"{sent}"}}}},"spec":{{"nodeName":"node-{}","containers":[{{"name":"c","image":"registry.example/app:1"}}]}},"status":{{"phase":"Running"}},"pad":"{pad}"}}"#,
        i % nodes
    )
}

pub fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The send timestamp and node of a value written by [`object`].
pub fn parse(value: &[u8]) -> (u128, &[u8]) {
    let text = value;
    let find = |needle: &[u8]| {
        text.windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + needle.len())
    };
    let sent = find(br#""sent":""#)
        .map(|at| {
            text[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'))
        })
        .unwrap_or(0);
    let node = find(br#""nodeName":""#)
        .map(|at| {
            let end = text[at..].iter().position(|b| *b == b'"').unwrap_or(0);
            &text[at..at + end]
        })
        .unwrap_or(b"");
    (sent, node)
}

/// Which of `n` equal shards object `i`'s name falls in.
pub fn shard_of(i: usize, n: u64) -> u64 {
    let h = watchproxy::object::shard_hash(&format!("pod-{i}"));
    ((u128::from(h) * u128::from(n)) >> 64) as u64
}

/// Writes every object once, before the watchers open: the revision after.
pub async fn seed(ec: &mut Client, args: &Args) -> anyhow::Result<i64> {
    let nodes = args.nodes();
    for chunk in (0..args.objects).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<_> = chunk
            .iter()
            .map(|&i| {
                etcd_client::TxnOp::put(
                    format!("{PREFIX}/bench/pod-{i}"),
                    object(i, nodes, args.object_bytes, 0),
                    None,
                )
            })
            .collect();
        ec.txn(etcd_client::Txn::new().and_then(ops)).await?;
    }
    Ok(ec
        .get(PREFIX, None)
        .await?
        .header()
        .map_or(0, |h| h.revision()))
}

/// What the writes were: how many, over how long, and what each watcher
/// should have received of them.
pub struct Written {
    pub total: u64,
    pub seconds: f64,
    /// Writes by the group of the watchers that asked for them.
    per_group: HashMap<u64, u64>,
}

impl Written {
    /// The changes watcher `w` asked for.
    pub fn expected(&self, args: &Args, w: usize) -> u64 {
        (self.per_group.get(&watcher_group(args, w)).copied()).unwrap_or(0)
    }
}

/// The group of object `i`'s writes: the shard or node whose watchers ask
/// for them (every watcher is in one group in all mode).
fn object_group(args: &Args, i: usize) -> u64 {
    match (args.mode, args.shards) {
        (Mode::All, Some(n)) => shard_of(i, n),
        (Mode::All, None) => 0,
        (Mode::Node, _) => (i % args.nodes()) as u64,
    }
}

/// The group of the writes watcher `w` asks for.
fn watcher_group(args: &Args, w: usize) -> u64 {
    match (args.mode, args.shards) {
        (Mode::All, Some(n)) => w as u64 % n,
        (Mode::All, None) => 0,
        (Mode::Node, _) => (w % args.nodes()) as u64,
    }
}

/// Writes paced by their deliveries (`--lockstep`).
pub struct Lockstep<'a> {
    /// Useful deliveries so far, over all watchers.
    pub useful: &'a AtomicU64,
    /// The front under callgrind (`--callgrind-after`), by pid.
    pub callgrind: Option<u32>,
}

impl Lockstep<'_> {
    /// Waits until `wanted` deliveries have arrived.
    async fn arrived(&self, wanted: u64, write: u64) -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs(60);
        while self.useful.load(Ordering::Acquire) < wanted {
            if Instant::now() > until {
                bail!("write {write}'s deliveries did not all arrive within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// Asks callgrind in process `pid` for `command` (`--instr=on`, `--dump`).
async fn callgrind(pid: u32, command: &'static str) -> anyhow::Result<()> {
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("callgrind_control")
            .arg(command)
            .arg(pid.to_string())
            .stdout(std::process::Stdio::null())
            .status()
    })
    .await?
    .context("running callgrind_control (valgrind's package has it)")?;
    ensure!(
        status.success(),
        "callgrind_control {command} {pid}: {status}"
    );
    Ok(())
}

/// Steady writes, each to a random object, carrying its send time; with
/// `lockstep`, each once the one before was delivered.
pub async fn write(
    ec: &mut Client,
    args: &Args,
    lockstep: Option<Lockstep<'_>>,
) -> anyhow::Result<Written> {
    let nodes = args.nodes();
    let total = args.rate * args.duration;
    let mut per_group: HashMap<u64, u64> = HashMap::new();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / args.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let (mut wanted, mut counted_from) = (
        lockstep
            .as_ref()
            .map_or(0, |l| l.useful.load(Ordering::Acquire)),
        None,
    );
    for k in 0..total {
        tick.tick().await;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % args.objects as u64) as usize;
        let group = object_group(args, i);
        *per_group.entry(group).or_default() += 1;
        let key = format!("{PREFIX}/bench/pod-{i}");
        let Some(pace) = &lockstep else {
            ec.put(key, object(i, nodes, args.object_bytes, now_nanos()), None)
                .await?;
            continue;
        };
        if let (Some(pid), true) = (pace.callgrind, args.callgrind_after == Some(k)) {
            callgrind(pid, "--instr=on").await?;
            counted_from = Some(wanted);
        }
        ec.put(key, object(i, nodes, args.object_bytes, now_nanos()), None)
            .await?;
        wanted += (0..args.watchers)
            .filter(|&w| watcher_group(args, w) == group)
            .count() as u64;
        pace.arrived(wanted, k).await?;
    }
    if let (Some(pid), Some(from)) = (lockstep.and_then(|l| l.callgrind), counted_from) {
        callgrind(pid, "--dump").await?;
        println!("deliveries counted by callgrind: {}", wanted - from);
    }
    Ok(Written {
        total,
        seconds: started.elapsed().as_secs_f64(),
        per_group,
    })
}
