"""What a tenant's work is made of in Kubernetes, and what Kubernetes records of it.

Shared by the services, the e2e tests, bench/cluster_check.py and the demo: the objects
a tenant submits to Kueue (a GPU Job for the simulated pool, a CPU Job for the real
kubelet node, a tenant's ClusterQueue and LocalQueue), Kueue's verdict read back
(Workload conditions), and the GPU-seconds Kubernetes itself recorded per Job (what the
ledger must equal). Split from kestrel_tools.cluster, which brings the cluster up and down.

Like kestrel_tools.cluster, this module imports only the standard library at import time;
functions that talk to the apiserver take a kubernetes ApiClient or make one with
kestrel_tools.cluster.api_client(), and import kubernetes lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from kestrel.workloads import (
    CPU_FLAVOR,
    KUEUE_API_VERSION,
    KUEUE_GROUP,
    KWOK_DURATION_ANNOTATION,
    QUEUE_NAME_LABEL,
    condition,
    condition_true,
)
from kestrel_tools.cluster.dataplane import api_client
from kestrel_tools.cluster.node import kestrel_image
from kestrel_tools.cluster.paths import NODE_NAME, ClusterError
from kestrel_tools.cluster.processes import wait_until

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = [  # with what it re-exports from kestrel.workloads for its callers
    "KUEUE_API_VERSION", "KUEUE_GROUP", "KWOK_DURATION_ANNOTATION", "MODEL_ONNX_SHA256",
    "QUEUE_NAME_LABEL", "CpuJobRun", "condition", "condition_true", "cpu_job_manifest",
    "create_tenant_queue", "delete_tenant_queue", "delete_tenant_queues",
    "gpu_job_manifest", "gpu_seconds_by_job", "gpu_seconds_range_by_job", "k8s_time_s",
    "run_cpu_job", "tenant_queue_manifests", "workloads_by_job_uid",
]



def gpu_job_manifest(
    name: str,
    namespace: str,
    queue: str,
    *,
    gpus: int = 1,
    duration_s: int = 5,
    parallelism: int = 1,
    tolerate_all: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A batch/v1 Job for Kueue: created suspended with the queue-name label; each pod
    asks for ``gpus`` nvidia.com/gpu and (on a KWOK node) runs ``duration_s`` seconds."""
    resources = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "work",
                "image": "kestrel.dev/simulated-gpu-work:none",  # never pulled: KWOK pod
                "resources": {"requests": resources, "limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if tolerate_all:
        pod_spec["tolerations"] = [{"operator": "Exists"}]
    return _kueue_job(name, namespace, queue, labels, parallelism, {
        "metadata": {"annotations": {KWOK_DURATION_ANNOTATION: f"{duration_s}s"}},
        "spec": pod_spec})


def _kueue_job(name: str, namespace: str, queue: str, labels: dict[str, str] | None,
               parallelism: int, template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A batch/v1 Job in `queue`'s LocalQueue, created suspended for Kueue to admit."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {QUEUE_NAME_LABEL: queue, **(labels or {})}},
        "spec": {"suspend": True, "parallelism": parallelism, "completions": parallelism,
                 "backoffLimit": 0, **spec, "template": template},
    }


def cpu_job_manifest(
    name: str,
    namespace: str,
    queue: str,
    command: Sequence[str],
    *,
    image: str | None = None,
    cpu: str = "100m",
    memory: str = "128Mi",
    labels: dict[str, str] | None = None,
    active_deadline_s: int = 300,
) -> dict[str, Any]:
    """A batch/v1 Job for Kueue that runs ``command`` for real on the CPU pool (the real
    kubelet node), in the Kestrel image (default: the one the running node imported).
    It selects the ``cpu`` flavor's node label so Kueue never places it on a GPU flavor."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {"kestrel.dev/flavor": CPU_FLAVOR},
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "work",
                "image": image or kestrel_image(),
                "imagePullPolicy": "Never",  # imported into containerd, never pulled
                "command": list(command),
                "resources": {"requests": {"cpu": cpu, "memory": memory},
                              "limits": {"cpu": cpu, "memory": memory}},
            }
        ],
    }
    return _kueue_job(name, namespace, queue, labels, 1, {"spec": pod_spec},
                      activeDeadlineSeconds=active_deadline_s)


MODEL_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


@dataclasses.dataclass(frozen=True)
class CpuJobRun:
    """What a Job on the real CPU node did, as Kubernetes and its kubelet report it."""

    job: str
    admitted: bool  # Kueue admitted its Workload (on flavor ``flavor``)
    flavor: str
    pod: str
    pod_uid: str
    node: str
    container_id: str  # without the runtime prefix
    exit_code: int | None
    log: str
    started_at: datetime.datetime | None  # the container's own start and finish
    finished_at: datetime.datetime | None

    @property
    def run_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


def run_cpu_job(
    client: ApiClient,
    namespace: str,
    queue: str,
    name: str,
    command: Sequence[str],
    timeout_s: float = 180,
    **manifest_kw: Any,
) -> CpuJobRun:
    """Submit :func:`cpu_job_manifest` through Kueue, wait for its pod to end, and read
    back its exit code and log. The Job is left in place (its namespace owns it)."""
    from kubernetes import client as k8s

    batch: Any = k8s.BatchV1Api(client)
    core: Any = k8s.CoreV1Api(client)
    body: Any = cpu_job_manifest(name, namespace, queue, command, **manifest_kw)
    job = batch.create_namespaced_job(namespace, body)
    uid = job.metadata.uid
    pods: list[Any] = []

    def ended() -> bool:
        nonlocal pods
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
        return any(p.status.phase in ("Succeeded", "Failed") for p in pods)

    with contextlib.suppress(ClusterError):  # what happened is read back below
        wait_until(f"Job {namespace}/{name} to run on {NODE_NAME}", ended, timeout_s)
    wl = workloads_by_job_uid(client, namespace).get(uid) or {}
    admission = (wl.get("status") or {}).get("admission") or {}
    assignments = admission.get("podSetAssignments") or [{}]
    flavor = next(iter((assignments[0].get("flavors") or {}).values()), "")
    pod = next((p for p in pods if p.status.phase in ("Succeeded", "Failed")),
               pods[0] if pods else None)  # fmt: skip
    if pod is None:
        return CpuJobRun(name, condition_true(wl, "Admitted") or condition_true(wl, "Finished"),
                         flavor, "", "", "", "", None, "", None, None)  # fmt: skip
    state = None
    for cs in pod.status.container_statuses or []:
        state = cs.state.terminated if cs.state else None
    log = ""
    with contextlib.suppress(Exception):
        log = core.read_namespaced_pod_log(pod.metadata.name, namespace)
    return CpuJobRun(
        job=name,
        admitted=bool(admission),
        flavor=flavor,
        pod=pod.metadata.name,
        pod_uid=pod.metadata.uid,
        node=pod.spec.node_name or "",
        container_id=(state.container_id or "").split("://")[-1] if state else "",
        exit_code=state.exit_code if state else None,
        log=log,
        started_at=state.started_at if state else None,
        finished_at=state.finished_at if state else None,
    )


def tenant_queue_manifests(
    name: str,
    *,
    gpu_quota: dict[str, int],
    cohort: str | None = None,
    cpu_per_gpu: int = 4,
    memory_gib_per_gpu: int = 32,
    local_queue: str = "gpu",
    cpu_quota: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Namespace ``name`` + ClusterQueue ``name`` (quota per GPU flavor, in flavor order,
    then the ``cpu`` flavor of the real node when ``cpu_quota`` gives its cpu and memory)
    + LocalQueue ``local_queue`` in that namespace."""
    flavors = [
        {
            "name": flavor,
            "resources": [
                {"name": "cpu", "nominalQuota": str(gpus * cpu_per_gpu)},
                {"name": "memory", "nominalQuota": f"{gpus * memory_gib_per_gpu}Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
            ],
        }
        for flavor, gpus in gpu_quota.items()
    ]
    if cpu_quota is not None:
        flavors.append(
            {
                "name": CPU_FLAVOR,
                "resources": [
                    {"name": "cpu", "nominalQuota": cpu_quota.get("cpu", "2")},
                    {"name": "memory", "nominalQuota": cpu_quota.get("memory", "4Gi")},
                    {"name": "nvidia.com/gpu", "nominalQuota": "0"},
                ],
            }
        )
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kestrel.dev/tenant": name}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": flavors}
        ],
    }
    if cohort:
        cq_spec["cohortName"] = cohort
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kestrel.dev/tenant": name}},
        },
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_API_VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": cq_spec,
        },
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_API_VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": name},
            "spec": {"clusterQueue": name},
        },
    ]


