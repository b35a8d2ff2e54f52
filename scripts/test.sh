#!/usr/bin/env bash
# The whole test suite: formatting, lints, cargo deny (advisories, licences,
# bans, sources), unit tests and integration tests against a real etcd
# (each test starts its own on a free loopback port), the fuzz targets'
# property tests (proptest's mutations of fuzz/seeds/), the Rust client as
# it would be published and the delivery path's instruction budget
# (bench/icount-guard.sh). Each step prints how long it took. The
# coverage-guided fuzzers (scripts/fuzz.sh, afl.rs) are a command of their
# own: their instrumented build of the whole service is more CPU than the
# rest of a 12-minute run on two cores leaves.
#
# The integration tests mostly wait on etcd and on timers, so the steps
# that only compute (cargo deny, the client's package, the budget's
# release build) run beside the others at the lowest priority, and are
# waited for at the end. `cargo nextest` runs the tests when it is installed (four
# at once, .config/nextest.toml); `cargo test` otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run builds everything once: incremental caches would only take disk
# (several GiB across the test binaries) that a CI machine may not have.
export CARGO_INCREMENTAL=0
start=$SECONDS
logs=$(mktemp -d -t watchproxy-test.XXXXXX)
declare -A jobs=()
# Each job in a process group of its own, ended whole if the run stops.
set -m
stop_jobs() {
  for pid in "${jobs[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop_jobs EXIT

step() {
  local name=$1 t=$SECONDS
  shift
  echo "==> $name" >&2
  "$@"
  echo "==> $name: $((SECONDS - t)) s (at $((SECONDS - start)) s)" >&2
}

# Starts a step in the background at the lowest priority (`BESIDE_NICE`);
# `finish` waits for it, shows its output and fails the run when it failed.
beside() {
  local name=$1
  shift
  echo "==> $name (beside the others)" >&2
  (
    t=$SECONDS
    rc=0
    renice -n "${BESIDE_NICE:-19}" -p "$BASHPID" >/dev/null 2>&1 || true
    "$@" >"$logs/$name.log" 2>&1 || rc=$?
    echo "$((SECONDS - t))" >"$logs/$name.seconds"
    exit "$rc"
  ) &
  jobs[$name]=$!
}

finish() {
  local name=$1 rc=0
  wait "${jobs[$name]}" || rc=$?
  unset "jobs[$name]"
  cat "$logs/$name.log" >&2
  echo "==> $name: $(cat "$logs/$name.seconds") s beside the others (done at $((SECONDS - start)) s)" >&2
  return "$rc"
}

# The client crate as users get it: the packaged crate, unpacked, compiles
# on its own (its build script generating the code from the protos it
# carries), in a target directory of its own, so that it never waits for
# the workspace's. Checked, not built: codegen would only repeat the
# tests' build of the same code. Its README's examples compile with the
# tests.
client_as_published() {
  export CARGO_TARGET_DIR=target/published
  local unpacked
  unpacked=$(mktemp -d -t watchproxy-client.XXXXXX)
  cargo package -p watchproxy-client --locked --allow-dirty --no-verify &&
    tar -xzf target/published/package/watchproxy-client-*.crate -C "$unpacked" &&
    cargo check --manifest-path "$unpacked"/watchproxy-client-*/Cargo.toml
  local rc=$?
  rm -rf "$unpacked"
  return "$rc"
}

tests() {
  if command -v cargo-nextest >/dev/null 2>&1; then
    cargo nextest run --workspace --lib --bins --tests --examples --locked
  else
    echo "cargo-nextest not found: running the tests one binary at a time with cargo test" >&2
    cargo test --workspace --lib --bins --tests --examples --locked
  fi
  # The benchmarks, once each in test mode (a process each: nextest would
  # make one per case, each setting up its case's load again), and the
  # client's README examples, on the libraries the tests built (the whole
  # workspace's features: the client's alone would build its dependencies
  # again).
  cargo test --workspace --benches --locked
  cargo test --workspace --doc --locked
}

delivery_budget() {
  cargo build --locked -q -p watchproxy-bench --bin watchproxy-bench &&
    NO_BUILD=1 WATCHPROXY_BIN="$PWD/target/budget/release/watchproxy" \
      LOADGEN_BIN="$PWD/target/debug/watchproxy-bench" ./bench/icount-guard.sh
}

# The jobs beside the steps build in target directories of their own
# under target/, made here once: cargo processes making target/ together
# race (one fails with "No such file or directory").
mkdir -p target
step "install what the tests use" ./scripts/install-deps.sh
# What it installed for the tests lives in the project's .venv.
export PATH="$PWD/.venv/bin:$PATH"
step "cargo fmt" cargo fmt --check
beside "cargo deny" ./scripts/deny.sh
beside "client as published" client_as_published
# The delivery path's instruction budget (bench/icount-budget) counts a
# release build of watchproxy of its own; its load generator is the
# tests' debug build (in lockstep, its speed changes nothing counted), not
# a second whole-program release link. At the others' priority: its last
# step, the whole-program optimization, takes one core for minutes, and
# should overlap the tests, which mostly wait, not follow them.
BESIDE_NICE=0 beside "delivery budget's build" env CARGO_TARGET_DIR=target/budget \
  cargo build --release --locked -q -p watchproxy --bin watchproxy
step "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
step "tests" tests
finish "cargo deny"
finish "client as published"
finish "delivery budget's build"
step "delivery budget" delivery_budget
echo "==> all steps: $((SECONDS - start)) s" >&2
