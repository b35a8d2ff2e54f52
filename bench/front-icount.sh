#!/usr/bin/env bash
# Instructions watchproxy spends per delivery in all mode, counted by
# callgrind (repeatable on a noisy machine, unlike CPU time), and the
# crates they are spent in. watchproxy runs under callgrind behind the
# load generator, at a load it keeps up with there (WATCHERS, CONNECTIONS
# and RATE; 200, 10 and 20 by default); the counts of 20 s in the middle
# of the writes are divided by the deliveries asked in that time.
# WATCHPROXY_BIN measures another build (an earlier commit's, say) with
# the same load generator. TARGET=watchproxy-etcd measures etcd's API
# (each watcher its own etcd Watch stream); CLIENT_WINDOW sets the
# watchers' HTTP/2 windows (65535: as Go's gRPC clients start). CG_OUT
# names a file to keep callgrind's counts in.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
watchers=${WATCHERS:-200} connections=${CONNECTIONS:-10} rate=${RATE:-20}
window=20
cargo build --release --workspace --bins -q
bin=${WATCHPROXY_BIN:-$PWD/target/release/watchproxy}
tmp=$(mktemp -d)
bench=
trap '[ -n "$bench" ] && kill "$bench" 2>/dev/null; rm -rf "$tmp"' EXIT
cat >"$tmp/watchproxy" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$tmp/cg.%p $bin "\$@"
EOF
chmod +x "$tmp/watchproxy"
./target/release/watchproxy-bench --watchers "$watchers" --connections "$connections" \
  --rate "$rate" --duration $((window + 30)) --mode all --targets "${TARGET:-watchproxy}" \
  ${CLIENT_WINDOW:+--client-window "$CLIENT_WINDOW"} \
  --watchproxy-bin "$tmp/watchproxy" >"$tmp/bench.txt" 2>&1 &
bench=$!
pid=
for _ in $(seq 120); do
  pid=$(find "$tmp" -name 'cg.*' -printf '%f\n' | head -1 | cut -d. -f2)
  [ -n "$pid" ] && break
  sleep 1
done
[ -n "$pid" ] || { cat "$tmp/bench.txt" >&2; echo "watchproxy did not start" >&2; exit 1; }
# Past start-up and the watchers' initial events, well inside the writes.
sleep 15
callgrind_control -d "$pid" >/dev/null
sleep "$window"
callgrind_control -d "$pid" >/dev/null
wait "$bench" || { cat "$tmp/bench.txt" >&2; exit 1; }
bench=
tail -3 "$tmp/bench.txt"
out="$tmp/cg.$pid.2"
# CG_OUT keeps the counts, for callgrind_annotate.
[ -n "${CG_OUT:-}" ] && cp "$out" "$CG_OUT"
ir=$(awk '/^summary:/ { print $2 }' "$out")
deliveries=$((watchers * rate * window))
echo
echo "instructions per delivery: $((ir / deliveries)) ($ir over $deliveries deliveries asked in ${window} s)"
echo "by crate (own instructions, not those of callees):"
callgrind_annotate --threshold=100 "$out" 2>/dev/null |
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
  sort -rn | head -12