def create_tenant_queue(client: ApiClient, manifests: list[dict[str, Any]]) -> None:
    """Create the objects from :func:`tenant_queue_manifests` and wait for the CQ Active."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(client)
    custom = k8s.CustomObjectsApi(client)
    ns, cq, lq = manifests
    ns_body: Any = ns  # the client accepts plain dicts for bodies
    core.create_namespace(ns_body)
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_API_VERSION, "clusterqueues", cq)
    custom.create_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_API_VERSION, lq["metadata"]["namespace"], "localqueues", lq
    )
    name = cq["metadata"]["name"]

    def active() -> bool:
        obj = custom.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, "clusterqueues", name
        )
        return condition_true(cast(dict[str, Any], obj), "Active")

    wait_until(f"ClusterQueue {name} Active", active, 60)


def delete_tenant_queue(client: ApiClient, name: str, timeout_s: float = 180) -> None:
    """Delete namespace ``name`` (its Jobs, pods, Workloads, LocalQueue) and the CQ."""
    delete_tenant_queues(client, [name], timeout_s)


def delete_tenant_queues(client: ApiClient, names: Sequence[str],
                         timeout_s: float = 180) -> None:
    """Delete namespaces ``names`` and their CQs: every deletion first, then one wait
    (the namespace controller empties them side by side: about 7 s each here when done
    one after another)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(client)
    custom = k8s.CustomObjectsApi(client)
    for name in names:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name, propagation_policy="Background")

    def gone(name: str) -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    for name in names:
        wait_until(f"namespace {name} deleted", functools.partial(gone, name), timeout_s)
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_API_VERSION,
                                                "clusterqueues", name)


