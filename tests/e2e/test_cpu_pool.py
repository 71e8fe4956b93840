"""End-to-end: the CPU pool, a REAL kubelet node (kestrel-cpu-0) in the local cluster.

Its pods are real processes in containers of the Kestrel image built by images/build.sh
(no registry), run by containerd + runc; Kueue admits them on the ``cpu`` flavor like
any other tenant work. Unlike the KWOK GPU pool, durations here are real, so one test
asserts a lower bound on a pod's own run time (a 2 s sleep takes at least 2 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest

from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not kc.CPU_NODE_ENABLED, reason="KESTREL_CPU_NODE=0: no real node"),
]


@pytest.fixture(scope="module")
def tenant(api: Any) -> Iterator[str]:
    """A tenant with 1 H100 and the CPU pool's 2 CPUs / 4 GiB of quota, no cohort."""
    name = f"e2e-cpu-{uuid.uuid4().hex[:6]}"
    kw.create_tenant_queue(api, kw.tenant_queue_manifests(
        name, gpu_quota={"gpu-h100": 1}, cpu_quota={"cpu": "2", "memory": "4Gi"}))
    yield name
    kw.delete_tenant_queue(api, name)


def _core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def test_the_real_node_is_ready_with_its_own_capacity_and_no_taint(api: Any) -> None:
    node = _core(api).read_node(kc.NODE_NAME)
    labels = node.metadata.labels
    assert labels["kestrel.dev/pool"] == "cpu"
    assert labels["kestrel.dev/simulated"] == "false"
    assert not node.spec.taints
    assert int(node.status.capacity["cpu"]) == os.cpu_count()
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    info = node.status.node_info
    assert info.kubelet_version == kc.read_versions()["KUBE_VERSION"]
    assert info.container_runtime_version.startswith("containerd://")
    # Beside it, only simulated nodes: every other node is a KWOK one and says so.
    for other in _core(api).list_node().items:
        if other.metadata.name != kc.NODE_NAME:
            assert other.metadata.labels["kestrel.dev/simulated"] == "true"
            assert other.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"


def test_kwok_leaves_the_real_node_alone(api: Any) -> None:
    """Its status is the kubelet's own: only the kubelet writes it, it reports the
    kubelet's endpoint and the images containerd holds, and it keeps being renewed."""
    node = _core(api).read_node(kc.NODE_NAME)
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    status_writers = {m.manager for m in node.metadata.managed_fields
                      if m.subresource == "status"}
    # the field manager is the kubelet binary's name (kubelet-<version> in our cache)
    assert status_writers and all(m.startswith("kubelet") for m in status_writers), status_writers
    assert node.status.daemon_endpoints.kubelet_endpoint.port == kc.KUBELET_PORT
    images = {n for img in node.status.images or [] for n in img.names or []}
    # images containerd holds (KWOK nodes list none); the list follows the status
    # updates, so it may lag a rebuild of the Kestrel image by a minute: any of ours.
    assert any(n.startswith("kestrel.dev/") for n in images), images
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.reason == "KubeletReady"
    # The kubelet renews its Lease every ~10 s; KWOK renews only the nodes it manages.
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    leases: Any = client.CoordinationV1Api(api)

    def lease() -> Any:
        for _ in range(10):  # a busy apiserver may answer one read with an error
            try:
                return leases.read_namespaced_lease(kc.NODE_NAME, "kube-node-lease").spec
            except ApiException:
                time.sleep(1)
        pytest.fail("the real node's lease could not be read")

    first = lease().renew_time
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        time.sleep(2)
        if lease().renew_time > first:
            break
    else:
        pytest.fail("the real node's lease was not renewed in 40 s")
    assert lease().holder_identity == kc.NODE_NAME


