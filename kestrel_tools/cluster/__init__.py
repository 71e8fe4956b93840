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
  ``pod-complete.stage.kwok.x-k8s.io/delay`` annotation, then Succeeds;
* a REAL CPU pool: one kubelet with containerd, running images built here.

The apiserver, scheduler, controllers and Kueue quota are real; only the GPU nodes and
what runs on them are simulated.

The package, by concern. This module names their public parts lazily (PEP 562), so
``from kestrel_tools import cluster as kc; kc.up()`` reads as before and loads only the
modules a caller touches: a production service that reads ``kc.PATHS`` loads
``paths`` alone.

=====================  ==============================================================
``paths``              versions, cached binaries, state directories, ports, names
``processes``          commands, kubectl, waiting, pid files, the up/down lock
``build``              building the pinned binaries (cluster/build.sh), cached
``health``             whether each process is alive and each part answers
``node``               the CPU pool: containerd, CNI, kubelet, images
``kueue``              Kueue's configuration, certificates, CRDs, process
``dataplane``          up, repair, down, an apiserver replica, the API client
``status``             what ``cluster/status`` prints
``__main__``           ``python -m kestrel_tools.cluster up|down|status|build|env``
=====================  ==============================================================

Use from Python::

    info = ensure_cluster()          # builds if needed, starts if not up, waits ready
    client = api_client()            # kubernetes.client.ApiClient for info.kubeconfig

Only the standard library is imported at import time; ``kubernetes`` is imported by
:func:`api_client` alone, so ``cluster/up`` works before the project venv. Job and
Workload manifests and reads of what ran are in ``kestrel_tools.kubework``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kestrel.workloads import CPU_FLAVOR, GPU_FLAVORS
    from kestrel_tools.cluster.build import (
        ensure_binaries,
        missing_binaries,
    )
    from kestrel_tools.cluster.dataplane import (
        api_client,
        apiserver_replica_pid,
        cluster_down,
        down,
        ensure_cluster,
        is_up,
        restart_dead,
        restart_kueue,
        start_apiserver_replica,
        stop_apiserver_replica,
        up,
    )
    from kestrel_tools.cluster.health import (
        CONTROL_PLANE_COMPONENTS,
        ProcessHealth,
        apiserver_ready,
        containerd_pid,
        control_plane_alive,
        data_plane_rss_mib,
        kubelet_pid,
        kueue_pid,
        kueue_ready,
        kwok_cluster_exists,
        process_health,
    )
    from kestrel_tools.cluster.kueue import (
        running_kueue_version,
    )
    from kestrel_tools.cluster.node import (
        _stop_cpu_node,
        build_images,
        cpu_node_ready,
        kestrel_image,
        node_images,
        node_ip,
        node_leftovers,
        node_tools_missing,
    )
    from kestrel_tools.cluster.paths import (
        APISERVER_PORT,
        BIN_DIR,
        CACHE_DIR,
        CGROUP_ROOT,
        CLUSTER_NAME,
        CLUSTER_SRC,
        CNI_BIN_DIR,
        CNI_BRIDGE,
        CPU_NODE_ENABLED,
        CPU_NODE_LABELS,
        CPU_NODE_SELECTOR,
        DEFAULT_TIMEOUT_S,
        EXAMPLE_CLUSTER_QUEUE,
        IMAGES_SRC,
        KUBE_BINARIES,
        KUBELET_HEALTHZ_PORT,
        KUBELET_PORT,
        KUEUE_HEALTH_PORT,
        KUEUE_METRICS_CERT_PATH,
        KUEUE_METRICS_PORT,
        KUEUE_WEBHOOK_PORT,
        LAYOUT,
        MANIFESTS,
        NODE,
        NODE_APT_PACKAGES,
        NODE_NAME,
        PATHS,
        POD_CIDR,
        REPO_ROOT,
        SIMULATED_NODE_SELECTOR,
        STATE_DIR,
        ClusterError,
        ClusterInfo,
        NodePaths,
        Paths,
        Progress,
        binary_paths,
        cluster_info,
        kueue_crd_dir,
        read_versions,
    )
    from kestrel_tools.cluster.processes import (
        _state_lock,
        kubectl,
        wait_until,
    )
    from kestrel_tools.cluster.status import (
        server_version,
    )