def workloads_by_job_uid(client: ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Kueue Workloads in ``namespace`` keyed by the uid of the Job that owns them."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(client)
    listing = cast(
        dict[str, Any],
        custom.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, namespace, "workloads"
        ),
    )
    items: list[dict[str, Any]] = listing["items"]
    out: dict[str, dict[str, Any]] = {}
    for wl in items:
        for ref in wl["metadata"].get("ownerReferences", []) or []:
            if ref.get("kind") == "Job":
                out[ref["uid"]] = wl
    return out


def k8s_time_s(text: str) -> int:
    """A Kubernetes timestamp (RFC 3339, whole seconds) as seconds since the epoch."""
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def gpu_seconds_by_job(namespaces: Sequence[str]) -> dict[str, Decimal]:
    """gpus x (end - start) per Job, from its Workload's own condition timestamps:
    Kueue's Admitted to Finished. What the ledger must equal for finished jobs (an
    evicted Workload's Admitted condition turns False at the eviction, so its start
    must be read while it runs)."""
    return {job: low for job, (low, _) in gpu_seconds_range_by_job(namespaces).items()}


def gpu_seconds_range_by_job(namespaces: Sequence[str]) -> dict[str, tuple[Decimal, Decimal]]:
    """Per Job, (gpus x (Finished - Admitted), gpus x (Finished - the earlier of Admitted
    and the Job's own start)): the same figure twice but for one case. A Job that
    Kubernetes says started (status.startTime, set when Kueue unsuspends it, after
    admission) before its Workload's Admitted time was admitted earlier than that
    condition now says: Kueue rewrites lastTransitionTime when it retries an admission
    whose first write landed but whose answer was lost (an apiserver killed mid-request,
    bench/chaos.py). A placer that saw the first write metered from it, one that saw only
    the retry from the second; both are Kubernetes' own record."""
    from kubernetes import client as k8s

    api = api_client()
    custom: Any = k8s.CustomObjectsApi(api)
    batch: Any = k8s.BatchV1Api(api)
    out: dict[str, tuple[Decimal, Decimal]] = {}
    for ns in namespaces:
        items = custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_API_VERSION, ns,
                                                     "workloads")["items"]
        started = {j.metadata.name: j.status.start_time
                   for j in batch.list_namespaced_job(ns).items if j.status and j.metadata}
        for w in items:
            start = condition(w, "Admitted")
            end = condition(w, "Finished")
            if not start or start.get("status") != "True" or not end:
                continue
            gpus = sum(int(ps.get("count", 1))
                       * int(c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", 0))
                       for ps in w["spec"]["podSets"]
                       for c in ps["template"]["spec"]["containers"])
            owner = next((o["name"] for o in w["metadata"].get("ownerReferences", [])
                          if o.get("kind") == "Job"), None)
            if owner is not None:
                admitted = k8s_time_s(start["lastTransitionTime"])
                job_start = started.get(owner)
                earliest = min(admitted, int(job_start.timestamp())) if job_start else admitted
                finished = k8s_time_s(end["lastTransitionTime"])
                out[owner] = (Decimal(gpus * (finished - admitted)),
                              Decimal(gpus * (finished - earliest)))
    return out