def test_a_kueue_admitted_pod_runs_real_work_on_the_real_node(api: Any, tenant: str) -> None:
    """The pod prints what only it can know (its own cgroup: pod uid and container id)
    and the model file's sha256, sleeps 2 s, and exits 3; all of it is read back."""
    script = ("grep -m1 pids /proc/self/cgroup; "
              "sha256sum /opt/kestrel/model/model.onnx; "
              "python -c 'import onnxruntime, tokenizers; print(\"onnxruntime\", "
              "onnxruntime.__version__)'; sleep 2; exit 3")
    run = kw.run_cpu_job(api, tenant, "gpu", "real-work", ["sh", "-c", script])
    assert run.admitted and run.flavor == kc.CPU_FLAVOR
    assert run.node == kc.NODE_NAME
    assert run.exit_code == 3, run
    assert kw.MODEL_ONNX_SHA256 in run.log
    cgroup = re.search(r"pids:(\S+)", run.log)
    assert cgroup, run.log
    assert run.pod_uid in cgroup.group(1) and run.container_id in cgroup.group(1), run
    assert "onnxruntime 1.32.0" in run.log
    # Real time: the container's own start and finish (kubelet/containerd) span the sleep.
    assert run.run_s is not None and run.run_s >= 2.0, run


def test_cpu_work_passes_the_same_quota(api: Any, tenant: str) -> None:
    """A CPU job asking for more than the tenant's CPU quota is never admitted."""
    from kubernetes import client

    body: Any = kw.cpu_job_manifest("too-big", tenant, "gpu", ["true"], cpu="3", memory="1Gi")
    job: Any = client.BatchV1Api(api).create_namespaced_job(tenant, body)
    time.sleep(5)
    wl = kw.workloads_by_job_uid(api, tenant).get(job.metadata.uid)
    assert wl is not None
    assert not kw.condition_true(wl, "QuotaReserved")
    assert not kw.condition_true(wl, "Admitted")


def test_a_gpu_job_never_takes_the_cpu_flavor(api: Any, tenant: str) -> None:
    from kubernetes import client

    body: Any = kw.gpu_job_manifest("gpu-one", tenant, "gpu", gpus=1, duration_s=1)
    job: Any = client.BatchV1Api(api).create_namespaced_job(tenant, body)
    deadline = time.monotonic() + 60
    wl: dict[str, Any] = {}
    while time.monotonic() < deadline:
        wl = kw.workloads_by_job_uid(api, tenant).get(job.metadata.uid) or {}
        if kw.condition_true(wl, "Admitted") or kw.condition_true(wl, "Finished"):
            break
        time.sleep(0.5)
    psa = cast(dict[str, Any], wl["status"]["admission"]["podSetAssignments"][0])
    assert set(psa["flavors"].values()) == {"gpu-h100"}


def test_the_image_cache_is_reused_on_a_second_build() -> None:
    first = kc.build_images(lambda _: None)
    lines: list[str] = []
    second = kc.build_images(lines.append)
    text = "\n".join(lines)
    for stage in ("pause: cached", "base: cached", "deps: cached"):
        assert stage in text, text
    assert second["pause"]["build_s"] == 0 and second["pause"]["built"] is False
    # In a shared working tree someone may edit kestrel/ or services/ in between: then
    # (only then) the app layer is new, and only it.
    if second["kestrel"]["ref"] == first["kestrel"]["ref"]:
        assert second["kestrel"]["build_s"] == 0 and second["kestrel"]["built"] is False
        assert "kestrel: cached" in text, text


def test_stopping_the_node_leaves_nothing_and_it_comes_back(api: Any) -> None:
    """Stop containerd and the kubelet as `down` does: no process, mount, network
    namespace or bridge is left. Then `up` brings the same node back, Ready."""
    with kc._state_lock():
        kc._stop_cpu_node(print)
    left = kc.node_leftovers()
    assert left == {"processes": [], "mounts": [], "netns": [], "links": []}, left
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(kc.NODE.socket) not in ps
    kc.ensure_cluster()
    assert kc.cpu_node_ready()
