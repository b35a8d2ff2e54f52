#!/usr/bin/env bash
# Coverage-guided fuzzing of the HTTP/2 server with afl.rs (AFL++): builds
# the targets in fuzz/ instrumented and runs each for SECONDS (default 10),
# starting from fuzz/seeds/<seeds>/. A crash fails the run; its input is
# copied to fuzz/seeds/<seeds>/ as crash-<target>-<n>, where the property
# tests (`cargo test --lib fuzz`, part of the test command) replay it from
# then on. Not part of the test command: the instrumented build of the
# whole service takes about 5 minutes of CPU. Run it before a release and
# after a change to a parser of outside bytes. A short run builds the
# targets unoptimized, AFL_OPT_LEVEL=0: cargo-afl's default, 3, with one
# codegen unit per crate, takes about 14 minutes of CPU to build. A longer
# run is worth the optimized build:
# AFL_OPT_LEVEL=3 ./scripts/fuzz.sh 3600
# `./scripts/fuzz.sh --build` only installs cargo-afl and builds the
# targets.
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=false
[ "${1:-}" = --build ] && build_only=true
seconds="${1:-10}"

if ! command -v cargo-afl >/dev/null 2>&1; then
  echo "installing cargo-afl (afl.rs) ..." >&2
  cargo install cargo-afl --debug --locked --version 0.18.2 -q ||
    { echo "install afl.rs: cargo install cargo-afl (https://github.com/rust-fuzz/afl.rs)" >&2; exit 1; }
fi
cargo afl config --build >/dev/null 2>&1 || true
export AFL_OPT_LEVEL="${AFL_OPT_LEVEL:-0}"

(cd fuzz && cargo afl build --locked -q)
$build_only && exit 0
out=$(mktemp -d -t watchproxy-fuzz.XXXXXX)
trap 'rm -rf "$out"' EXIT
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_QUIET=1
failed=0
for pair in h2_connection:h2_frames hpack_block:hpack_block grpc_framing:grpc_frame; do
  target=${pair%%:*}; seeds=${pair##*:}
  echo "fuzzing $target for ${seconds}s ..." >&2
  cargo afl fuzz -V "$seconds" -i "fuzz/seeds/$seeds" -o "$out/$target" "fuzz/target/debug/$target" >"$out/$target.log" 2>&1 ||
    { tail -20 "$out/$target.log" >&2; exit 1; }
  stats="$out/$target/default/fuzzer_stats"
  grep -E '^(execs_done|corpus_count|saved_crashes|saved_hangs) ' "$stats" | tr -s ' ' | sed "s/^/  $target: /" >&2
  n=0
  for crash in "$out/$target"/default/crashes/id:*; do
    [ -e "$crash" ] || continue
    n=$((n + 1))
    cp "$crash" "fuzz/seeds/$seeds/crash-$target-$n"
    echo "  crash kept as fuzz/seeds/$seeds/crash-$target-$n" >&2
    failed=1
  done
done
exit "$failed"
