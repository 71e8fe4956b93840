"""End-to-end: the real data plane (kube-apiserver + Kueue + KWOK GPU pool).

Every test drives the genuine apiserver and Kueue started by kestrel_tools.cluster; only the
GPU nodes and their pods are simulated (KWOK). No assertion is about wall-clock speed:
waits are bounded only so a broken cluster fails instead of hanging.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, cast

import pytest

from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw

pytestmark = pytest.mark.e2e

WAIT_S = 180.0  # upper bound for any single wait; never asserted as a duration


@pytest.fixture(scope="module")
def tenant(api: Any) -> Iterator[str]:
    """A tenant namespace + ClusterQueue with exactly 8 H100 GPUs of quota, no cohort
    (so nothing can be borrowed) and LocalQueue ``gpu``."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    kw.create_tenant_queue(api, kw.tenant_queue_manifests(name, gpu_quota={"gpu-h100": 8}))
    yield name
    kw.delete_tenant_queue(api, name)


def _k8s() -> Any:
    from kubernetes import client

    return client


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll ``fn`` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def ts(value: str | datetime) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def submit(api: Any, namespace: str, name: str, **options: Any) -> Any:
    body = kw.gpu_job_manifest(name, namespace, "gpu", **options)
    return _k8s().BatchV1Api(api).create_namespaced_job(namespace, cast(Any, body))


def workload(api: Any, namespace: str, job_uid: str) -> dict[str, Any] | None:
    return kw.workloads_by_job_uid(api, namespace).get(job_uid)


def job_pods(api: Any, namespace: str, job_name: str) -> list[Any]:
    pods = (
        _k8s().CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"job-name={job_name}")
    )
    return list(pods.items)


def job_finished(api: Any, namespace: str, name: str) -> str | None:
    job = _k8s().BatchV1Api(api).read_namespaced_job_status(name, namespace)
    for cond in job.status.conditions or []:
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return str(cond.type)
    return None


def node(api: Any, name: str) -> Any:
    return _k8s().CoreV1Api(api).read_node(name)


def test_apiserver_answers_with_pinned_version(cluster_up: kc.ClusterInfo, api: Any) -> None:
    pinned = kc.read_versions()["KUBE_VERSION"]
    info = _k8s().VersionApi(api).get_code()
    assert info.git_version == pinned
    assert cluster_up.kubernetes_version == pinned
    # Kueue's API is served by this apiserver at the version we use (v1beta2).
    groups = _k8s().ApisApi(api).get_api_versions()
    kueue = [g for g in groups.groups if g.name == kw.KUEUE_GROUP]
    assert kueue, "kueue.x-k8s.io is not served"
    assert kw.KUEUE_API_VERSION in [v.version for v in kueue[0].versions]


