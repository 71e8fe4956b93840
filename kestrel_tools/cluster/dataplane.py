"""Bringing the whole data plane up, repairing it and taking it down: the control
plane (kwokctl), its restart after a crash, a second apiserver replica, Kueue, the
simulated GPU nodes and queues, the CPU node; and the Kubernetes client for it."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kestrel_tools.cluster.build import ensure_binaries
from kestrel_tools.cluster.health import (
    CONTROL_PLANE_COMPONENTS,
    _cluster_queue_active,
    _gpu_nodes_ready,
    _kueue_ready_or_dead,
    apiserver_ready,
    control_plane_alive,
    kueue_pid,
    kueue_ready,
    kwok_cluster_exists,
    process_health,
)
from kestrel_tools.cluster.kueue import (
    _apply_kueue_crds,
    _remove_kueue_metrics_cert_link,
    _start_kueue,
    _stop_kueue,
)
from kestrel_tools.cluster.node import _start_cpu_node, _stop_cpu_node, cpu_node_ready, node_ip
from kestrel_tools.cluster.paths import (
    APISERVER_PORT,
    CLUSTER_NAME,
    CPU_NODE_ENABLED,
    DEFAULT_TIMEOUT_S,
    EXAMPLE_CLUSTER_QUEUE,
    LAYOUT,
    MANIFESTS,
    PATHS,
    ClusterError,
    ClusterInfo,
    Progress,
    binary_paths,
    cluster_info,
    read_versions,
)
from kestrel_tools.cluster.processes import (
    _pid_dead,
    _run,
    _spawn,
    _state_lock,
    _stop_pid,
    _tail,
    kubectl,
    pid_alive,
    runs,
    wait_until,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


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
        import yaml
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


def restart_dead(progress: Progress = print) -> None:
    """What a supervisor does after a crash: start again whichever control-plane process
    or Kueue manager is dead, and nothing else (no apply, no image check: `up` does
    those). Raises ClusterError when a component cannot be brought back."""
    with _state_lock():
        if not control_plane_alive() and not _restart_dead_components(progress):
            raise ClusterError(f"control plane processes not running; see {PATHS.kwok_logs}")
        _start_kueue(progress)


def restart_kueue(progress: Progress = print, timeout_s: float = 60) -> None:
    """Stop the Kueue manager and start a new one, ready (its /readyz) on return.

    What a fresh manager drops is its event broadcaster's cache (client-go
    tools/events). Every 6 minutes that broadcaster writes the final count of each
    event series it holds that has been quiet for 6 minutes, one call after another
    under a lock that Kueue's own event recording waits on. A series whose namespace
    was deleted meanwhile costs a PATCH and a POST, both refused. After bench phases
    that each deleted a namespace of 1,000 Jobs, one such pass refused 4,500 events
    in 80 s, and Kueue admitted nothing for 61 s of it. bench-jobs restarts the
    manager before each phase, so no phase inherits an earlier one's series."""
    with _state_lock():
        _stop_kueue(progress)
        _start_kueue_ready(progress, timeout_s)


def _start_kueue_ready(progress: Progress, timeout_s: float) -> None:
    """Start the Kueue manager and wait for its /readyz; ClusterError if it exits."""
    _start_kueue(progress)
    wait_until("Kueue manager /readyz", _kueue_ready_or_dead, timeout_s, progress)
    if kueue_pid() is None:
        raise ClusterError(
            f"Kueue manager exited; see {PATHS.kueue_log}:\n{_tail(PATHS.kueue_log)}")


def _replica_pid_file() -> Path:
    return PATHS.kwok_cluster / "replica" / "kube-apiserver.pid"


def apiserver_replica_pid() -> int | None:
    """The running second kube-apiserver's pid (start_apiserver_replica), or None."""
    try:
        pid = int(_replica_pid_file().read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if runs(pid, "kube-apiserver") else None


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


def _objects_applied() -> None:
    kubectl("apply", "-f", str(MANIFESTS / "nodes.yaml"))
    kubectl("create", "namespace", "kueue-system", check=False)
    kubectl("apply", "-f", str(MANIFESTS / "kueue-queues.yaml"))


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
        _start_kueue_ready(progress, timeout_s)
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
        if pid is None or not runs(pid, comp.component):
            continue
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ClusterError):
            wait_until(f"{comp.component} to exit", functools.partial(_pid_dead, pid), 15)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        progress(f"  stopped leftover {comp.component} (pid {pid})")
    shutil.rmtree(PATHS.kwok_cluster, ignore_errors=True)
    PATHS.kubeconfig.unlink(missing_ok=True)
    (PATHS.state / "versions.json").unlink(missing_ok=True)
    _remove_kueue_metrics_cert_link()
    progress("cluster down")


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
