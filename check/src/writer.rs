//! Writes to etcd under the prefix as controllers would: creations,
//! changes of labels and nodes (so objects move in and out of selections),
//! deletions, and transactions of several keys at one revision.

use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp};
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::model::{value, APPS, NAMES, NAMESPACES, NODES};

/// How the writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Creations, changes, deletions and transactions of the objects.
    Mixed,
    /// Only keys created and at once deleted again, one pair per tick, the
    /// prefix quiet in between: the history etcd's freshness proof cannot
    /// see.
    Transients,
}

/// Writes at `rate` per second for `duration` (or until `stop`); returns
/// how many writes etcd accepted and the revision of the last. Failed
/// writes (etcd away during a fault) are skipped: the history records what
/// happened.
pub async fn write(
    mut client: Client,
    prefix: String,
    rate: u64,
    duration: Duration,
    seed: u64,
    writes: Writes,
    stop: CancellationToken,
) -> (u64, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let until = tokio::time::Instant::now() + duration;
    let (mut written, mut last) = (0, 0);
    let mut generation = 0;
    let key = |rng: &mut rand::rngs::StdRng| {
        format!(
            "{prefix}/ns-{}/obj-{}",
            rng.random_range(0..NAMESPACES),
            rng.random_range(0..NAMES)
        )
    };
    while tokio::time::Instant::now() < until {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        generation += 1;
        if writes == Writes::Transients {
            let key = format!(
                "{prefix}/ns-{}/transient-{generation}",
                generation % NAMESPACES as u64
            );
            let value = value(0, 0, generation);
            if let Ok(r) = client.put(key.as_str(), value, None).await {
                written += 1;
                last = last.max(revision(r.header()));
            }
            if let Ok(r) = client.delete(key.as_str(), None).await {
                written += 1;
                last = last.max(revision(r.header()));
            }
            continue;
        }
        let put = |rng: &mut rand::rngs::StdRng| {
            TxnOp::put(
                key(rng),
                value(
                    rng.random_range(0..APPS),
                    rng.random_range(0..NODES),
                    generation,
                ),
                None,
            )
        };
        let done = match rng.random_range(0..10) {
            0..=6 => {
                let op = put(&mut rng);
                client
                    .txn(Txn::new().and_then([op]))
                    .await
                    .map(|r| revision(r.header()))
            }
            7 | 8 => client
                .delete(key(&mut rng), None)
                .await
                .map(|r| revision(r.header())),
            _ => {
                // Distinct keys: etcd refuses a transaction that writes one
                // key twice.
                let mut keys: Vec<String> = (0..3).map(|_| key(&mut rng)).collect();
                keys.sort();
                keys.dedup();
                let ops: Vec<TxnOp> = keys
                    .into_iter()
                    .map(|k| {
                        TxnOp::put(
                            k,
                            value(
                                rng.random_range(0..APPS),
                                rng.random_range(0..NODES),
                                generation,
                            ),
                            None,
                        )
                    })
                    .collect();
                client
                    .txn(Txn::new().and_then(ops))
                    .await
                    .map(|r| revision(r.header()))
            }
        };
        if let Ok(r) = done {
            written += 1;
            last = last.max(r);
        }
    }
    (written, last)
}

fn revision(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map_or(0, |h| h.revision() as u64)
}
