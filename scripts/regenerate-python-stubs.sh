#!/usr/bin/env bash
# Regenerates the Python client's gRPC stubs, which are committed so that
# `pip install ./client/python` needs no C++ toolchain or protoc:
#   client/python/gpuexec/v1/gpuexec_pb2.py       (protoc)
#   client/python/gpuexec/v1/gpuexec_pb2_grpc.py  (grpc_python_plugin)
# from proto/gpuexec/v1/gpuexec.proto. Run it after changing the .proto and
# commit the result; the test python_stubs_current fails until then.
#
#   scripts/regenerate-python-stubs.sh [OUT_ROOT]
#
# OUT_ROOT (default client/python) receives gpuexec/v1/*.py. PROTOC and
# GRPC_PYTHON_PLUGIN override the tools found on PATH.
#
# The committed stubs come from Debian 12's protoc 3.21 and grpc_python_plugin
# 1.51 (protobuf-compiler, protobuf-compiler-grpc). Their code runs on every
# supported runtime, protobuf 3.20 (the first with the builder module it
# uses) through 7 and grpcio 1.51 onwards; a newer generator's adds a check
# that refuses a runtime older than itself.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/client/python}"
PROTOC="${PROTOC:-protoc}"
GRPC_PYTHON_PLUGIN="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"
if ! command -v "$PROTOC" >/dev/null; then
  echo "regenerate-python-stubs: $PROTOC not found; install Debian's protobuf-compiler" \
    "(scripts/setup.sh does)" >&2
  exit 1
fi
if [[ -z "$GRPC_PYTHON_PLUGIN" || ! -x "$GRPC_PYTHON_PLUGIN" ]]; then
  echo "regenerate-python-stubs: grpc_python_plugin not found; install Debian's" \
    "protobuf-compiler-grpc (scripts/setup.sh does)" >&2
  exit 1
fi
mkdir -p "$OUT/gpuexec/v1"
# -I proto: the file's name in the descriptor, and the module path the grpc
# stub imports it by, is gpuexec/v1/gpuexec.proto.
"$PROTOC" -I "$ROOT/proto" --python_out="$OUT" --grpc_python_out="$OUT" \
  --plugin=protoc-gen-grpc_python="$GRPC_PYTHON_PLUGIN" "$ROOT/proto/gpuexec/v1/gpuexec.proto"
echo "regenerate-python-stubs: wrote $OUT/gpuexec/v1/gpuexec_pb2.py and gpuexec_pb2_grpc.py" \
  "($("$PROTOC" --version))"
