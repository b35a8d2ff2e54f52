//! The relist path against a model of etcd: writes, cut-offs, compactions,
//! relists with creates, modifies and deletes, restarts that refill the
//! window from history, watchers joining at every kind of version and
//! reading at their own pace, and an edge following the core. The oracle is
//! etcd's history: what a watcher is sent, decoded from the wire and
//! applied as a client applies it, versions included, is etcd's state at
//! the version it resumes from; an edge that has read all its core sent is
//! proven to hold the same objects.

mod model;

use proptest::prelude::*;

use crate::cache::Sameness;
use model::{resource, Client, Core, Edge, Etcd, State, KEYS};

#[derive(Debug, Clone)]
enum Op {
    Write(usize, Option<u8>),
    /// A write under another prefix: etcd's revision moves, the
    /// resource's objects do not.
    Elsewhere,
    Cut,
    Compact,
    Reconnect,
    Restart(u64),
    EdgeRestart(u64),
    Join(Option<u64>),
    Read(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS, prop::option::weighted(0.7, 0..4u8)).prop_map(|(k, v)| Op::Write(k, v)),
        2 => Just(Op::Elsewhere),
        1 => Just(Op::Cut),
        1 => Just(Op::Compact),
        2 => Just(Op::Reconnect),
        1 => (0..12u64).prop_map(Op::Restart),
        1 => (0..12u64).prop_map(Op::EdgeRestart),
        2 => prop::option::of(0..12u64).prop_map(Op::Join),
        3 => (0..4usize).prop_map(Op::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_client_ends_in_etcds_state_with_etcds_versions(
        seed in prop::collection::vec((0..KEYS, 0..4u8), 0..6),
        ops in prop::collection::vec(op(), 1..60),
        reads in prop::collection::vec(0..3usize, 64),
    ) {
        let r = resource();
        let mut etcd = Etcd::default();
        for (k, v) in seed {
            etcd.write(k, Some(v));
        }
        let mut core = Core::start(&r, &etcd, 4);
        let mut edge = Edge::start(&r, &core, 0);
        let mut clients: Vec<Client> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Write(k, v) => etcd.write(k, v),
                Op::Elsewhere => etcd.revision += 1,
                Op::EdgeRestart(depth) => edge = Edge::start(&r, &core, depth),
                Op::Cut => core.connected = false,
                Op::Compact => etcd.compacted = etcd.revision,
                Op::Reconnect => core.connected = true,
                Op::Restart(depth) => {
                    core = Core::start(&r, &etcd, depth);
                    for c in &mut clients {
                        let from = c.resume;
                        c.resume_on(&core, from, &etcd);
                    }
                    let after = edge.cache.progress().revision;
                    edge.follow(&core, after);
                }
                Op::Join(back) => {
                    let from = back.map(|b| core.cache.progress().revision.saturating_sub(b).max(1));
                    clients.push(Client::join(&core, from, reads.clone(), &etcd));
                }
                Op::Read(n) => {
                    for c in &mut clients {
                        let n = n.min(c.reads[i % c.reads.len()] + 1);
                        c.read(&core, &etcd, n)?;
                    }
                    edge.read(&core, n);
                }
            }
            core.sync(&r, &etcd);
        }
        core.connected = true;
        core.sync(&r, &etcd);
        let now = etcd.revision;
        for c in &mut clients {
            c.read(&core, &etcd, usize::MAX)?;
            prop_assert_eq!(&c.state, &etcd.state_at(now), "a client's state, versions included");
        }
        // The edge, once it has read all its core sent, holds the same
        // objects, and the core's word proves it.
        edge.read(&core, usize::MAX);
        let snapshot = core.cache.snapshot();
        let same = Sameness::Digest(snapshot.digest.expect("the current state's"));
        let until = now + 1;
        edge.cache.confirm_same(same, until);
        prop_assert_eq!(edge.cache.progress().valid_through, until, "the edge is proven the same");
        let held: State = (edge.cache.snapshot().store.iter())
            .map(|o| (o.key().to_owned(), (o.value().to_vec(), o.revision)))
            .collect();
        prop_assert_eq!(held, etcd.state_at(now));
    }
}
