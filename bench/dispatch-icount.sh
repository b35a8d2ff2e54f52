#!/usr/bin/env bash
# Instructions per dispatched event for 100, 1,000 and 10,000 node-pinned
# watchers, counted by cachegrind (repeatable on a noisy machine): each run
# dispatches M and 2M events; the difference divided by M is the cost of
# one event, without the setup.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
cargo build --release -p watchproxy-bench --bin dispatch-icount -q
bin=target/release/dispatch-icount
m=20000
count() {
  valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
    awk -v what="$3" '$0 ~ what { gsub(",", "", $4); print $4; exit }'
}
printf '%10s %22s %18s\n' watchers instructions/event D1-misses/event
for n in 100 1000 10000; do
  i1=$(count "$n" "$m" "I *refs"); i2=$(count "$n" $((2 * m)) "I *refs")
  d1=$(count "$n" "$m" "D1 *misses"); d2=$(count "$n" $((2 * m)) "D1 *misses")
  printf '%10s %22s %18s\n' "$n" $(( (i2 - i1) / m )) $(( (d2 - d1) / m ))
done
