"""What `cluster/status` prints: versions, processes, nodes, queues."""

from __future__ import annotations

import json
from typing import Any

from kestrel_tools.cluster.build import missing_binaries
from kestrel_tools.cluster.dataplane import is_up
from kestrel_tools.cluster.health import apiserver_ready, kueue_ready, process_health
from kestrel_tools.cluster.kueue import running_kueue_version
from kestrel_tools.cluster.paths import (
    BIN_DIR,
    KUEUE_HEALTH_PORT,
    Progress,
    cluster_info,
    read_versions,
)
from kestrel_tools.cluster.processes import kubectl


def server_version() -> str | None:
    proc = kubectl("version", "-o", "json", check=False, timeout=10)
    if proc.returncode != 0:
        return None
    data: dict[str, Any] = json.loads(proc.stdout)
    server = data.get("serverVersion") or {}
    version = server.get("gitVersion")
    return str(version) if version else None


def status(progress: Progress = print) -> bool:
    """Print versions, processes, nodes and queues. Returns True if everything is up."""
    v = read_versions()
    info = cluster_info(v)
    progress(
        f"pinned: kubernetes={v['KUBE_VERSION']} etcd={v['ETCD_VERSION']} "
        f"kwok={v['KWOK_VERSION']} kueue={v['KUEUE_VERSION']}"
    )
    missing = missing_binaries(v)
    progress(f"binaries: {BIN_DIR} ({'all built' if not missing else f'missing {missing}'})")
    progress(f"state:      {info.state_dir}")
    progress(f"kubeconfig: {info.kubeconfig}")
    progress(f"logs:       {info.log_dir} (kueue.log), {info.kwok_log_dir} (control plane)")
    progress("processes:")
    procs = process_health()
    for p in procs:
        state = "running" if p.alive else "DOWN"
        progress(f"  {p.component:<26} pid={p.pid!s:<8} {state:<8} rss={p.rss_mib:7.1f} MiB")
    progress(f"  total rss: {sum(p.rss_mib for p in procs if p.alive):.0f} MiB")
    if not apiserver_ready():
        progress("apiserver: NOT READY")
        return False
    progress(f"apiserver: {info.server} ready, serverVersion={server_version()}")
    progress(
        f"kueue: {'ready' if kueue_ready() else 'NOT READY'} version={running_kueue_version()} "
        f"(health 127.0.0.1:{KUEUE_HEALTH_PORT})"
    )
    progress(kubectl("get", "nodes", "-L",
                     "kestrel.dev/pool,kestrel.dev/simulated,kestrel.dev/flavor,nvidia.com/gpu.count",
                     check=False).stdout.rstrip())  # fmt: skip
    progress(kubectl("get", "resourceflavors,cohorts,clusterqueues,localqueues", "-A",
                     check=False).stdout.rstrip())  # fmt: skip
    wl = kubectl("get", "workloads", "-A", "--no-headers", check=False).stdout.strip()
    progress(f"workloads: {len(wl.splitlines()) if wl else 0}")
    return is_up()
