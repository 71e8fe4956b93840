"""The Kestrel data plane: a genuine local Kubernetes control plane with Kueue and KWOK.

What runs (all local processes bound to 127.0.0.1, no containers):

* etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the KWOK controller,
  started by ``kwokctl create cluster --runtime binary`` from binaries that
  ``cluster/build.sh`` built from the Go module registry at the versions pinned in
  ``cluster/versions.env`` (cached as ``~/.cache/kestrel/bin/<name>-<version>``);
* the Kueue manager (its CRDs applied from its own module), against that apiserver;
* a SIMULATED GPU pool: KWOK nodes advertising ``nvidia.com/gpu`` in two flavors
  (``cluster/manifests/nodes.yaml``) whose pods are played by KWOK Stages
  (``cluster/manifests/kwok-stages.yaml``): a Job's pod runs for the duration in its
  ``pod-complete.stage.kwok.x-k8s.io/delay`` annotation, then Succeeds.

The apiserver, scheduler, controllers and Kueue quota are real; only the GPU nodes and
what runs on them are simulated.

Use from Python::

    info = ensure_cluster()          # builds if needed, starts if not up, waits ready
    client = api_client()            # kubernetes.client.ApiClient for info.kubeconfig

or from the shell: ``python kestrel/cluster.py up|down|status|build|env``
(``cluster/up``, ``cluster/down`` and ``cluster/status`` are thin wrappers).

This module imports only the standard library at import time; ``kubernetes`` is
imported by :func:`api_client` alone, so ``cluster/up`` works before the project venv.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kestrel.workloads import CPU_FLAVOR as CPU_FLAVOR  # re-exported: kc.CPU_FLAVOR
from kestrel.workloads import POOL_LABEL, SIMULATED_LABEL, condition_true

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Progress = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SRC = REPO_ROOT / "cluster"
MANIFESTS = CLUSTER_SRC / "manifests"
CACHE_DIR = Path(os.environ.get("KESTREL_CACHE", str(Path.home() / ".cache" / "kestrel")))
BIN_DIR = CACHE_DIR / "bin"
STATE_DIR = Path(os.environ.get("KESTREL_CLUSTER_DIR", str(CACHE_DIR / "cluster")))
CLUSTER_NAME = "kestrel"
APISERVER_PORT = int(os.environ.get("KESTREL_APISERVER_PORT", "16443"))
KUEUE_HEALTH_PORT = int(os.environ.get("KESTREL_KUEUE_HEALTH_PORT", "18081"))
KUEUE_METRICS_PORT = int(os.environ.get("KESTREL_KUEUE_METRICS_PORT", "18443"))
KUEUE_WEBHOOK_PORT = int(os.environ.get("KESTREL_KUEUE_WEBHOOK_PORT", "19443"))
# Kueue v0.19 reads its metrics serving cert from this fixed path when its internal
# cert management is off (cmd/kueue/main.go); we point it at our self-signed cert.
KUEUE_METRICS_CERT_PATH = Path("/etc/kueue/metrics/certs")

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
GPU_FLAVORS = ("gpu-h100", "gpu-a10")
EXAMPLE_CLUSTER_QUEUE = "tenant-example"
SIMULATED_NODE_SELECTOR = "kestrel.dev/simulated=true"
DEFAULT_TIMEOUT_S = 300.0
# Bumped when a running cluster must be recreated for a change of how it is set up.
LAYOUT = "2-cpu-node"


class ClusterError(RuntimeError):
    """The data plane could not be built, started or reached."""


# --------------------------------------------------------------------------- paths


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


# --------------------------------------------------------------------------- info


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


# --------------------------------------------------------------------------- helpers


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    progress: Progress | None = None,
    interval_s: float = 0.25,
    max_interval_s: float = 2.0,
) -> None:
    """Poll ``check`` (with backoff) until it is true; raise ClusterError on timeout."""
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    announced = False
    while True:
        if check():
            if announced and progress:
                progress(f"  {what}: ready after {time.monotonic() - started:.1f}s")
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        if not announced and progress and time.monotonic() - started > 2:
            progress(f"  waiting for {what} ...")
            announced = True
        time.sleep(interval_s)
        interval_s = min(interval_s * 1.5, max_interval_s)


def _run(
    cmd: Sequence[str | Path],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float | None = 120,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input_text,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ClusterError(
            f"command failed ({proc.returncode}): {' '.join(str(c) for c in cmd)}\n"
            f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    return proc


def kubectl(
    *args: str, check: bool = True, timeout: float | None = 120, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the pinned kubectl against the cluster's kubeconfig."""
    kubectl_bin = binary_paths()["kubectl"]
    return _run(
        [kubectl_bin, "--kubeconfig", str(PATHS.kubeconfig), *args],
        check=check,
        timeout=timeout,
        input_text=input_text,
    )