# Where each name lives: its module under kestrel_tools.cluster (or a full module path).
_WHERE = {
    "APISERVER_PORT": "paths",
    "BIN_DIR": "paths",
    "CACHE_DIR": "paths",
    "CGROUP_ROOT": "paths",
    "CLUSTER_NAME": "paths",
    "CLUSTER_SRC": "paths",
    "CNI_BIN_DIR": "paths",
    "CNI_BRIDGE": "paths",
    "CONTROL_PLANE_COMPONENTS": "health",
    "CPU_FLAVOR": "kestrel.workloads",
    "CPU_NODE_ENABLED": "paths",
    "CPU_NODE_LABELS": "paths",
    "CPU_NODE_SELECTOR": "paths",
    "ClusterError": "paths",
    "ClusterInfo": "paths",
    "DEFAULT_TIMEOUT_S": "paths",
    "EXAMPLE_CLUSTER_QUEUE": "paths",
    "GPU_FLAVORS": "kestrel.workloads",
    "IMAGES_SRC": "paths",
    "KUBELET_HEALTHZ_PORT": "paths",
    "KUBELET_PORT": "paths",
    "KUBE_BINARIES": "paths",
    "KUEUE_HEALTH_PORT": "paths",
    "KUEUE_METRICS_CERT_PATH": "paths",
    "KUEUE_METRICS_PORT": "paths",
    "KUEUE_WEBHOOK_PORT": "paths",
    "LAYOUT": "paths",
    "MANIFESTS": "paths",
    "NODE": "paths",
    "NODE_APT_PACKAGES": "paths",
    "NODE_NAME": "paths",
    "NodePaths": "paths",
    "PATHS": "paths",
    "POD_CIDR": "paths",
    "Paths": "paths",
    "ProcessHealth": "health",
    "Progress": "paths",
    "REPO_ROOT": "paths",
    "SIMULATED_NODE_SELECTOR": "paths",
    "STATE_DIR": "paths",
    "_state_lock": "processes",
    "_stop_cpu_node": "node",
    "api_client": "dataplane",
    "apiserver_ready": "health",
    "apiserver_replica_pid": "dataplane",
    "binary_paths": "paths",
    "build_images": "node",
    "cluster_down": "dataplane",
    "cluster_info": "paths",
    "containerd_pid": "health",
    "control_plane_alive": "health",
    "cpu_node_ready": "node",
    "data_plane_rss_mib": "health",
    "down": "dataplane",
    "ensure_binaries": "build",
    "ensure_cluster": "dataplane",
    "is_up": "dataplane",
    "kestrel_image": "node",
    "kubectl": "processes",
    "kubelet_pid": "health",
    "kueue_crd_dir": "paths",
    "kueue_pid": "health",
    "kueue_ready": "health",
    "kwok_cluster_exists": "health",
    "missing_binaries": "build",
    "node_images": "node",
    "node_ip": "node",
    "node_leftovers": "node",
    "node_tools_missing": "node",
    "process_health": "health",
    "read_versions": "paths",
    "restart_dead": "dataplane",
    "restart_kueue": "dataplane",
    "running_kueue_version": "kueue",
    "server_version": "status",
    "start_apiserver_replica": "dataplane",
    "stop_apiserver_replica": "dataplane",
    "up": "dataplane",
    "wait_until": "processes",
}
__all__ = [  # noqa: RUF022 (the order of _WHERE)
    "APISERVER_PORT",
    "BIN_DIR",
    "CACHE_DIR",
    "CGROUP_ROOT",
    "CLUSTER_NAME",
    "CLUSTER_SRC",
    "CNI_BIN_DIR",
    "CNI_BRIDGE",
    "CONTROL_PLANE_COMPONENTS",
    "CPU_FLAVOR",
    "CPU_NODE_ENABLED",
    "CPU_NODE_LABELS",
    "CPU_NODE_SELECTOR",
    "ClusterError",
    "ClusterInfo",
    "DEFAULT_TIMEOUT_S",
    "EXAMPLE_CLUSTER_QUEUE",
    "GPU_FLAVORS",
    "IMAGES_SRC",
    "KUBELET_HEALTHZ_PORT",
    "KUBELET_PORT",
    "KUBE_BINARIES",
    "KUEUE_HEALTH_PORT",
    "KUEUE_METRICS_CERT_PATH",
    "KUEUE_METRICS_PORT",
    "KUEUE_WEBHOOK_PORT",
    "LAYOUT",
    "MANIFESTS",
    "NODE",
    "NODE_APT_PACKAGES",
    "NODE_NAME",
    "NodePaths",
    "PATHS",
    "POD_CIDR",
    "Paths",
    "ProcessHealth",
    "Progress",
    "REPO_ROOT",
    "SIMULATED_NODE_SELECTOR",
    "STATE_DIR",
    "_state_lock",
    "_stop_cpu_node",
    "api_client",
    "apiserver_ready",
    "apiserver_replica_pid",
    "binary_paths",
    "build",
    "build_images",
    "cluster_down",
    "cluster_info",
    "containerd_pid",
    "control_plane_alive",
    "cpu_node_ready",
    "data_plane_rss_mib",
    "down",
    "ensure_binaries",
    "ensure_cluster",
    "is_up",
    "kestrel_image",
    "kubectl",
    "kubelet_pid",
    "kueue_crd_dir",
    "kueue_pid",
    "kueue_ready",
    "kwok_cluster_exists",
    "missing_binaries",
    "node_images",
    "node_ip",
    "node_leftovers",
    "node_tools_missing",
    "process_health",
    "read_versions",
    "restart_dead",
    "restart_kueue",
    "running_kueue_version",
    "server_version",
    "start_apiserver_replica",
    "stop_apiserver_replica",
    "up",
    "wait_until",
]


# Two names here are also the names of submodules, and importing a submodule sets the
# package's attribute of that name to the module: once any code had imported
# kestrel_tools.cluster.build (the plane does), `kc.build` was that module and never reached
# __getattr__, so building helm or compose on demand failed with "'module' object is
# not callable" on a machine without them cached. `build` is bound here, eagerly (its
# module needs only the standard library); `status` is not exported (import it from
# kestrel_tools.cluster.status). A unit test holds every exported name to its object.
from kestrel_tools.cluster.build import build  # noqa: E402


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kestrel_tools.cluster' has no attribute {name!r}")
    path = module if "." in module else f"kestrel_tools.cluster.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
