#!/usr/bin/env bash
# Generates Python stubs and mypy stubs for proto/kestrel/v1 into OUT (default: repo root),
# so they land in the kestrel.v1 package.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out/kestrel/v1"
rm -f "$out"/kestrel/v1/*_pb2*.py "$out"/kestrel/v1/*_pb2*.pyi
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m grpc_tools.protoc -I proto \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  proto/kestrel/v1/*.proto
printf '"""Generated from proto/kestrel/v1 by `make proto`; do not edit."""\n' > "$out/kestrel/v1/__init__.py"