def _kwok_env(bins: dict[str, Path], versions: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    nowhere = str(PATHS.state / "no-downloads")  # any default path kwokctl falls back to
    # The apiserver inherits this environment; it reaches the real node's kubelet (logs,
    # exec) at the node's IP, which the dead proxy below must not catch.
    no_proxy = "127.0.0.1,localhost"
    if CPU_NODE_ENABLED:
        with contextlib.suppress(ClusterError, OSError, subprocess.SubprocessError):
            no_proxy += f",{node_ip()}"
    env.update(
        {
            "KWOK_WORKDIR": str(PATHS.kwok_workdir),
            "KWOK_RUNTIME": "binary",
            "KWOK_KUBE_VERSION": versions["KUBE_VERSION"],
            "KWOK_KUBE_APISERVER_BINARY": str(bins["kube-apiserver"]),
            "KWOK_KUBE_CONTROLLER_MANAGER_BINARY": str(bins["kube-controller-manager"]),
            "KWOK_KUBE_SCHEDULER_BINARY": str(bins["kube-scheduler"]),
            "KWOK_KUBECTL_BINARY": str(bins["kubectl"]),
            "KWOK_CONTROLLER_BINARY": str(bins["kwok"]),
            "KWOK_ETCD_BINARY": str(bins["etcd"]),
            "KWOK_ETCD_VERSION": versions["ETCD_VERSION"].lstrip("v"),
            # Everything else kwokctl might fetch resolves to a local path that does
            # not exist, and a dead proxy catches any http(s) URL: it never downloads.
            "KWOK_KUBE_BINARY_PREFIX": nowhere,
            "KWOK_BINARY_PREFIX": nowhere,
            "KWOK_ETCD_BINARY_PREFIX": nowhere,
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "http_proxy": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9",
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }
    )
    return env


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _pid_dead(pid: int) -> bool:
    return not _pid_alive(pid)


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serialise up/down across processes (parallel test sessions, CLI)."""
    PATHS.state.mkdir(parents=True, exist_ok=True)
    with open(PATHS.lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- build


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


# --------------------------------------------------------------------------- health


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
    if not _pid_alive(pid):
        return None
    cmd = _proc_cmdline(pid)
    if not cmd or "kueue" not in Path(cmd[0]).name:
        return None
    return pid


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
            alive = (
                pid is not None
                and _pid_alive(pid)
                and Path((_proc_cmdline(pid) or [""])[0]).name == pidfile.stem
            )
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


# --------------------------------------------------------------------------- CPU pool
# A REAL node: kubelet (built like the other Kubernetes binaries) + containerd (Debian's)
# + runc + a bridge CNI, running images built here by images/build.sh and imported into
# containerd's k8s.io namespace. It joins this apiserver as NODE_NAME, untainted, with
# the machine's real capacity. Everything it keeps lives under PATHS.state / "node";
# ports, names and the pod subnet come from the environment so that several clusters
# can share one machine (only one of them should run a kubelet, see cluster/README.md).

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


def node_ip() -> str:
    """The machine's primary IPv4 address (the kubelet refuses a loopback node IP)."""
    if ip := os.environ.get("KESTREL_NODE_IP"):
        return ip
    proc = _run(["ip", "-4", "-o", "route", "get", "192.0.2.254"], check=False, timeout=5)
    words = proc.stdout.split()
    if "src" in words:
        return words[words.index("src") + 1]
    proc = _run(["ip", "-4", "-o", "addr", "show", "scope", "global"], check=False, timeout=5)
    for line in proc.stdout.splitlines():
        return line.split()[3].split("/")[0]
    raise ClusterError("no global IPv4 address on this machine for the kubelet's node IP")


def _component_pid(component: str, exe_name: str) -> int | None:
    try:
        pid = int(NODE.pidfile(component).read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    cmd = _proc_cmdline(pid)
    if not cmd or Path(cmd[0]).name != exe_name:
        return None
    return pid


def containerd_pid() -> int | None:
    return _component_pid("containerd", "containerd")


def kubelet_pid() -> int | None:
    return _component_pid("kubelet", binary_paths()["kubelet"].name)


def node_tools_missing() -> list[str]:
    """Host tools the real node needs (installed by scripts/setup.sh from Debian)."""
    want = {"containerd": "containerd", "ctr": "containerd", "runc": "runc",
            "debootstrap": "debootstrap", "containerd-shim-runc-v2": "containerd"}
    missing = sorted({pkg for exe, pkg in want.items() if shutil.which(exe) is None})
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append("containernetworking-plugins")
    return missing


def build_images(progress: Progress = print) -> dict[str, Any]:
    """images/build.sh (cached by the hash of its inputs); returns its IMAGES record."""
    cmd = [str(IMAGES_SRC / "build.sh"), "pause", "kestrel"]
    env = dict(os.environ)
    env.setdefault("PY", sys.executable)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env)  # fmt: skip
    assert proc.stdout is not None
    record: dict[str, Any] | None = None
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        if line.startswith("IMAGES "):
            record = json.loads(line[len("IMAGES "):])
            continue
        tail = [*tail[-40:], line]
        progress(f"  {line}")
    if proc.wait() != 0 or record is None:
        raise ClusterError(f"{' '.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(tail))
    return record


def _ctr(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return _run(["ctr", "--address", str(NODE.socket), "--namespace", "k8s.io", *args],
                check=check, timeout=timeout)  # fmt: skip


def _write_containerd_config(pause_ref: str) -> None:
    NODE.containerd.mkdir(parents=True, exist_ok=True)
    NODE.containerd_config.write_text(f"""\
# containerd for the Kestrel CPU node (generated by kestrel/cluster.py).
version = 2
root = "{NODE.containerd_root}"
state = "{NODE.containerd_state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{NODE.socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{NODE.containerd / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  # The pause image imported from images/build.sh; if this differs from the imported
  # tag the sandbox image is garbage-collected and pods hang (containerd #6352).
  sandbox_image = "{pause_ref}"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, so down can find and unmount them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{NODE.cni_conf}"
    max_conf_num = 1
""")


def _write_cni_config() -> None:
    NODE.cni_conf.mkdir(parents=True, exist_ok=True)
    NODE.cni_ipam.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "1.0.0",
        "name": f"kestrel-{KUBELET_PORT}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # no iptables rules to leave behind
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(NODE.cni_ipam),
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }
    (NODE.cni_conf / "10-kestrel.conflist").write_text(json.dumps(conflist, indent=1) + "\n")


def _cgroup_dirs() -> list[Path]:
    """Our kubelet cgroup root in every mounted cgroup hierarchy (v1 or v2)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # cgroup v2
        return [base / CGROUP_ROOT.lstrip("/")]
    out = []
    for d in sorted(base.iterdir()):
        if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists():
            out.append(d / CGROUP_ROOT.lstrip("/"))
    return out


def _write_kubelet_config(ip: str) -> None:
    NODE.kubelet.mkdir(parents=True, exist_ok=True)
    NODE.pod_logs.mkdir(parents=True, exist_ok=True)
    NODE.kubelet_config.write_text(f"""\
# kubelet for the Kestrel CPU node (generated by kestrel/cluster.py).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {KUBELET_HEALTHZ_PORT}
# The apiserver (kwokctl) has no kubelet client certificate; the kubelet API is open to
# the machine it runs on, which is a development machine with no outside network.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://{NODE.socket}
imageServiceEndpoint: unix://{NODE.socket}
# containerd 1.6 lacks the RuntimeConfig call the systemd driver needs; cgroup v1 here.
cgroupDriver: cgroupfs
cgroupRoot: {CGROUP_ROOT}
failCgroupV1: false
failSwapOn: false
podLogsDir: {NODE.pod_logs}
registerNode: true
serializeImagePulls: false
# Images are imported, never pulled: keep them (and do not evict for a full disk
# before the machine is really out of it).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
""")


def _start_daemon(component: str, cmd: list[str], env: dict[str, str] | None = None) -> int:
    NODE.root.mkdir(parents=True, exist_ok=True)
    PATHS.logs.mkdir(parents=True, exist_ok=True)
    with open(NODE.log(component), "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                cwd=str(NODE.root), start_new_session=True)  # fmt: skip
    NODE.pidfile(component).write_text(f"{proc.pid}\n")
    return proc.pid


def _stop_pid(pid: int, what: str, progress: Progress, grace_s: float = 15) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ClusterError):
        wait_until(f"{what} to exit", functools.partial(_pid_dead, pid), grace_s)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ClusterError):
            wait_until(f"{what} to be killed", functools.partial(_pid_dead, pid), 10)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    progress(f"  {what} (pid {pid}) stopped")


def _containerd_ready() -> bool:
    if containerd_pid() is None:
        return True  # dead: the caller checks and reports
    return _ctr("version", check=False, timeout=10).returncode == 0


def _node_object() -> dict[str, Any] | None:
    proc = kubectl("get", "node", NODE_NAME, "-o", "json", check=False, timeout=20)
    if proc.returncode != 0:
        return None
    return cast(dict[str, Any], json.loads(proc.stdout))


def cpu_node_ready() -> bool:
    """Registered, Ready, schedulable (down cordons it), and our kubelet runs."""
    node = _node_object()
    return (node is not None and condition_true(node, "Ready")
            and not (node.get("spec") or {}).get("unschedulable")
            and kubelet_pid() is not None)  # fmt: skip


def _ensure_images_imported(images: dict[str, Any], progress: Progress) -> None:
    have = set(_ctr("images", "ls", "-q", check=False).stdout.split())
    # Older builds of the Kestrel image are only disk now (a running container keeps
    # its snapshot until it ends).
    current = {images["kestrel"]["ref"], images["pause"]["ref"]}
    for ref in sorted(have - current):
        if ref.startswith(("kestrel.dev/kestrel:", "kestrel.dev/pause:")):
            _ctr("images", "rm", ref, check=False, timeout=60)
            progress(f"  removed the older image {ref}")
    for name in ("pause", "kestrel"):
        ref, archive = images[name]["ref"], images[name]["archive"]
        if ref in have:
            continue
        t = time.monotonic()
        proc = _ctr("images", "import", archive, timeout=600, check=False)
        if ref not in set(_ctr("images", "ls", "-q").stdout.split()):
            raise ClusterError(f"ctr images import {archive} did not create {ref}:\n"
                               f"{proc.stdout}{proc.stderr}")
        # kubelet image GC never removes a pinned image (the CRI reports the label)
        _ctr("images", "label", ref, "io.cri-containerd.pinned=pinned", check=False)
        progress(f"  imported {ref} into containerd k8s.io ({time.monotonic() - t:.1f}s)")


def _start_cpu_node(progress: Progress, timeout_s: float) -> None:
    """containerd + images + CNI + kubelet, then wait for the node to be Ready."""
    missing = node_tools_missing()
    if missing:
        raise ClusterError(f"the CPU node needs Debian packages {missing}: run scripts/setup.sh")
    if not binary_paths()["kubelet"].exists():
        build(progress, ["kubelet"])
    t0 = time.monotonic()
    images = build_images(progress)
    NODE.root.mkdir(parents=True, exist_ok=True)
    NODE.images_json.write_text(json.dumps(images, indent=1) + "\n")
    cpid = containerd_pid()
    if cpid is not None and f'sandbox_image = "{images["pause"]["ref"]}"' not in (
        NODE.containerd_config.read_text() if NODE.containerd_config.exists() else ""
    ):
        _stop_pid(cpid, "containerd (new pause image)", progress)  # its pods keep running
    # A containerd started right after the previous one stopped can exit at once
    # (a clean clone's first `make test` right after `make cluster-down` saw it, with
    # nothing in its log): it gets three tries, a second apart, each one said.
    for attempt in range(1, 4):
        if containerd_pid() is None:
            _write_containerd_config(images["pause"]["ref"])
            pid = _start_daemon("containerd",
                                ["containerd", "--config", str(NODE.containerd_config)])
            progress(f"  containerd started (pid {pid}), socket {NODE.socket}")
        wait_until("containerd", _containerd_ready, 60, progress)
        if containerd_pid() is not None:
            break
        progress(f"  containerd exited during start (try {attempt} of 3)")
        time.sleep(1.0 * attempt)
    if containerd_pid() is None:
        raise ClusterError(f"containerd exited; see {NODE.log('containerd')}:\n"
                           f"{_tail(NODE.log('containerd'))}")
    _ensure_images_imported(images, progress)
    _write_cni_config()
    kpid = kubelet_pid()
    if kpid is not None and _node_object() is None:
        # the apiserver was recreated under a running kubelet: it registers only at start
        _stop_pid(kpid, "kubelet (node not registered)", progress)
        kpid = None
    if kpid is None:
        for d in _cgroup_dirs():
            with contextlib.suppress(OSError):
                d.mkdir(exist_ok=True)
        ip = node_ip()
        _write_kubelet_config(ip)
        bins = binary_paths()
        labels = ",".join(f"{k}={v}" for k, v in CPU_NODE_LABELS.items())
        env = dict(os.environ)
        no_proxy = f"127.0.0.1,localhost,{ip}"
        env.update({"NO_PROXY": no_proxy, "no_proxy": no_proxy})
        pid = _start_daemon("kubelet", [
            str(bins["kubelet"]),
            f"--config={NODE.kubelet_config}",
            f"--kubeconfig={PATHS.kubeconfig}",
            f"--root-dir={NODE.kubelet}",
            f"--cert-dir={NODE.kubelet / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={ip}",
            f"--node-labels={labels}",
            "--v=1",
        ], env)  # fmt: skip
        progress(f"  kubelet started (pid {pid}) as node {NODE_NAME} ({ip}), "
                 f"log {NODE.log('kubelet')}")  # fmt: skip

    def ready_or_dead() -> bool:
        node = _node_object()
        if node and (node.get("spec") or {}).get("unschedulable"):
            kubectl("uncordon", NODE_NAME, check=False, timeout=20)  # cordoned by a stop
        return kubelet_pid() is None or cpu_node_ready()

    wait_until(f"node {NODE_NAME} Ready", ready_or_dead, timeout_s, progress)
    if kubelet_pid() is None:
        raise ClusterError(f"kubelet exited; see {NODE.log('kubelet')}:\n"
                           f"{_tail(NODE.log('kubelet'))}")
    progress(f"  node {NODE_NAME} Ready ({time.monotonic() - t0:.1f}s incl. images)")


def _node_mounts() -> list[str]:
    """Mount points under the node's state dir, deepest first."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == str(NODE.root) or mnt.startswith(str(NODE.root) + "/"):
                out.append(mnt)
    return sorted(set(out), key=len, reverse=True)


def _shim_pids() -> list[int]:
    """containerd-shim-runc-v2 processes of OUR containerd (by its socket address)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        cmd = _proc_cmdline(int(d.name))
        if cmd and Path(cmd[0]).name.startswith("containerd-shim") and str(NODE.socket) in cmd:
            out.append(int(d.name))
    return out


def _cgroup_pids() -> list[int]:
    """Processes in our kubelet's cgroup tree (the pods' containers)."""
    pids: set[int] = set()
    for root in _cgroup_dirs():
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def _stop_cpu_node(progress: Progress) -> None:
    """Drain the real node, stop the kubelet and containerd, and leave nothing behind:
    no process (containers, shims), no mount (rootfs, netns, volumes), no bridge."""
    kpid, cpid = kubelet_pid(), containerd_pid()
    if kpid is None and cpid is None and not _node_mounts() and not _shim_pids():
        return
    if kpid is not None and apiserver_ready():
        # Let the kubelet itself stop the pods (CNI DEL, netns, volumes) first.
        kubectl("cordon", NODE_NAME, check=False, timeout=20)
        kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}",
                "--grace-period=0", "--force", "--wait=false", check=False, timeout=60)
        if cpid is not None:
            def no_running_tasks() -> bool:
                return "RUNNING" not in _ctr("tasks", "ls", check=False, timeout=10).stdout

            with contextlib.suppress(ClusterError):
                wait_until("the node's pods to stop", no_running_tasks, 30, progress)
    if kpid is not None:
        _stop_pid(kpid, "kubelet", progress)
    if containerd_pid() is not None:
        for line in _ctr("tasks", "ls", check=False, timeout=20).stdout.splitlines()[1:]:
            task = line.split()[0]
            _ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False, timeout=20)
        time.sleep(0.5)
        for line in _ctr("tasks", "ls", check=False, timeout=20).stdout.splitlines()[1:]:
            _ctr("tasks", "delete", "--force", line.split()[0], check=False, timeout=20)
        for cid in _ctr("containers", "ls", "-q", check=False, timeout=20).stdout.split():
            _ctr("containers", "delete", cid, check=False, timeout=20)
    cpid = containerd_pid()
    if cpid is not None:
        _stop_pid(cpid, "containerd", progress)
    for pid in [*_cgroup_pids(), *_shim_pids()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            progress(f"  killed leftover process {pid} ({' '.join(_proc_cmdline(pid))[:80]})")
    for mnt in _node_mounts():
        proc = _run(["umount", "-l", mnt], check=False, timeout=20)
        if proc.returncode != 0:
            progress(f"  umount {mnt}: {proc.stderr.strip()}")
    n = 0
    for root in _cgroup_dirs():
        if root.is_dir():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
                    n += 1
            with contextlib.suppress(OSError):
                root.rmdir()
    _run(["ip", "link", "delete", CNI_BRIDGE], check=False, timeout=10)
    # What the next start must not see again: tasks, netns, pods, pod IPs. The image
    # store (containerd root) stays: a later up does not import the images again.
    for d in (NODE.containerd_state, NODE.kubelet, NODE.cni_ipam, NODE.pod_logs):
        if not any(m.startswith(str(d)) for m in _node_mounts()):
            shutil.rmtree(d, ignore_errors=True)
    for component in ("kubelet", "containerd"):
        NODE.pidfile(component).unlink(missing_ok=True)
    left = _node_mounts()
    progress(f"  CPU node stopped ({n} cgroups removed"
             f"{', mounts LEFT: ' + str(left) if left else ''})")


def node_leftovers() -> dict[str, list[str]]:
    """What a stopped node must not leave: processes, mounts, bridge (tests check it)."""
    procs = [str(p) for p in (*_shim_pids(), *_cgroup_pids())]
    for comp in ("kubelet", "containerd"):
        pid = kubelet_pid() if comp == "kubelet" else containerd_pid()
        if pid is not None:
            procs.append(f"{comp}:{pid}")
    bridge = Path(f"/sys/class/net/{CNI_BRIDGE}")
    netns = [m for m in _node_mounts() if "/netns/" in m]
    return {"processes": procs, "mounts": _node_mounts(), "netns": netns,
            "links": [CNI_BRIDGE] if bridge.exists() else []}


def node_images() -> dict[str, Any]:
    """The IMAGES record of the running node (refs of the pause and Kestrel images)."""
    try:
        return cast(dict[str, Any], json.loads(NODE.images_json.read_text()))
    except (OSError, ValueError) as exc:
        raise ClusterError(f"no CPU node images recorded at {NODE.images_json}") from exc


def kestrel_image() -> str:
    return str(node_images()["kestrel"]["ref"])


# --------------------------------------------------------------------------- up


def _write_kueue_config() -> Path:
    cfg_dir = PATHS.kueue_dir
    cfg_dir.mkdir(parents=True, exist_ok=True)
    certs = cfg_dir / "certs"
    config = f"""\
# Kueue manager configuration for the Kestrel data plane (generated by kestrel/cluster.py).
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:{KUEUE_HEALTH_PORT}
metrics:
  bindAddress: 127.0.0.1:{KUEUE_METRICS_PORT}
# The webhook server still starts (webhooks.Setup is unconditional) but no webhook
# configuration is registered with the apiserver: Jobs are created suspended with the
# kueue.x-k8s.io/queue-name label, so the mutating webhook is not needed.
webhook:
  host: 127.0.0.1
  port: {KUEUE_WEBHOOK_PORT}
  certDir: {certs}
internalCertManagement:
  enable: false
leaderElection:
  leaderElect: false
manageJobsWithoutQueueName: false
# The on-demand visibility API server is an aggregated apiserver that would bind
# 0.0.0.0:8082 and need an APIService registration; not used here.
featureGates:
  VisibilityOnDemand: false
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 10
    LocalQueue.kueue.x-k8s.io: 5
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 5
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 300
  burst: 500
integrations:
  frameworks:
  - "batch/job"
"""
    path = cfg_dir / "config.yaml"
    path.write_text(config)
    return path


def _ensure_kueue_certs(progress: Progress) -> None:
    """Self-signed serving cert for Kueue's webhook and metrics servers (openssl)."""
    certs = PATHS.kueue_dir / "certs"
    crt, key = certs / "tls.crt", certs / "tls.key"
    if not (crt.exists() and key.exists()):
        certs.mkdir(parents=True, exist_ok=True)
        _run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                "-keyout", str(key), "-out", str(crt), "-days", "3650",
                "-subj", "/CN=kueue-kestrel-local",
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ]
        )  # fmt: skip
        progress(f"  generated self-signed Kueue serving cert in {certs}")
    target = KUEUE_METRICS_CERT_PATH
    if target.is_symlink() and target.resolve() == certs.resolve():
        return
    if target.exists() and not target.is_symlink():
        if (target / "tls.crt").exists() and (target / "tls.key").exists():
            return  # someone provided real certs there; use them
        raise ClusterError(f"{target} exists and has no tls.crt/tls.key")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.symlink_to(certs)
    except OSError as exc:
        raise ClusterError(
            f"Kueue {read_versions()['KUEUE_VERSION']} reads its metrics cert from {target} "
            f"(hard-coded when internal cert management is off) and it could not be created: "
            f"{exc}. Create it as root: ln -s {certs} {target}"
        ) from exc
    progress(f"  {target} -> {certs}")


