#!/usr/bin/env bash
# Instructions watchproxy spends per delivery, counted by callgrind
# (repeatable on a noisy machine, unlike CPU time), and the crates they
# are spent in. The load generator writes in lockstep: each write once the
# one before reached every watcher that asked for it, so what a pass of
# watchproxy carries does not depend on how fast the machine (or valgrind)
# runs. Callgrind counts from write WARMUP (buffers grown, caches warm) to
# the last one's deliveries, and the count is divided by the deliveries
# in between.
#
# MODE (all or node), WATCHERS, CONNECTIONS and WRITES set the load (all
# mode, 200 watchers over 10 connections, 100 writes by default);
# TARGET=watchproxy-etcd measures etcd's API (each watcher its own etcd
# Watch stream), CLIENT_WINDOW the watchers' HTTP/2 windows (65535: as
# Go's gRPC clients start); WATCHPROXY_BIN another build (an earlier
# commit's, say) with the same load generator; CG_OUT a file to keep
# callgrind's counts in, for callgrind_annotate; LOADGEN_BIN another
# build of the load generator (a debug one does: in lockstep its speed
# changes nothing counted); NO_BUILD=1 skips the build; CACHE_SIM=1 also
# simulates the caches and prints the first-level data cache's misses per
# delivery (a delivery's cost is mostly the lines of per-watcher state it
# reaches). The last line is the figure: `instructions per delivery: N`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null ||
  { echo "needs valgrind (./scripts/install-deps.sh or apt-get install -y valgrind)" >&2; exit 1; }
mode=${MODE:-all} watchers=${WATCHERS:-200} connections=${CONNECTIONS:-10}
writes=${WRITES:-100} warmup=${WARMUP:-20}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q \
  -p watchproxy -p watchproxy-bench --bin watchproxy --bin watchproxy-bench
bin=${WATCHPROXY_BIN:-$(realpath "${CARGO_TARGET_DIR:-target}")/release/watchproxy}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/watchproxy" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind ${CACHE_SIM:+--cache-sim=yes} --instr-atstart=no --callgrind-out-file=$tmp/cg.%p $bin "\$@"
EOF
chmod +x "$tmp/watchproxy"
# --rate is only a ceiling in lockstep; one second of writes at the most.
"${LOADGEN_BIN:-${CARGO_TARGET_DIR:-target}/release/watchproxy-bench}" --watchers "$watchers" --connections "$connections" \
  --rate "$writes" --duration 1 --drain 1 --mode "$mode" --targets "${TARGET:-watchproxy}" \
  ${CLIENT_WINDOW:+--client-window "$CLIENT_WINDOW"} \
  --lockstep --callgrind-after "$warmup" \
  --watchproxy-bin "$tmp/watchproxy" >"$tmp/bench.txt" 2>&1 ||
  { cat "$tmp/bench.txt" >&2; exit 1; }
out=$(find "$tmp" -name 'cg.*.1' | head -1)
deliveries=$(awk '/^deliveries counted by callgrind:/ { print $5 }' "$tmp/bench.txt")
[ -n "$out" ] && [ -n "$deliveries" ] && [ "$deliveries" -gt 0 ] ||
  { cat "$tmp/bench.txt" >&2; echo "callgrind counted nothing" >&2; exit 1; }
[ -n "${CG_OUT:-}" ] && cp "$out" "$CG_OUT"
ir=$(awk '/^summary:/ { print $2 }' "$out")
echo "by crate (own instructions, not those of callees):"
callgrind_annotate --threshold=100 --inclusive=no "$out" 2>/dev/null |
  awk -v total="$ir" '
    /^ *[0-9,]+ \( *[0-9.]+%\)  / {
      n = $1; gsub(",", "", n)
      f = $0; sub(/^[^)]*\)  /, "", f); sub(/ \[.*$/, "", f)
      if (f ~ /^\.\//) { crate = "libc" }
      else {
        sub(/^\?\?\?:/, "", f); sub(/^</, "", f); sub(/^&/, "", f)
        crate = f; sub(/::.*$/, "", crate); sub(/[ <].*$/, "", crate)
      }
      if (crate == "PROGRAM" || n == total) next
      sum[crate] += n
    }
    END { for (c in sum) printf "%6.1f%%  %s\n", 100 * sum[c] / total, c }' |
  sort -rn | head -8
echo "$ir instructions over $deliveries deliveries ($((writes - warmup)) writes, $mode mode, $watchers watchers over $connections connections, ${TARGET:-watchproxy})"
if [ -n "${CACHE_SIM:-}" ]; then
  awk -v d="$deliveries" '/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
    /^summary:/ { printf "D1 misses per delivery: %.2f read, %.2f write\n", $col["D1mr"] / d, $col["D1mw"] / d }' "$out"
fi
echo "instructions per delivery: $((ir / deliveries))"
