"""The Kubernetes objects the placer writes, built as plain dicts (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kestrel.workloads import (
    CPU_FLAVOR,
    CPU_POOL_CORES,
    ENDPOINT_LABEL,
    KWOK_DURATION_ANNOTATION,
    QUEUE_NAME_LABEL,
)
from services.placer.lifecycle import (
    FLAVOR_ANNOTATION,
    FLAVOR_NODE_LABEL,
    FLAVOR_REASON_ANNOTATION,
    GPU,
    JOB_ID_LABEL,
    NAMESPACE_PREFIX,
    TENANT_LABEL,
)

KUEUE = "kueue.x-k8s.io/v1beta2"
LOCAL_QUEUE = "gpu"
COHORT = "kestrel-gpu"
RUNWAY_CONTROLLER = "kestrel.dev/runway"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kestrel-placer"
# Per pod, besides its GPUs; the ClusterQueue's cpu/memory quota scales with GPUs.
POD_CPU, POD_MEMORY = "100m", "128Mi"
CPU_PER_GPU, MEMORY_GIB_PER_GPU = 4, 16
# The CPU pool: the real kubelet node kestrel-cpu-0 (cluster/README.md), Kueue flavor
# `cpu`. Every tenant's ClusterQueue gets this much of it by default (the node's own
# size on the 2-core development machines), tried after the GPU flavors and with no
# GPU quota, so GPU pods never take it and CPU pods (which select it) pass the same
# quota and runway check.
CPU_POOL_QUOTA: Mapping[str, str] = {"cpu": str(CPU_POOL_CORES), "memory": "4Gi"}


def namespace_of(tenant: str) -> str:
    return f"{NAMESPACE_PREFIX}{tenant}"


def cluster_queue_of(tenant: str) -> str:
    return f"{NAMESPACE_PREFIX}{tenant}"


def namespace(tenant: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace_of(tenant),
                         "labels": {TENANT_LABEL: tenant, MANAGED_BY_LABEL: MANAGED_BY}}}


def local_queue(tenant: str) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace_of(tenant),
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {"clusterQueue": cluster_queue_of(tenant)}}


def cluster_queue(tenant: str, quota: Mapping[str, int], flavors: Sequence[str],
                  check: str, suspended: bool = False,
                  borrow: Mapping[str, int] | None = None,
                  cpu_pool: Mapping[str, str] | None = CPU_POOL_QUOTA) -> dict[str, Any]:
    """ClusterQueue `kestrel-<tenant>` in the cohort: GPU quota per flavor (0 where the
    tenant has none), the runway AdmissionCheck when `check` is not empty, and Hold
    when the tenant is suspended.

    The quota is a cap: every resource gets borrowingLimit 0 unless the operator let
    the tenant borrow on that flavor (`borrow`, GPUs beyond its quota, taken from the
    cohort's unused quota). Without a borrowingLimit Kueue lets a ClusterQueue of a
    cohort borrow everything the others leave unused.

    `cpu_pool` (cpu and memory) is the tenant's quota on the CPU pool's flavor `cpu`,
    last in the same resource group (Kueue covers each resource in one group only),
    with GPU quota 0; None leaves the flavor out."""
    groups = []
    for flavor in flavors:
        gpus = max(int(quota.get(flavor, 0)), 0)
        extra = max(int((borrow or {}).get(flavor, 0)), 0)
        groups.append({"name": flavor, "resources": [
            {"name": "cpu", "nominalQuota": str(gpus * CPU_PER_GPU),
             "borrowingLimit": str(extra * CPU_PER_GPU)},
            {"name": "memory", "nominalQuota": f"{gpus * MEMORY_GIB_PER_GPU}Gi",
             "borrowingLimit": f"{extra * MEMORY_GIB_PER_GPU}Gi"},
            {"name": GPU, "nominalQuota": str(gpus), "borrowingLimit": str(extra)},
        ]})
    if cpu_pool is not None:
        groups.append({"name": CPU_FLAVOR, "resources": [
            {"name": "cpu", "nominalQuota": cpu_pool.get("cpu", "0"), "borrowingLimit": "0"},
            {"name": "memory", "nominalQuota": cpu_pool.get("memory", "0"),
             "borrowingLimit": "0Gi"},
            {"name": GPU, "nominalQuota": "0", "borrowingLimit": "0"},
        ]})
    spec: dict[str, Any] = {
        "cohortName": COHORT,
        "namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": groups}],
        "stopPolicy": "Hold" if suspended else "None",
        # v1beta2 spells v1beta1's `admissionChecks: [name]` this way.
        "admissionChecksStrategy": ({"admissionChecks": [{"name": check}]} if check else None),
    }
    return {"apiVersion": KUEUE, "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue_of(tenant),
                         "labels": {TENANT_LABEL: tenant, MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": spec}


def admission_check(name: str) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "AdmissionCheck",
            "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {"controllerName": RUNWAY_CONTROLLER}}


@dataclass(frozen=True)
class Worker:
    """An endpoint replica: the model worker serving `endpoint_id` from Redis."""

    endpoint_id: str
    image: str
    redis_url: str


# How long KWOK keeps a simulated GPU replica's pod Running: ten years, i.e. until the
# replica is deleted (a Go duration, well inside its int64 nanoseconds).
REPLICA_RUN = "87600h"
# What a worker pod asks for besides its cores (the model and onnxruntime's arenas).
WORKER_MEMORY = "1Gi"


@dataclass(frozen=True)
class JobPlan:
    """Everything the Job of one admitted Kestrel job is built from."""

    job_id: str
    tenant: str
    name: str
    gpus: int
    max_duration_s: int
    sim_duration_s: int
    flavor: str
    flavor_reason: str
    labels: Mapping[str, str]
    worker: Worker | None = None


def _label_ok(key: str, value: str) -> bool:
    return (not key.startswith(("kestrel.dev/", "kueue.x-k8s.io/")) and len(value) <= 63
            and all(c.isalnum() or c in "-_." for c in value))


def simulated_run(max_duration_s: int, sim_duration_s: int) -> str:
    """How long the KWOK pod of a job runs (its pod-complete delay, a Go duration).

    A declared simulated duration runs as declared (longer than the bound, it meets
    the Job's activeDeadlineSeconds and FAILS, as a real job would). Without one the
    job finishes successfully inside its bound: 10% short of max_duration_s, at
    least 3 s and at most 60 s short, never under half of it. The deadline counts
    from the Job's start (Kueue unsuspends it), the run from the pod's start on its
    KWOK node, a second or two later on this machine: running the whole bound would
    race the deadline and end FAILED by design."""
    if sim_duration_s > 0:
        return f"{sim_duration_s}s"
    bound_ms = max_duration_s * 1000
    short_ms = min(max(bound_ms // 10, 3_000), 60_000, bound_ms // 2)
    return f"{bound_ms - short_ms}ms"


def job(plan: JobPlan) -> dict[str, Any]:
    """A suspended batch/v1 Job for Kueue: hard deadline max_duration_s, one pod on the
    chosen flavor's nodes for sim_duration_s (KWOK), never retried."""
    own = {JOB_ID_LABEL: plan.job_id, TENANT_LABEL: plan.tenant}
    extra = {k: v for k, v in plan.labels.items() if _label_ok(k, v)}
    labels = {**extra, **own, QUEUE_NAME_LABEL: LOCAL_QUEUE, MANAGED_BY_LABEL: MANAGED_BY}
    annotations = {FLAVOR_ANNOTATION: plan.flavor,
                   FLAVOR_REASON_ANNOTATION: plan.flavor_reason}
    if plan.name:
        annotations["kestrel.dev/name"] = plan.name
    if plan.worker is not None:
        labels[ENDPOINT_LABEL] = plan.worker.endpoint_id
        own = {**own, ENDPOINT_LABEL: plan.worker.endpoint_id}
        if plan.flavor == CPU_FLAVOR:
            return _cpu_replica(plan, plan.worker, labels, annotations, {**extra, **own})
    gpus = str(plan.gpus)
    # No tolerations: the GPU flavors' ResourceFlavors carry the KWOK nodes' taints'
    # tolerations (cluster/manifests/kueue-queues.yaml) and Kueue adds them to the pod
    # when it admits the Job on one, as it adds the flavor's node labels. Written here
    # too, they were copied into the Workload's pod set and managed fields: a plane
    # Workload was 5,923 bytes of JSON with them and is 5,736 without, on each of its
    # about 7 writes and 38 watch events per job.
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "work",
            "image": "kestrel.dev/simulated-gpu-work:none",  # never pulled: a KWOK pod
            "resources": {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY, GPU: gpus},
                          "limits": {GPU: gpus}},
        }],
    }
    if plan.flavor:
        pod_spec["nodeSelector"] = {FLAVOR_NODE_LABEL: plan.flavor}
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": plan.job_id, "namespace": namespace_of(plan.tenant),
                     "labels": labels, "annotations": annotations},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "activeDeadlineSeconds": plan.max_duration_s,
            "template": {
                "metadata": {"labels": {**extra, **own},
                             "annotations": {KWOK_DURATION_ANNOTATION: simulated_run(
                                 plan.max_duration_s, plan.sim_duration_s)}},
                "spec": pod_spec,
            },
        },
    }
    if plan.worker is not None:  # a simulated GPU replica: runs until it is deleted
        del body["spec"]["activeDeadlineSeconds"]
        # KWOK's pod-complete stage ends every Job's pod after this delay, 1 s when the
        # annotation is absent (cluster/manifests/kwok-stages.yaml): a replica's is
        # longer than any endpoint lives.
        body["spec"]["template"]["metadata"]["annotations"][KWOK_DURATION_ANNOTATION] = \
            REPLICA_RUN
    return body