def _start_kueue(progress: Progress) -> None:
    if kueue_pid() is not None:
        return
    bins = binary_paths()
    config = _write_kueue_config()
    _ensure_kueue_certs(progress)
    PATHS.logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["KUBECONFIG"] = str(PATHS.kubeconfig)
    with open(PATHS.kueue_log, "ab") as log:
        proc = subprocess.Popen(
            [str(bins["kueue"]), f"--config={config}", "--zap-log-level=info"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(PATHS.kueue_dir),
            start_new_session=True,
        )
    PATHS.kueue_pidfile.write_text(f"{proc.pid}\n")
    # Until the child has exec'd, /proc/<pid>/cmdline still shows this (Python) process
    # and kueue_pid() would call Kueue dead: wait for the exec (or the exit).
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        cmd = _proc_cmdline(proc.pid)
        if cmd and "kueue" in Path(cmd[0]).name:
            break
        time.sleep(0.01)
    progress(f"  kueue manager started (pid {proc.pid}), log {PATHS.kueue_log}")


def _stop_kueue(progress: Progress) -> None:
    pid = kueue_pid()
    if pid is None:
        PATHS.kueue_pidfile.unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ClusterError):
        wait_until("kueue to exit", lambda: not _pid_alive(pid), 20)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        wait_until("kueue to be killed", lambda: not _pid_alive(pid), 10)
    # reap it if it was our child (same Python process started it)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    PATHS.kueue_pidfile.unlink(missing_ok=True)
    progress(f"  kueue manager (pid {pid}) stopped")


