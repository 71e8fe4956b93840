"""Building the pinned binaries from the Go module registry (cluster/build.sh),
cached by version."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from kestrel_tools.cluster.paths import (
    CLUSTER_SRC,
    CPU_NODE_ENABLED,
    ClusterError,
    Progress,
    binary_paths,
    kueue_crd_dir,
    read_versions,
)


def missing_binaries(versions: dict[str, str] | None = None) -> list[str]:
    """Components whose cached binary (or Kueue CRD directory) is absent."""
    v = versions or read_versions()
    bins = binary_paths(v)
    missing = [name for name in bins
               if (name != "kubelet" or CPU_NODE_ENABLED) and not bins[name].exists()]
    if not kueue_crd_dir(v).is_dir():
        missing.append("kueue-crds")
    return missing


def build(progress: Progress = print, components: Sequence[str] = ()) -> None:
    """Run cluster/build.sh (cold build of what is missing), streaming its progress."""
    cmd = [str(CLUSTER_SRC / "build.sh"), *components]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line.startswith("go: added") or line.startswith("go: downloading"):
            continue  # module bookkeeping; the package counter shows progress
        progress(line)
    if proc.wait() != 0:
        raise ClusterError(f"{' '.join(cmd)} failed with exit code {proc.returncode}")


def ensure_binaries(progress: Progress = print) -> None:
    v = read_versions()
    missing = missing_binaries(v)
    if missing:
        progress(f"building missing components from the Go module registry: {missing}")
        # kubelet only for the real CPU node (KESTREL_CPU_NODE=0 leaves it out).
        kubelet = ["kubelet"] if CPU_NODE_ENABLED else []
        build(progress, ["etcd", "kwok", "kueue", "kube", *kubelet])
        still = missing_binaries(v)
        if still:
            raise ClusterError(f"build finished but binaries are missing: {still}")
