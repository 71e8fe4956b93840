#!/usr/bin/env bash
# Build the data plane's upstream binaries from the Go module registry, at the
# versions pinned in cluster/versions.env, into a version-keyed cache:
#
#   ~/.cache/kestrel/bin/<name>-<version>        (executables)
#   ~/.cache/kestrel/kueue-crds-<version>/*.yaml (Kueue CRDs from its module)
#
# A cached binary is never rebuilt, so a warm machine skips the build entirely.
# Only the Go module proxy is used (GOTOOLCHAIN=local: no toolchain download).
#
# Usage: cluster/build.sh [component...]   components: etcd kwok kueue kube kubelet
#        (default: all; grpcurl, helm and compose only when named).  Env: KESTREL_CACHE (default ~/.cache/kestrel),
#        KESTREL_BUILD_JOBS (go build -p, default 2).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the build too (prepare_kube_module)

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${KESTREL_CACHE:-$HOME/.cache/kestrel}"
BIN="$CACHE/bin"
WORK="$CACHE/build"
JOBS="${KESTREL_BUILD_JOBS:-2}"
mkdir -p "$BIN" "$WORK"

export GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false -mod=mod"
export GOWORK=off
NICE=(nice -n 10)

log() { echo "[build $(date -u +%H:%M:%S)] $*"; }

cached() { # cached name version -> 0 if every named binary exists
    local v="$1"; shift
    local n
    for n in "$@"; do [[ -x "$BIN/$n-$v" ]] || return 1; done
    return 0
}