def test_gpu_pool_is_two_flavors_of_kwok_nodes(api: Any) -> None:
    nodes = _k8s().CoreV1Api(api).list_node(label_selector="kestrel.dev/pool=gpu").items
    by_flavor: dict[str, int] = {}
    for n in nodes:
        assert n.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
        assert int(n.status.allocatable["nvidia.com/gpu"]) == 8
        ready = [c for c in n.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"
        flavor = n.metadata.labels["kestrel.dev/flavor"]
        by_flavor[flavor] = by_flavor.get(flavor, 0) + 1
    assert by_flavor == {"gpu-h100": 4, "gpu-a10": 4}


def test_gpu_job_admitted_placed_runs_for_duration_and_succeeds(api: Any, tenant: str) -> None:
    duration_s = 6
    job = submit(api, tenant, "fits", gpus=8, duration_s=duration_s)

    wl = wait_for(
        "workload admitted",
        lambda: (
            (w := workload(api, tenant, job.metadata.uid))
            and kw.condition_true(w, "Admitted")
            and w
        ),
    )
    admission = wl["status"]["admission"]
    assert admission["clusterQueue"] == tenant
    assignment = admission["podSetAssignments"][0]
    assert assignment["flavors"]["nvidia.com/gpu"] == "gpu-h100"
    assert assignment["resourceUsage"]["nvidia.com/gpu"] == "8"

    assert wait_for("job finished", lambda: job_finished(api, tenant, "fits")) == "Complete"
    pods = job_pods(api, tenant, "fits")
    assert len(pods) == 1
    pod = pods[0]
    assert pod.status.phase == "Succeeded"
    n = node(api, pod.spec.node_name)
    assert n.metadata.labels["kestrel.dev/flavor"] == "gpu-h100"
    assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    # The pod ran (Running, then terminated) for at least the declared duration.
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.exit_code == 0
    ran_for = (ts(terminated.finished_at) - ts(terminated.started_at)).total_seconds()
    assert ran_for >= duration_s, f"pod ran {ran_for}s, declared {duration_s}s"

    done = wait_for(
        "workload finished",
        lambda: (
            (w := workload(api, tenant, job.metadata.uid))
            and kw.condition_true(w, "Finished")
            and w
        ),
    )
    assert kw.condition_true(done, "Admitted") or kw.condition(done, "Admitted") is not None


def test_job_over_quota_is_held_until_first_finishes(api: Any, tenant: str) -> None:
    # 20s: ample time for Kueue to evaluate "second" while "first" still runs.
    first = submit(api, tenant, "first", gpus=8, duration_s=20)
    wait_for(
        "first admitted",
        lambda: (
            (w := workload(api, tenant, first.metadata.uid)) and kw.condition_true(w, "Admitted")
        ),
    )
    second = submit(api, tenant, "second", gpus=8, duration_s=1)

    # Kueue must have looked at the second workload and refused to reserve quota.
    held = wait_for(
        "second evaluated and held",
        lambda: (
            (w := workload(api, tenant, second.metadata.uid))
            and (c := kw.condition(w, "QuotaReserved")) is not None
            and c["status"] == "False"
            and w
        ),
    )
    assert "admission" not in held.get("status", {})

    # While the first job has not finished, the second never gets quota or pods.
    observations_while_first_running = 0
    while not job_finished(api, tenant, "first"):
        w = workload(api, tenant, second.metadata.uid)
        assert w is not None
        assert not kw.condition_true(w, "QuotaReserved"), "second got quota while first ran"
        assert not job_pods(api, tenant, "second"), "second has pods while first ran"
        observations_while_first_running += 1
        time.sleep(0.5)
    assert observations_while_first_running > 0

    first_wl = wait_for(
        "first workload finished",
        lambda: (
            (w := workload(api, tenant, first.metadata.uid))
            and kw.condition_true(w, "Finished")
            and w
        ),
    )
    first_finished_at = ts(
        cast(dict[str, Any], kw.condition(first_wl, "Finished"))["lastTransitionTime"]
    )

    second_wl = wait_for(
        "second admitted after first finished",
        lambda: (
            (w := workload(api, tenant, second.metadata.uid))
            and kw.condition_true(w, "Admitted")
            and w
        ),
    )
    reserved = kw.condition(second_wl, "QuotaReserved")
    assert reserved is not None
    assert ts(reserved["lastTransitionTime"]) >= first_finished_at
    assert wait_for("second finished", lambda: job_finished(api, tenant, "second")) == "Complete"


def test_gpu_job_never_lands_on_non_gpu_node(api: Any, tenant: str) -> None:
    core = _k8s().CoreV1Api(api)
    # Control: the simulated non-GPU node is schedulable for a pod that tolerates it.
    control = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cpu-control", "namespace": tenant},
        "spec": {
            "nodeSelector": {"kestrel.dev/pool": "cpu-sim"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "none", "resources": {"requests": {"cpu": "1"}}}],
        },
    }
    core.create_namespaced_pod(tenant, cast(Any, control))
    placed = wait_for(
        "control pod scheduled",
        lambda: core.read_namespaced_pod("cpu-control", tenant).spec.node_name,
    )
    assert placed == "kwok-cpu-sim-0"

    # GPU job whose pods tolerate every taint: only GPU capacity may host them.
    submit(api, tenant, "anywhere", gpus=2, duration_s=3, parallelism=4, tolerate_all=True)
    assert wait_for("gpu job finished", lambda: job_finished(api, tenant, "anywhere")) == "Complete"
    pods = job_pods(api, tenant, "anywhere")
    assert len(pods) == 4
    for pod in pods:
        n = node(api, pod.spec.node_name)
        assert n.metadata.labels.get("kestrel.dev/pool") == "gpu", pod.spec.node_name
        assert int(n.status.allocatable.get("nvidia.com/gpu", "0")) > 0
        assert n.metadata.labels["kestrel.dev/flavor"] == "gpu-h100"
    # And across the whole cluster: no pod asking for a GPU is bound to a non-GPU node.
    gpu_nodes = {
        n.metadata.name for n in core.list_node(label_selector="kestrel.dev/pool=gpu").items
    }
    for pod in core.list_pod_for_all_namespaces().items:
        wants_gpu = any(
            ((c.resources and c.resources.requests) or {}).get("nvidia.com/gpu")
            for c in pod.spec.containers
        )
        if wants_gpu and pod.spec.node_name:
            assert pod.spec.node_name in gpu_nodes, pod.metadata.name


