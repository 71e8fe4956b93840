"""Is each part alive and answering: the control-plane processes kwokctl started,
Kueue, the CPU node's containerd and kubelet, the simulated GPU nodes, the
example ClusterQueue. No side effects."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import urllib.error
import urllib.request

from kestrel_tools.cluster.paths import (
    CPU_NODE_ENABLED,
    EXAMPLE_CLUSTER_QUEUE,
    KUEUE_HEALTH_PORT,
    NODE,
    PATHS,
    SIMULATED_NODE_SELECTOR,
    binary_paths,
)
from kestrel_tools.cluster.processes import _rss_kib, kubectl, runs


def apiserver_ready() -> bool:
    if not PATHS.kubeconfig.exists():
        return False
    try:
        proc = kubectl("get", "--raw", "/readyz", check=False, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def kueue_pid() -> int | None:
    """PID of our Kueue manager if it is running (checked against its cmdline)."""
    try:
        pid = int(PATHS.kueue_pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if runs(pid, lambda name: "kueue" in name) else None


def kueue_ready() -> bool:
    url = f"http://127.0.0.1:{KUEUE_HEALTH_PORT}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def kwok_cluster_exists() -> bool:
    return (PATHS.kwok_cluster / "kwok.yaml").exists()


@dataclasses.dataclass(frozen=True)
class ProcessHealth:
    component: str
    pid: int | None
    alive: bool
    rss_mib: float


def process_health() -> list[ProcessHealth]:
    """The data plane processes (kwokctl pid files + Kueue) with their resident memory."""
    out: list[ProcessHealth] = []
    pid_dir = PATHS.kwok_cluster / "pids"
    if pid_dir.is_dir():
        for pidfile in sorted(pid_dir.glob("*.pid")):
            try:
                pid: int | None = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                pid = None
            # a stale pid file (e.g. after a reboot) may name an unrelated process
            alive = pid is not None and runs(pid, pidfile.stem)
            rss = _rss_kib(pid) / 1024 if alive and pid is not None else 0.0
            out.append(ProcessHealth(pidfile.stem, pid, alive, rss))
    kpid = kueue_pid()
    out.append(
        ProcessHealth("kueue", kpid, kpid is not None, _rss_kib(kpid) / 1024 if kpid else 0.0)
    )
    if CPU_NODE_ENABLED:
        for comp, pid in (("containerd", containerd_pid()), ("kubelet", kubelet_pid())):
            out.append(ProcessHealth(comp, pid, pid is not None,
                                     _rss_kib(pid) / 1024 if pid else 0.0))  # fmt: skip
    return out


CONTROL_PLANE_COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok-controller",
)


def control_plane_alive() -> bool:
    """Every process kwokctl started for the control plane is running."""
    alive = {p.component for p in process_health() if p.alive}
    return all(c in alive for c in CONTROL_PLANE_COMPONENTS)


def data_plane_rss_mib() -> float:
    return sum(p.rss_mib for p in process_health() if p.alive)


def _component_pid(component: str, exe_name: str) -> int | None:
    try:
        pid = int(NODE.pidfile(component).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if runs(pid, exe_name) else None


def containerd_pid() -> int | None:
    return _component_pid("containerd", "containerd")


def kubelet_pid() -> int | None:
    return _component_pid("kubelet", binary_paths()["kubelet"].name)


def _gpu_nodes_ready() -> bool:
    proc = kubectl("get", "nodes", "-l", SIMULATED_NODE_SELECTOR, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    items = json.loads(proc.stdout).get("items", [])
    if not items:
        return False
    for node in items:
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        if conds.get("Ready") != "True":
            return False
    return True


def _cluster_queue_active(name: str = EXAMPLE_CLUSTER_QUEUE) -> bool:
    proc = kubectl("get", "clusterqueue", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    conds = json.loads(proc.stdout).get("status", {}).get("conditions", [])
    return any(c["type"] == "Active" and c["status"] == "True" for c in conds)


def _kueue_ready_or_dead() -> bool:
    return kueue_ready() or kueue_pid() is None