# go_build <label> <outdir> <go build args...>: runs `go build -v` and turns its
# package list into "n/N packages" progress lines.
go_build() {
    local label="$1" out="$2"; shift 2
    local pkgs=() a
    for a in "$@"; do [[ "$a" != -* && "$a" == *.* && "$a" == */* ]] && pkgs+=("$a"); done
    local total
    total="$(go list -deps "${pkgs[@]}" 2>/dev/null | wc -l || echo '?')"
    log "$label: compiling (up to $total packages, -p $JOBS, nice 10)"
    local start=$SECONDS n=0 line
    # go build -v prints each package as it is built (cached ones are not printed).
    set +e
    "${NICE[@]}" go build -v -p "$JOBS" -trimpath -o "$out/" "$@" 2>&1 |
        while IFS= read -r line; do
            if [[ "$line" == *" "* || "$line" == *:* ]]; then
                echo "  $label: $line"   # errors and warnings, verbatim
                continue
            fi
            n=$((n + 1))
            if (( n % 50 == 0 )); then
                log "$label: $n/$total packages compiled ($((SECONDS - start))s) ... $line"
            fi
        done
    local rc=${PIPESTATUS[0]}
    set -e
    if (( rc != 0 )); then log "$label: FAILED (go build exit $rc)"; return "$rc"; fi
    log "$label: done in $((SECONDS - start))s"
}

# prepare_module <dir> <module requirements (path@version)...>
prepare_module() {
    local dir="$1"; shift
    mkdir -p "$dir"
    if [[ ! -f "$dir/go.mod" ]]; then
        (cd "$dir" && go mod init "kestrel.local/build/$(basename "$dir")" >/dev/null 2>&1)
        (cd "$dir" && go mod edit -go=1.26.0)
    fi
}

build_etcd() {
    local v="$ETCD_VERSION" dir="$WORK/etcd-$ETCD_VERSION"
    if cached "$v" etcd; then log "etcd $v: cached"; return; fi
    log "etcd $v: fetching go.etcd.io/etcd/server/v3@$v"
    prepare_module "$dir"
    (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$v")
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    (cd "$dir" && go_build "etcd $v" "$tmp" \
        -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$v" \
        go.etcd.io/etcd/server/v3)
    # go.etcd.io/etcd/server/v3 is the etcd main package; go names its binary "v3" or "server"
    if [[ -f "$tmp/v3" ]]; then mv "$tmp/v3" "$BIN/etcd-$v"; else mv "$tmp/server" "$BIN/etcd-$v"; fi
    rm -rf "$tmp"
}

build_kwok() {
    local v="$KWOK_VERSION" dir="$WORK/kwok-$KWOK_VERSION"
    if cached "$v" kwok kwokctl; then log "kwok $v: cached"; return; fi
    log "kwok $v: fetching sigs.k8s.io/kwok@$v"
    prepare_module "$dir"
    (cd "$dir" && go get "sigs.k8s.io/kwok/cmd/kwok@$v" "sigs.k8s.io/kwok/cmd/kwokctl@$v")
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    (cd "$dir" && go_build "kwok $v" "$tmp" \
        -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}" \
        sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl)
    mv "$tmp/kwok" "$BIN/kwok-$v"
    mv "$tmp/kwokctl" "$BIN/kwokctl-$v"
    rm -rf "$tmp"
}

build_kueue() {
    local v="$KUEUE_VERSION" dir="$WORK/kueue-$KUEUE_VERSION"
    local crds="$CACHE/kueue-crds-$v"
    if [[ ! -d "$crds" ]]; then
        local moddir
        moddir="$(go mod download -json "sigs.k8s.io/kueue@$v" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
        mkdir -p "$crds.tmp"
        cp "$moddir"/config/components/crd/bases/*.yaml "$crds.tmp/"
        chmod u+w "$crds.tmp"/*.yaml
        mv "$crds.tmp" "$crds"
        log "kueue $v: CRDs copied from $moddir to $crds"
    fi
    if cached "$v" kueue; then log "kueue $v: cached"; return; fi
    log "kueue $v: fetching sigs.k8s.io/kueue@$v"
    prepare_module "$dir"
    (cd "$dir" && go get "sigs.k8s.io/kueue/cmd/kueue@$v")
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    (cd "$dir" && go_build "kueue $v" "$tmp" \
        -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$v -X sigs.k8s.io/kueue/pkg/version.BuildDate=module-registry" \
        sigs.k8s.io/kueue/cmd/kueue)
    mv "$tmp/kueue" "$BIN/kueue-$v" && rm -rf "$tmp"
}

# The Kubernetes build module: requires k8s.io/kubernetes and replaces every staging
# module (listed from the upstream go.mod's "=> ./staging/src/..." replaces) with its
# v0.<minor>.<patch> tag, because `go install k8s.io/kubernetes/...` refuses the
# upstream module's directory replaces (kubernetes/kubernetes#79384, #113302).
prepare_kube_module() {
    local dir="$WORK/kubernetes-$KUBE_VERSION"
    if [[ -f "$dir/.ready" ]]; then echo "$dir"; return; fi
    prepare_module "$dir"
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
    local edits=() m
    while read -r m; do
        edits+=("-replace=$m=$m@$KUBE_STAGING_VERSION")
    done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// {print $1}' "$gomod")
    log "kubernetes $KUBE_VERSION: ${#edits[@]} staging modules replaced with $KUBE_STAGING_VERSION" >&2
    (cd "$dir" && go mod edit "-require=k8s.io/kubernetes@$KUBE_VERSION" "${edits[@]}")
    # Each package at the pinned version: a bare package path means @upgrade, which
    # conflicts with the pin as soon as the registry serves a newer Kubernetes.
    local pkgs=() c
    for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
        pkgs+=("k8s.io/kubernetes/cmd/$c@$KUBE_VERSION")
    done
    (cd "$dir" && go get "k8s.io/kubernetes@$KUBE_VERSION" "${pkgs[@]}" >&2)
    touch "$dir/.ready"
    echo "$dir"
}

kube_ldflags() {
    local ver="$KUBE_VERSION" major minor
    major="${ver#v}"; major="${major%%.*}"
    minor="${ver#v*.}"; minor="${minor%%.*}"
    local f="-s -w" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$ver -X $p.gitMajor=$major -X $p.gitMinor=$minor"
        f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$f"
}

build_kube() {
    local v="$KUBE_VERSION"
    local names=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
    if cached "$v" "${names[@]}"; then log "kubernetes $v: control plane + kubectl cached"; return; fi
    log "kubernetes $v: preparing build module"
    local dir; dir="$(prepare_kube_module)"
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    local pkgs=() n
    for n in "${names[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$n"); done
    (cd "$dir" && CGO_ENABLED=0 go_build "kubernetes $v" "$tmp" -ldflags "$(kube_ldflags)" "${pkgs[@]}")
    for n in "${names[@]}"; do mv "$tmp/$n" "$BIN/$n-$v"; done
    rm -rf "$tmp"
}

build_kubelet() {
    local v="$KUBE_VERSION"
    if cached "$v" kubelet; then log "kubelet $v: cached"; return; fi
    local dir; dir="$(prepare_kube_module)"
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    # kubelet is the one Kubernetes binary upstream builds with cgo (hack/lib/golang.sh).
    (cd "$dir" && CGO_ENABLED=1 go_build "kubelet $v" "$tmp" -ldflags "$(kube_ldflags)" k8s.io/kubernetes/cmd/kubelet)
    mv "$tmp/kubelet" "$BIN/kubelet-$v" && rm -rf "$tmp"
}

# build_tool <name> <version> <main package> <version variable>: a command from its
# own module at the pinned version, static, into $BIN/<name>-<version>; the version is
# stamped into the variable its --version prints.
build_tool() {
    local name="$1" v="$2" pkg="$3" xvar="$4" dir="$WORK/$1-$2"
    if cached "$v" "$name"; then log "$name $v: cached"; return; fi
    log "$name $v: fetching $pkg@$v"
    prepare_module "$dir"
    (cd "$dir" && go get "$pkg@$v")
    local tmp; tmp="$(mktemp -d "$WORK/out.XXXX")"
    (cd "$dir" && CGO_ENABLED=0 go_build "$name $v" "$tmp" -ldflags "-s -w -X $xvar=$v" "$pkg")
    mv "$tmp/${pkg##*/}" "$BIN/$name-$v" && rm -rf "$tmp"
}

build_grpcurl() {
    build_tool grpcurl "$GRPCURL_VERSION" github.com/fullstorydev/grpcurl/cmd/grpcurl main.version
}

build_helm() {
    build_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
        helm.sh/helm/v3/internal/version.version
}

build_compose() {  # the docker CLI plugin (kestrel_tools/dockerd.py installs it)
    build_tool docker-compose "$COMPOSE_VERSION" github.com/docker/compose/v2/cmd \
        github.com/docker/compose/v2/internal.Version
}

components=("$@")
if (( ${#components[@]} == 0 )); then components=(etcd kwok kueue kube kubelet); fi
t0=$SECONDS
for c in "${components[@]}"; do
    s=$SECONDS
    case "$c" in
        etcd) build_etcd ;;
        kwok) build_kwok ;;
        kueue) build_kueue ;;
        kube) build_kube ;;
        kubelet) build_kubelet ;;
        grpcurl) build_grpcurl ;;
        helm) build_helm ;;
        compose) build_compose ;;
        *) echo "unknown component: $c" >&2; exit 2 ;;
    esac
    log "component $c finished in $((SECONDS - s))s"
done
log "all requested components ready in $((SECONDS - t0))s; binaries in $BIN"
