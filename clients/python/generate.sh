#!/usr/bin/env bash
# Regenerates the package's stubs (watchproxy/v1) from proto/ with
# grpcio-tools; the tests fail while the checked-in ones differ.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
python3 -m grpc_tools.protoc -I"$here/../../proto" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$here/../../proto/watchproxy/v1/watchproxy.proto"