def _cpu_replica(plan: JobPlan, worker: Worker, labels: Mapping[str, str],
                 annotations: Mapping[str, str], pod_labels: Mapping[str, str]
                 ) -> dict[str, Any]:
    """A suspended Job whose one pod runs the model worker for real on the CPU pool
    (the real kubelet node): `plan.gpus` whole cores, no deadline (an endpoint replica
    runs until the endpoint shrinks or its budget is spent), never retried.

    It shares the node's network: the plane's Redis listens on loopback, as every
    Kestrel service does by default; in a cluster with a Redis Service the pod would
    use the pod network instead."""
    cores = str(plan.gpus)
    env = {"KESTREL_WORKER_ENDPOINT": worker.endpoint_id, "KESTREL_WORKER_TENANT": plan.tenant,
           "KESTREL_WORKER_REPLICA": plan.job_id, "KESTREL_REDIS_URL": worker.redis_url,
           "KESTREL_WORKER_THREADS": cores,
           # host network: ports chosen by the kernel, so replicas never collide
           "KESTREL_WORKER_PORT": "0", "KESTREL_WORKER_METRICS_PORT": "0"}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "nodeSelector": {FLAVOR_NODE_LABEL: CPU_FLAVOR},
        "containers": [{
            "name": "worker",
            "image": worker.image,
            "imagePullPolicy": "Never",  # imported into containerd by images/build.sh
            "command": ["kestrel-worker"],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"requests": {"cpu": cores, "memory": WORKER_MEMORY},
                          "limits": {"cpu": cores, "memory": WORKER_MEMORY}},
        }],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": plan.job_id, "namespace": namespace_of(plan.tenant),
                     "labels": dict(labels), "annotations": dict(annotations)},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod_spec},
        },
    }
