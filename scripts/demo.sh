#!/usr/bin/env bash
# Runs watchproxy on a local etcd with demo data: starts etcd in a temporary
# directory on loopback, loads Kubernetes-shaped pods spread over nodes and
# namespaces, and serves them on 127.0.0.1:50051 until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh demo

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ETCD_BIN="${WATCHPROXY_ETCD_BIN:-etcd}"
LISTEN="${WATCHPROXY_LISTEN:-127.0.0.1:50051}"
METRICS="${WATCHPROXY_METRICS_LISTEN:-127.0.0.1:9091}"
PODS="${DEMO_PODS:-3000}"
client_port=$(free_port)
peer_port=$(free_port)
dir=$(mktemp -d -t watchproxy-demo.XXXXXX)

# WATCHPROXY_BIN: a watchproxy binary already built (the tests run the
# demo with theirs).
BIN="${WATCHPROXY_BIN:-./target/release/watchproxy}"
[ -n "${WATCHPROXY_BIN:-}" ] || cargo build --release --locked

"$ETCD_BIN" --name demo --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$client_port" --advertise-client-urls "http://127.0.0.1:$client_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "demo=http://127.0.0.1:$peer_port" \
  --experimental-watch-progress-notify-interval 5s \
  --logger zap --log-level warn >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
cleanup() { kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM

endpoint="http://127.0.0.1:$client_port"
for _ in $(seq 1 100); do
  ETCDCTL_API=3 etcdctl --endpoints "$endpoint" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
"$BIN" demo-load --etcd-endpoints "$endpoint" --count "$PODS" --nodes 50 --namespaces 10

cat <<MSG

etcd:        $endpoint   (data in $dir)
watchproxy:  $LISTEN    metrics: http://$METRICS/metrics

Try, in another terminal (the README's quick start has more):
  $BIN get pods -n ns-3 --limit 5 --server $LISTEN
  $BIN list pods -l app=web,tier=frontend -o name --server $LISTEN
  $BIN watch pods --field-selector spec.nodeName=node-7 --server $LISTEN
  $BIN demo-load --etcd-endpoints $endpoint --count 200   # changes to watch
or with grpcurl (through server reflection), or etcd's own client:
  grpcurl -plaintext $LISTEN list
  grpcurl -plaintext -d '{"resource":"pods","field_selector":"spec.nodeName=node-7"}' $LISTEN watchproxy.v1.WatchProxy/Watch
  etcdctl --endpoints $LISTEN get --prefix /registry/pods/ns-5/ --keys-only --limit 3

MSG
"$BIN" serve --config examples/config.yaml \
  --etcd-endpoints "$endpoint" --listen "$LISTEN" --metrics-listen "$METRICS"
