#!/usr/bin/env bash
# The whole test suite: formatting, lints, cargo deny (advisories, licences,
# bans, sources), unit tests and integration tests
# against a real etcd (each test starts its own on a free loopback port),
# and a short coverage-guided fuzzing run (scripts/fuzz.sh).
# Each step prints how long it took, and the total at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() {
  local name=$1 t=$SECONDS
  shift
  echo "==> $name" >&2
  "$@"
  echo "==> $name: $((SECONDS - t)) s (total $((SECONDS - start)) s)" >&2
}
step "install what the tests use" ./scripts/install-deps.sh
# What it installed for the tests lives in the project's .venv.
export PATH="$PWD/.venv/bin:$PATH"
step "cargo fmt" cargo fmt --check
step "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo deny" ./scripts/deny.sh
step "tests" cargo test --workspace --all-targets --locked
# The Rust client as it would be published: its README's examples compile,
# and the packaged crate builds on its own.
step "client doc tests" cargo test -p watchproxy-client --doc --locked
step "client package" cargo package -p watchproxy-client --locked --allow-dirty
# A bounded coverage-guided run of the HTTP/2 server's fuzz targets.
step "fuzz" ./scripts/fuzz.sh 10
echo "==> all steps: $((SECONDS - start)) s" >&2
