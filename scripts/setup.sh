#!/usr/bin/env bash
# Idempotent: installs everything Kestrel needs from the package registries.
# Debian packages (redis-server), the Python venv with the project and its
# pinned dependencies, and buf (npm). Re-running is cheap: each step checks
# a stamp keyed by the content of the files it installs from.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
stamp_dir=.venv/.stamps

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

if ! command -v redis-server >/dev/null 2>&1; then
  say "installing Debian packages: redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
  # The Debian package starts a system-wide instance; Kestrel starts its own per run.
  (systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1) || true
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
mkdir -p "$stamp_dir"

want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp_dir/python" 2>/dev/null)" != "$want" ]; then
  say "installing Python dependencies (pyproject.toml changed or first run)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[infra,dev]'
  echo "$want" > "$stamp_dir/python"
fi

want=$(sha256sum tools/buf/package.json | cut -c1-16)
if [ "$(cat "$stamp_dir/buf" 2>/dev/null)" != "$want" ] || [ ! -x tools/buf/node_modules/.bin/buf ]; then
  say "installing buf (npm)"
  (cd tools/buf && npm install --no-audit --no-fund --silent >/dev/null)
  echo "$want" > "$stamp_dir/buf"
fi
say "ready"