def _start_control_plane(progress: Progress, timeout_s: float) -> None:
    versions = read_versions()
    bins = binary_paths(versions)
    env = _kwok_env(bins, versions)
    kwokctl_bin = str(bins["kwokctl"])
    PATHS.logs.mkdir(parents=True, exist_ok=True)
    if kwok_cluster_exists():
        if control_plane_alive() and apiserver_ready():
            return
        if _restart_dead_components(progress):
            wait_until("kube-apiserver /readyz", apiserver_ready, timeout_s, progress)
            return
        # kwokctl start launches only components whose pid is not running; a component
        # still shutting down is skipped, so retry until every one is running.
        for attempt in range(1, 6):
            progress(f"  kwokctl: (re)starting stopped components (attempt {attempt})")
            _run(
                [kwokctl_bin, "start", "cluster", "--name", CLUSTER_NAME],
                env=env,
                timeout=timeout_s,
            )
            with contextlib.suppress(ClusterError):
                wait_until("control plane processes", control_plane_alive, 5)
            if control_plane_alive():
                break
        else:
            raise ClusterError(f"control plane processes not running; see {PATHS.kwok_logs}")
    else:
        progress(
            "  kwokctl: creating cluster (etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler, kwok-controller as local processes)"
        )
        cmd = [
            kwokctl_bin, "create", "cluster",
            "--name", CLUSTER_NAME,
            "--runtime", "binary",
            "--config", str(MANIFESTS / "kwokctl.yaml"),
            "--config", str(MANIFESTS / "kwok-stages.yaml"),
            "--kube-apiserver-port", str(APISERVER_PORT),
            "--kube-apiserver-binary", str(bins["kube-apiserver"]),
            "--kube-controller-manager-binary", str(bins["kube-controller-manager"]),
            "--kube-scheduler-binary", str(bins["kube-scheduler"]),
            "--kwok-controller-binary", str(bins["kwok"]),
            "--etcd-binary", str(bins["etcd"]),
            "--kubeconfig", str(PATHS.kubeconfig),
            "--timeout", f"{int(timeout_s)}s",
        ]  # fmt: skip
        proc = _run(cmd, env=env, check=False, timeout=timeout_s + 30)
        (PATHS.logs / "kwokctl-create.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise ClusterError(
                f"kwokctl create cluster failed ({proc.returncode}); see "
                f"{PATHS.logs / 'kwokctl-create.log'}:\n{proc.stderr[-3000:]}"
            )
    wait_until("kube-apiserver /readyz", apiserver_ready, timeout_s, progress)


