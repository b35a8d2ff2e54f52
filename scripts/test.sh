#!/usr/bin/env bash
# The whole test suite: formatting, lints, cargo deny (advisories, licences,
# bans, sources), unit tests and integration tests
# against a real etcd (each test starts its own on a free loopback port),
# and a short coverage-guided fuzzing run (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# What it installed for the tests lives in the project's .venv.
export PATH="$PWD/.venv/bin:$PATH"
cargo fmt --check
cargo clippy --workspace --all-targets --locked -- -D warnings
./scripts/deny.sh
cargo test --workspace --all-targets --locked
# The Rust client as it would be published: its README's examples compile,
# and the packaged crate builds on its own.
cargo test -p watchproxy-client --doc --locked
cargo package -p watchproxy-client --locked --allow-dirty
# A bounded coverage-guided run of the HTTP/2 server's fuzz targets.
./scripts/fuzz.sh 10
