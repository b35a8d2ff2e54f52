#!/usr/bin/env bash
# The delivery path's budget: instructions per delivery in each shape of
# bench/icount-budget, counted by bench/front-icount.sh (callgrind, writes
# in lockstep, so the count does not depend on the machine's speed), fail
# the run when one rises more than 5 % above its committed figure.
# NO_BUILD=1 uses the binaries already built (WATCHPROXY_BIN and
# LOADGEN_BIN, as bench/front-icount.sh takes them).
set -euo pipefail
cd "$(dirname "$0")/.."
# The two binaries it runs, not the workspace's others: each is linked
# whole-program (the release profile's LTO), minutes of a CI machine.
[ -n "${NO_BUILD:-}" ] || cargo build --release --locked -q \
  -p watchproxy -p watchproxy-bench --bin watchproxy --bin watchproxy-bench
failed=0
while read -r name figure settings; do
  case "$name" in '' | '#'*) continue ;; esac
  # shellcheck disable=SC2086 # the settings are words of VAR=value
  report=$(env $settings NO_BUILD=1 bench/front-icount.sh)
  echo "$report" >&2
  measured=$(awk '/^instructions per delivery:/ { print $4 }' <<<"$report")
  limit=$((figure * 105 / 100))
  if [ -z "$measured" ]; then
    echo "$name: not measured" >&2
    failed=1
  elif [ "$measured" -gt "$limit" ]; then
    echo "$name: $measured instructions per delivery, over its budget of $figure (+5 % = $limit)" >&2
    failed=1
  elif [ "$measured" -lt $((figure * 95 / 100)) ]; then
    echo "$name: $measured instructions per delivery, well under its budget of $figure: lower it in bench/icount-budget to keep the gain" >&2
  else
    echo "$name: $measured instructions per delivery (budget $figure, at most $limit)" >&2
  fi
done <bench/icount-budget
exit "$failed"