def _component_specs() -> dict[str, dict[str, Any]]:
    """The command line kwokctl recorded for each control-plane component (kwok.yaml's
    KwokctlConfiguration: binary, args, workDir, envs), or {} when it cannot be read."""
    try:
        import yaml  # type: ignore[import-untyped]  # the venv's, with the kubernetes client
    except ImportError:
        return {}
    try:
        docs = list(yaml.safe_load_all((PATHS.kwok_cluster / "kwok.yaml").read_text()))
    except (OSError, yaml.YAMLError):
        return {}
    config: dict[str, Any] = next(
        (d for d in docs if d and d.get("kind") == "KwokctlConfiguration"), {})
    return {c["name"]: c for c in config.get("components", []) if c.get("binary")}


def _restart_dead_components(progress: Progress) -> bool:
    """Start each dead control-plane component again from its recorded command line,
    in dependency order, as a supervisor restarts a crashed process; True when every
    one is running again. `kwokctl start cluster` does the same but took 125 s here to
    bring back a kill -9'd kube-apiserver that then served in 2 s (bench/chaos.py)."""
    specs = _component_specs()
    dead = [p.component for p in process_health()
            if p.component in CONTROL_PLANE_COMPONENTS and not p.alive]
    if not specs or any(c not in specs for c in dead):
        return False
    for name in sorted(dead, key=CONTROL_PLANE_COMPONENTS.index):
        proc = _spawn(specs[name], PATHS.kwok_logs / f"{name}.log")
        (PATHS.kwok_cluster / "pids" / f"{name}.pid").write_text(str(proc.pid))
        progress(f"  {name} was dead: restarted as pid {proc.pid} from kwok.yaml")
    with contextlib.suppress(ClusterError):
        wait_until("restarted control plane processes", control_plane_alive, 10)
    return control_plane_alive()


