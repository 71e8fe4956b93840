#!/usr/bin/env bash
# Generates Python stubs and mypy stubs for proto/kestrel/v1 into OUT (default:
# sdk/python), so they land in the SDK distribution's kestrel_sdk.v1 package, which the
# server imports too.
#
# protoc names a Python module after the .proto's path (kestrel/v1/x.proto ->
# kestrel.v1.x_pb2) and has no option for a prefix, so the import lines and module
# names are rewritten to kestrel_sdk.v1 after it runs. Only `kestrel.v1 import`,
# `import kestrel.v1.x_pb2` and `kestrel.v1.x_pb2` change: the serialized descriptors
# (file kestrel/v1/x.proto, package kestrel.v1, types .kestrel.v1.T) and the RPC paths
# (/kestrel.v1.Gateway/...) stay as the wire has them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-sdk/python}
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m grpc_tools.protoc -I proto \
  --python_out="$gen" --grpc_python_out="$gen" \
  --mypy_out=quiet:"$gen" --mypy_grpc_out=quiet:"$gen" \
  proto/kestrel/v1/*.proto
mkdir -p "$out/kestrel_sdk/v1"
rm -f "$out"/kestrel_sdk/v1/*_pb2*.py "$out"/kestrel_sdk/v1/*_pb2*.pyi
for f in "$gen"/kestrel/v1/*_pb2*.py "$gen"/kestrel/v1/*_pb2*.pyi; do
  sed -E -e 's/\bkestrel\.v1 import\b/kestrel_sdk.v1 import/g' \
         -e 's/\bkestrel\.v1\.([a-z0-9_]+_pb2)\b/kestrel_sdk.v1.\1/g' \
         -e 's#generated code in kestrel/v1/#generated code in kestrel_sdk/v1/#' \
         "$f" > "$out/kestrel_sdk/v1/$(basename "$f")"
done
printf '"""Generated from proto/kestrel/v1 by `make proto`; do not edit."""\n' > "$out/kestrel_sdk/v1/__init__.py"
