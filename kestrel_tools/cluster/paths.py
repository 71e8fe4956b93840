"""Where the data plane lives and what its parts are called: pinned versions, cached
binaries, state directories, ports, the CPU node's names and paths, ClusterInfo.
Standard library only; production services import this module alone."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from kestrel.config import local_cluster_dir
from kestrel.workloads import CPU_FLAVOR, POOL_LABEL, SIMULATED_LABEL

Progress = Callable[[str], None]


REPO_ROOT = Path(__file__).resolve().parents[2]


CLUSTER_SRC = REPO_ROOT / "cluster"


MANIFESTS = CLUSTER_SRC / "manifests"


CACHE_DIR = Path(os.environ.get("KESTREL_CACHE", str(Path.home() / ".cache" / "kestrel")))


BIN_DIR = CACHE_DIR / "bin"


STATE_DIR = local_cluster_dir()


CLUSTER_NAME = "kestrel"


APISERVER_PORT = int(os.environ.get("KESTREL_APISERVER_PORT", "16443"))


KUEUE_HEALTH_PORT = int(os.environ.get("KESTREL_KUEUE_HEALTH_PORT", "18081"))


KUEUE_METRICS_PORT = int(os.environ.get("KESTREL_KUEUE_METRICS_PORT", "18443"))


KUEUE_WEBHOOK_PORT = int(os.environ.get("KESTREL_KUEUE_WEBHOOK_PORT", "19443"))


# Kueue v0.19 reads its metrics serving cert from this fixed path when its internal
# cert management is off (cmd/kueue/main.go); we point it at our self-signed cert.
KUEUE_METRICS_CERT_PATH = Path("/etc/kueue/metrics/certs")


KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


EXAMPLE_CLUSTER_QUEUE = "tenant-example"


SIMULATED_NODE_SELECTOR = "kestrel.dev/simulated=true"


DEFAULT_TIMEOUT_S = 300.0


# Bumped when a running cluster must be recreated for a change of how it is set up.
LAYOUT = "2-cpu-node"


class ClusterError(RuntimeError):
    """The data plane could not be built, started or reached."""


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the running cluster keeps its state, logs and kubeconfig."""

    state: Path = STATE_DIR

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def kwok_workdir(self) -> Path:
        return self.state / "kwok"

    @property
    def kwok_cluster(self) -> Path:
        return self.kwok_workdir / "clusters" / CLUSTER_NAME

    @property
    def kwok_logs(self) -> Path:
        return self.kwok_cluster / "logs"

    @property
    def kueue_dir(self) -> Path:
        return self.state / "kueue"

    @property
    def kueue_pidfile(self) -> Path:
        return self.kueue_dir / "kueue.pid"

    @property
    def kueue_log(self) -> Path:
        return self.logs / "kueue.log"

    @property
    def lock(self) -> Path:
        return self.state / ".lock"


PATHS = Paths()


def read_versions(path: Path = CLUSTER_SRC / "versions.env") -> dict[str, str]:
    """The pinned versions (``KEY=value`` lines of cluster/versions.env)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        versions[key.strip()] = value.strip().strip('"')
    return versions


def binary_paths(versions: dict[str, str] | None = None) -> dict[str, Path]:
    """Cached binary path for every component, keyed by component name."""
    v = versions or read_versions()
    out = {name: BIN_DIR / f"{name}-{v['KUBE_VERSION']}" for name in KUBE_BINARIES}
    out["kubelet"] = BIN_DIR / f"kubelet-{v['KUBE_VERSION']}"
    out["etcd"] = BIN_DIR / f"etcd-{v['ETCD_VERSION']}"
    out["kwok"] = BIN_DIR / f"kwok-{v['KWOK_VERSION']}"
    out["kwokctl"] = BIN_DIR / f"kwokctl-{v['KWOK_VERSION']}"
    out["kueue"] = BIN_DIR / f"kueue-{v['KUEUE_VERSION']}"
    return out


def kueue_crd_dir(versions: dict[str, str] | None = None) -> Path:
    v = versions or read_versions()
    return CACHE_DIR / f"kueue-crds-{v['KUEUE_VERSION']}"


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A running data plane: where to reach it and what versions it runs."""

    kubeconfig: Path
    server: str
    state_dir: Path
    log_dir: Path
    kwok_log_dir: Path
    kubernetes_version: str
    kueue_version: str
    kwok_version: str
    etcd_version: str

    def env(self) -> dict[str, str]:
        """Environment for tools that should talk to this cluster (KUBECONFIG)."""
        return {"KUBECONFIG": str(self.kubeconfig)}


def cluster_info(versions: dict[str, str] | None = None) -> ClusterInfo:
    v = versions or read_versions()
    return ClusterInfo(
        kubeconfig=PATHS.kubeconfig,
        server=f"https://127.0.0.1:{APISERVER_PORT}",
        state_dir=PATHS.state,
        log_dir=PATHS.logs,
        kwok_log_dir=PATHS.kwok_logs,
        kubernetes_version=v["KUBE_VERSION"],
        kueue_version=v["KUEUE_VERSION"],
        kwok_version=v["KWOK_VERSION"],
        etcd_version=v["ETCD_VERSION"],
    )


CPU_NODE_ENABLED = os.environ.get("KESTREL_CPU_NODE", "1").lower() not in ("0", "false", "no")


NODE_NAME = os.environ.get("KESTREL_NODE_NAME", "kestrel-cpu-0")


KUBELET_PORT = int(os.environ.get("KESTREL_KUBELET_PORT", "10250"))


KUBELET_HEALTHZ_PORT = int(os.environ.get("KESTREL_KUBELET_HEALTHZ_PORT", "10248"))


POD_CIDR = os.environ.get("KESTREL_POD_CIDR", "10.244.250.0/24")


CNI_BIN_DIR = Path(os.environ.get("KESTREL_CNI_BIN_DIR", "/usr/lib/cni"))


CPU_NODE_SELECTOR = "kestrel.dev/pool=cpu,kestrel.dev/simulated=false"


CPU_NODE_LABELS = {
    POOL_LABEL: "cpu",
    SIMULATED_LABEL: "false",
    "kestrel.dev/flavor": CPU_FLAVOR,
}


IMAGES_SRC = REPO_ROOT / "images"


NODE_APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "debootstrap")


@dataclasses.dataclass(frozen=True)
class NodePaths:
    """Where the real node keeps containerd's and the kubelet's state."""

    root: Path

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd / "config.toml"

    @property
    def socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.containerd / "root"  # images and snapshots: kept across down/up

    @property
    def containerd_state(self) -> Path:
        return self.containerd / "state"  # tasks, sandboxes, netns mounts: removed on down

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def images_json(self) -> Path:
        return self.root / "images.json"

    def pidfile(self, component: str) -> Path:
        return self.root / f"{component}.pid"

    def log(self, component: str) -> Path:
        return PATHS.logs / f"{component}.log"


NODE = NodePaths(PATHS.state / "node")


# One bridge and one cgroup root per kubelet port: two clusters never share them.
CNI_BRIDGE = f"kbr{KUBELET_PORT}"


CGROUP_ROOT = f"/kestrel-{KUBELET_PORT}"
