#!/usr/bin/env bash
# Runs every ghz configuration in benches/ghz/ against a running watchproxy
# (default 127.0.0.1:50051, with ./scripts/demo.sh's data) and prints
# ghz's summaries: List by namespace, List by node and label, Get, Watch.
# Not part of the test suite: ghz is not in the package registries.
#
#   ./benches/ghz/run.sh [HOST:PORT]
set -euo pipefail
cd "$(dirname "$0")/../.."
host="${1:-127.0.0.1:50051}"
if ! command -v ghz >/dev/null 2>&1; then
  echo "ghz is not installed: download a release from https://github.com/bojand/ghz/releases (or 'go install github.com/bojand/ghz/cmd/ghz@latest') and put it on PATH" >&2
  exit 1
fi
for config in list list-selector get watch; do
  echo "== $config: ghz --config benches/ghz/$config.json $host"
  ghz --config "benches/ghz/$config.json" "$host"
done
