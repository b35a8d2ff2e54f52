//! Inputs for the parsers that read outside bytes, for property tests
//! that run as a fuzzer on the stable toolchain: the seeds kept in
//! `fuzz/seeds/<target>/`, mutated (bytes inserted, overwritten, removed),
//! and arbitrary bytes. A failing case is shrunk and kept by proptest in
//! `proptest-regressions/`, and replayed first from then on.
//!
//! `FUZZ_CASES` sets the cases per target (2,000 by default, the bounded
//! pass every test run makes); e.g. `FUZZ_CASES=1000000 cargo test --lib fuzz`.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The proptest configuration of a fuzz target.
pub fn config() -> Config {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2_000);
    Config::with_cases(cases)
}

/// The seeds of `target`, one file each.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// One edit of a seed: where (taken modulo its length), which byte, and
/// whether it is inserted, written over or removed.
type Edit = (usize, u8, u8);

fn mutate(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for &(at, byte, op) in edits {
        let at = at % (out.len() + 1);
        match op {
            0 => out.insert(at, byte),
            1 if at < out.len() => out[at] = byte,
            _ if at < out.len() => {
                out.remove(at);
            }
            _ => {}
        }
    }
    out
}

/// Bytes for `target`: mostly mutated seeds, some arbitrary.
pub fn bytes(target: &str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    let n = seeds.len();
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        4 => (0..n, proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..8))
            .prop_map(move |(i, edits)| mutate(&seeds[i], &edits)),
    ]
}

/// Text for `target`: its bytes, read as UTF-8 with replacements.
pub fn text(target: &str) -> impl Strategy<Value = String> {
    bytes(target).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}
