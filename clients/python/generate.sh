#!/usr/bin/env bash
# Regenerates the package's stubs (watchproxy/v1) from proto/. They are
# made with grpcio-tools 1.51.3 (protoc 21): the oldest code generator
# whose output every supported protobuf runtime reads, from 4.21.6 (the
# package's lower bound) to the newest 7.x, and whose gRPC stubs check no
# grpcio version. Newer generators emit a runtime version check that
# refuses any protobuf older than themselves. The tests fail while the
# checked-in stubs differ from the proto.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/python3" -m pip install -q --disable-pip-version-check grpcio-tools==1.51.3
"$tools/bin/python3" -m grpc_tools.protoc -I"$here/../../proto" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$here/../../proto/watchproxy/v1/watchproxy.proto"