def _spawn(spec: dict[str, Any], log_path: Path,
           prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start a component from its kwok.yaml entry (binary, args, envs, workDir), its
    output appended to log_path, in a session of its own; `prefix` runs before it."""
    env = {**os.environ, **{e["name"]: e.get("value", "") for e in spec.get("envs") or []}}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [*prefix, str(spec["binary"]), *[str(a) for a in spec.get("args", [])]],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=spec.get("workDir") or str(PATHS.kwok_cluster), start_new_session=True)


def restart_dead(progress: Progress = print) -> None:
    """What a supervisor does after a crash: start again whichever control-plane process
    or Kueue manager is dead, and nothing else (no apply, no image check: `up` does
    those). Raises ClusterError when a component cannot be brought back."""
    with _state_lock():
        if not control_plane_alive() and not _restart_dead_components(progress):
            raise ClusterError(f"control plane processes not running; see {PATHS.kwok_logs}")
        _start_kueue(progress)


def _replica_pid_file() -> Path:
    return PATHS.kwok_cluster / "replica" / "kube-apiserver.pid"


def apiserver_replica_pid() -> int | None:
    """The running second kube-apiserver's pid (start_apiserver_replica), or None."""
    try:
        pid = int(_replica_pid_file().read_text().strip())
    except (OSError, ValueError):
        return None
    alive = _pid_alive(pid) and Path((_proc_cmdline(pid) or [""])[0]).name == "kube-apiserver"
    return pid if alive else None


def start_apiserver_replica(progress: Progress = print, timeout_s: float = 60) -> int:
    """A second kube-apiserver on the same etcd, address and port, as a highly available
    control plane runs several behind one address. Both bind with SO_REUSEPORT
    (--permit-port-sharing, set in kwokctl.yaml), so the kernel spreads new connections
    over the live ones: after kill -9 of either, clients' broken watches reconnect to
    the other at their first retry instead of backing off while one restarts (client-go
    doubles its wait from 0.8 s with each refused try; Kueue then saw nothing for 9 to
    15 s). The replica runs in a UTS namespace of its own (unshare), so its hostname,
    and with it the identity Lease it renews, differs from the first one's. Returns its
    pid; stop_apiserver_replica (and `down`) stops it."""
    with _state_lock():
        if (running := apiserver_replica_pid()) is not None:
            return running
        spec = _component_specs().get("kube-apiserver")
        if spec is None:
            raise ClusterError(f"no kube-apiserver in {PATHS.kwok_cluster / 'kwok.yaml'}")
        args = [str(a) for a in spec.get("args", [])]
        if "--permit-port-sharing=true" not in args:
            raise ClusterError("this cluster's kube-apiserver was created without "
                               "--permit-port-sharing (cluster/manifests/kwokctl.yaml): "
                               "`make down`, then bring it up again")
        prefix = (["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                   "kestrel-apiserver-replica"] if shutil.which("unshare") else [])
        log_path = PATHS.kwok_logs / "kube-apiserver-replica.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        proc = _spawn(spec, log_path, prefix)
        _replica_pid_file().parent.mkdir(parents=True, exist_ok=True)
        _replica_pid_file().write_text(str(proc.pid))

        def serving() -> bool:
            if proc.poll() is not None:
                raise ClusterError(f"the kube-apiserver replica exited ({proc.returncode}); "
                                   f"see {log_path}:\n{_tail(log_path)}")
            with open(log_path, "rb") as f:
                f.seek(start)
                return b"Serving securely on" in f.read()

        wait_until("the kube-apiserver replica to serve", serving, timeout_s, progress)
        wait_until("both kube-apiservers /readyz", _every_apiserver_ready, timeout_s, progress)
        progress(f"  kube-apiserver replica: pid {proc.pid}, sharing "
                 f"127.0.0.1:{APISERVER_PORT}")
        return proc.pid


def _every_apiserver_ready(tries: int = 12) -> bool:
    """/readyz is ok on `tries` fresh connections in a row. Apiservers sharing the port
    cannot be asked one by one; the kernel spreads connections over them by their
    addresses and ports, so twelve in a row all reach the same one of two with a chance
    of 1 in 2,048."""
    ctx = ssl.create_default_context(cafile=str(PATHS.kwok_cluster / "pki" / "ca.crt"))
    for _ in range(tries):
        conn = http.client.HTTPSConnection("127.0.0.1", APISERVER_PORT, context=ctx,
                                           timeout=5)
        try:
            conn.request("GET", "/readyz")
            resp = conn.getresponse()
            if resp.status != 200 or resp.read().strip() != b"ok":
                return False
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()
    return True


def stop_apiserver_replica(progress: Progress = print) -> None:
    """Stop the replica start_apiserver_replica made (SIGTERM, then SIGKILL). Idempotent."""
    pid = apiserver_replica_pid()
    if pid is not None:
        _stop_pid(pid, "kube-apiserver replica", progress)
    _replica_pid_file().unlink(missing_ok=True)


def _apply_kueue_crds(progress: Progress) -> None:
    crds = kueue_crd_dir()
    have = set(kubectl("get", "crd", "-o", "name", check=False).stdout.split())
    # kueue.x-k8s.io_workloads.yaml -> customresourcedefinition.../workloads.kueue.x-k8s.io
    want = {"customresourcedefinition.apiextensions.k8s.io/"
            + ".".join(reversed(f.stem.split("_", 1))) for f in crds.glob("*.yaml")}
    if want and want <= have:
        return  # a repair: they live in etcd (a version change recreates the cluster)
    progress(f"  applying Kueue CRDs from {crds}")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl("wait", "--for=condition=Established", "--timeout=120s", "-f", str(crds))


def _objects_applied() -> None:
    kubectl("apply", "-f", str(MANIFESTS / "nodes.yaml"))
    kubectl("create", "namespace", "kueue-system", check=False)
    kubectl("apply", "-f", str(MANIFESTS / "kueue-queues.yaml"))


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


def is_up() -> bool:
    """True if every part of the data plane answers (no side effects)."""
    return (
        control_plane_alive()
        and apiserver_ready()
        and kueue_pid() is not None
        and kueue_ready()
        and _gpu_nodes_ready()
        and _cluster_queue_active()
        and (not CPU_NODE_ENABLED or cpu_node_ready())
    )


def up(progress: Progress = print, timeout_s: float = DEFAULT_TIMEOUT_S) -> ClusterInfo:
    """Start (or repair) the data plane; idempotent. Waits until it is ready."""
    with _state_lock():
        t0 = time.monotonic()
        ensure_binaries(progress)
        versions = read_versions()
        stamp = PATHS.state / "versions.json"
        # The layout is part of the stamp: a cluster created before the real CPU node
        # (its apiserver lacks the node's IP in NO_PROXY and the kubelet address flag)
        # is recreated once.
        versions = {**versions, "KESTREL_LAYOUT": LAYOUT}
        if kwok_cluster_exists() and stamp.exists() and json.loads(stamp.read_text()) != versions:
            progress("pinned versions or cluster layout changed since the cluster was "
                     "created: recreating it")
            _down_locked(progress)
        if is_up():
            if CPU_NODE_ENABLED:  # the Kestrel image follows the source (cached by hash)
                _start_cpu_node(progress, timeout_s)
            if not stamp.exists():
                stamp.write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
            progress(f"cluster already up ({time.monotonic() - t0:.1f}s check)")
            return cluster_info()
        progress("starting the Kestrel data plane")
        _start_control_plane(progress, timeout_s)
        _apply_kueue_crds(progress)
        _start_kueue(progress)
        wait_until("Kueue manager /readyz", _kueue_ready_or_dead, timeout_s, progress)
        if kueue_pid() is None:
            raise ClusterError(
                f"Kueue manager exited; see {PATHS.kueue_log}:\n{_tail(PATHS.kueue_log)}"
            )
        _objects_applied()
        wait_until("KWOK GPU nodes Ready", _gpu_nodes_ready, timeout_s, progress)
        wait_until(
            f"ClusterQueue {EXAMPLE_CLUSTER_QUEUE} Active",
            _cluster_queue_active,
            timeout_s,
            progress,
        )
        if CPU_NODE_ENABLED:
            _start_cpu_node(progress, timeout_s)
        stamp.write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
        progress(f"cluster up in {time.monotonic() - t0:.1f}s")
        return cluster_info()


def _kueue_ready_or_dead() -> bool:
    return kueue_ready() or kueue_pid() is None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ensure_cluster(progress: Progress = print, timeout_s: float = DEFAULT_TIMEOUT_S) -> ClusterInfo:
    """Make sure the data plane is up (building and starting it if needed); return its info."""
    return up(progress, timeout_s)


def down(progress: Progress = print) -> None:
    """Stop Kueue and delete the kwokctl cluster (etcd data included). Idempotent."""
    with _state_lock():
        _down_locked(progress)


def _down_locked(progress: Progress) -> None:
    _stop_cpu_node(progress)  # first: the kubelet stops its pods while the apiserver runs
    _stop_kueue(progress)
    stop_apiserver_replica(progress)
    versions = read_versions()
    bins = binary_paths(versions)
    components = [p for p in process_health() if p.alive and p.component != "kueue"]
    if (kwok_cluster_exists() or PATHS.kwok_cluster.exists()) and bins["kwokctl"].exists():
        proc = _run(
            [bins["kwokctl"], "delete", "cluster", "--name", CLUSTER_NAME,
             "--kubeconfig", str(PATHS.kubeconfig)],
            env=_kwok_env(bins, versions), check=False, timeout=120,
        )  # fmt: skip
        progress(f"  kwokctl delete cluster: exit {proc.returncode}")
        if proc.returncode != 0:
            progress(proc.stderr[-2000:])
    # Whatever kwokctl did not stop (e.g. its state was damaged) is stopped here,
    # by the pids it recorded and only if they still run our component binaries.
    for comp in components:
        pid = comp.pid
        if pid is None or not _pid_alive(pid):
            continue
        if Path((_proc_cmdline(pid) or [""])[0]).name != comp.component:
            continue
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ClusterError):
            wait_until(f"{comp.component} to exit", functools.partial(_pid_dead, pid), 15)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        progress(f"  stopped leftover {comp.component} (pid {pid})")
    shutil.rmtree(PATHS.kwok_cluster, ignore_errors=True)
    PATHS.kubeconfig.unlink(missing_ok=True)
    (PATHS.state / "versions.json").unlink(missing_ok=True)
    _remove_kueue_metrics_cert_link()
    progress("cluster down")


def _remove_kueue_metrics_cert_link() -> None:
    """Undo the /etc/kueue/metrics/certs symlink made by up (only if it is ours)."""
    link = KUEUE_METRICS_CERT_PATH
    certs = PATHS.kueue_dir / "certs"
    if link.is_symlink() and Path(os.readlink(link)) == certs:
        link.unlink()
        for parent in (link.parent, link.parent.parent):  # /etc/kueue/metrics, /etc/kueue
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty


def cluster_down(progress: Progress = print) -> None:
    """Alias of :func:`down` for callers (tests, demo)."""
    down(progress)


def api_client() -> ApiClient:
    """A ``kubernetes.client.ApiClient`` for the cluster's kubeconfig."""
    from kubernetes import config as k8s_config

    if not PATHS.kubeconfig.exists():
        raise ClusterError(f"no kubeconfig at {PATHS.kubeconfig}; run ensure_cluster() first")
    # kubernetes ships no type hints for this; pin the return type here.
    new_client = cast(Callable[..., "ApiClient"], k8s_config.new_client_from_config)
    return new_client(config_file=str(PATHS.kubeconfig))


# --------------------------------------------------------------------------- status


def server_version() -> str | None:
    proc = kubectl("version", "-o", "json", check=False, timeout=10)
    if proc.returncode != 0:
        return None
    data: dict[str, Any] = json.loads(proc.stdout)
    server = data.get("serverVersion") or {}
    version = server.get("gitVersion")
    return str(version) if version else None


def running_kueue_version() -> str | None:
    """gitVersion the running Kueue manager logged at startup."""
    version = None
    try:
        with open(PATHS.kueue_log, errors="replace") as fh:
            for line in fh:
                if '"msg":"Initializing"' in line:
                    with contextlib.suppress(ValueError):
                        version = json.loads(line).get("gitVersion", version)
    except OSError:
        return None
    return version


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


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kestrel.cluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="build if needed, start, wait until ready (idempotent)")
    sub.add_parser("down", help="stop Kueue and delete the cluster")
    sub.add_parser("status", help="versions, processes, nodes, queues")
    b = sub.add_parser("build", help="build missing binaries (cluster/build.sh)")
    b.add_argument("components", nargs="*")
    sub.add_parser("env", help="print KUBECONFIG=... for eval")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cluster/status | head` exits quietly

    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        if args.cmd == "up":
            info = up(say)
            say(f"kubeconfig: {info.kubeconfig}")
            say(f"logs:       {info.log_dir} (kueue.log), {info.kwok_log_dir} (control plane)")
            kubectl_bin = binary_paths()["kubectl"]
            say(f"try:        KUBECONFIG={info.kubeconfig} {kubectl_bin} get cq,lq,workloads -A")
        elif args.cmd == "down":
            down(say)
        elif args.cmd == "status":
            return 0 if status(say) else 1
        elif args.cmd == "build":
            build(say, args.components)
        elif args.cmd == "env":
            say(f"export KUBECONFIG={PATHS.kubeconfig}")
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