def _readyz(seen: list[str]) -> bool:
    """/readyz on a new connection (each kubectl is one, spread by SO_REUSEPORT over the
    apiservers sharing the port); what a refusal said is kept in `seen`."""
    got = kc.kubectl("get", "--raw", "/readyz?verbose", "--request-timeout=5s",
                     check=False, timeout=15)
    if got.returncode == 0 and "readyz check passed" in got.stdout:
        return True
    seen.append(f"rc={got.returncode} {(got.stdout + got.stderr).strip()[-600:]}")
    return False


def _kill_the_first_apiserver(timeout_s: float) -> str | None:
    """Start the replica, kill -9 the kwok-managed apiserver and wait for new connections
    to be answered by the replica alone; then restore the cluster (the first one back,
    the replica stopped). None when the replica answered, else why not."""
    seen: list[str] = []
    kc.start_apiserver_replica(lambda s: None)
    try:
        primary = next(p.pid for p in kc.process_health() if p.component == "kube-apiserver")
        assert primary is not None and primary != kc.apiserver_replica_pid()
        os.kill(primary, signal.SIGKILL)
        wait_for("the killed apiserver to exit", lambda: not kc.control_plane_alive())
        deadline = time.monotonic() + timeout_s
        while not _readyz(seen):
            if time.monotonic() > deadline:
                log = kc.PATHS.kwok_logs / "kube-apiserver-replica.log"
                tail = log.read_text(errors="replace").splitlines()[-30:] \
                    if log.exists() else []
                return (f"not answered in {timeout_s:.0f} s; replica pid "
                        f"{kc.apiserver_replica_pid()}; last answers:\n"
                        + "\n".join(seen[-3:]) + f"\n{log} ends:\n" + "\n".join(tail))
            time.sleep(0.5)
        if not all(_readyz(seen) for _ in range(5)):
            return "answered once, then refused:\n" + "\n".join(seen[-3:])
        assert not kc.control_plane_alive()  # answered by the replica alone
        return None
    finally:
        kc.restart_dead(lambda s: None)
        kc.stop_apiserver_replica(lambda s: None)
        assert kc.apiserver_replica_pid() is None
        assert wait_for("the restarted apiserver to be ready", kc.apiserver_ready)


def test_a_second_apiserver_answers_while_the_first_is_dead(cluster_up: kc.ClusterInfo) -> None:
    """An HA control plane (start_apiserver_replica): after kill -9 of the kwok-managed
    kube-apiserver every new connection to the cluster's one address is answered by the
    replica sharing it (a lone apiserver refuses them until it is back).

    Run alone or in the suite here the replica answers within half a second of the kill
    (also with both cores busy and the disk flushing). Twice, on a fresh machine's CI
    run (the cluster built from source minutes before), it had not answered after 30 s
    and after 90 s, and the cause was not kept. So a first miss is reported (a pytest
    warning) with what the replica said and its log, and the scenario runs once more
    from a restored cluster: the test fails when the replica misses twice."""
    first = _kill_the_first_apiserver(timeout_s=60)
    if first is None:
        return
    warnings.warn(f"the apiserver replica missed once, trying again:\n{first}", stacklevel=1)
    second = _kill_the_first_apiserver(timeout_s=60)
    assert second is None, f"first try: {first}\nsecond try: {second}"


def test_a_restarted_kueue_is_a_new_manager_that_admits_against_the_same_quota(
        api: Any, tenant: str) -> None:
    """restart_kueue (bench-jobs runs it before each phase): a new manager process,
    ready on return, that picks up the ClusterQueues and admits as the old one did."""
    before = kc.kueue_pid()
    kc.restart_kueue(lambda s: None)
    after = kc.kueue_pid()
    assert before is not None and after is not None and after != before
    assert kc.kueue_ready()
    job = submit(api, tenant, "after-restart", gpus=8, duration_s=1)
    wl = wait_for("workload admitted by the new manager", lambda: (
        (w := workload(api, tenant, job.metadata.uid)) and kw.condition_true(w, "Admitted")
        and w))
    assert wl["status"]["admission"]["clusterQueue"] == tenant
    assert wait_for("job finished", lambda: job_finished(api, tenant, "after-restart")) \
        == "Complete"
