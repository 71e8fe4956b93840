"""The cluster as an operator reads it: nodes and ClusterQueues from the apiserver's JSON."""

from __future__ import annotations

from typing import Any

from services.placer.manifests import cluster_queue
from services.placer.views import node_view, queue_view


def node(name: str, labels: dict[str, str], alloc: dict[str, str], ready: str = "True"
         ) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc,
                       "conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": ready}]}}


def test_a_kwok_gpu_node_is_simulated_and_counts_its_gpus() -> None:
    n = node_view(node("kwok-h100-0", {"kestrel.dev/pool": "gpu", "kestrel.dev/simulated":
                                       "true", "kestrel.dev/flavor": "gpu-h100"},
                       {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}))
    assert (n.name, n.pool, n.flavor, n.simulated, n.ready, n.gpus, n.cpu, n.memory) == (
        "kwok-h100-0", "gpu", "gpu-h100", True, True, 8, "64", "512Gi")


def test_the_real_kubelet_node_is_not_simulated_and_has_no_gpus() -> None:
    n = node_view(node("kestrel-cpu-0", {"kestrel.dev/pool": "cpu", "kestrel.dev/simulated":
                                         "false", "kestrel.dev/flavor": "cpu"},
                       {"cpu": "2", "memory": "4Gi"}, ready="False"))
    assert (n.simulated, n.ready, n.gpus, n.pool) == (False, False, 0, "cpu")


def test_a_node_without_kestrel_labels_or_status_is_listed_as_what_it_is() -> None:
    n = node_view({"metadata": {"name": "other"}})
    assert (n.name, n.pool, n.simulated, n.ready, n.gpus) == ("other", "", False, False, 0)


def test_a_queue_shows_each_flavors_quota_beside_kueues_reservation_and_usage() -> None:
    cq = cluster_queue("acme", {"gpu-h100": 4}, ["gpu-h100", "gpu-a10"], "kestrel-runway",
                       borrow={"gpu-h100": 2})
    cq["status"] = {
        "pendingWorkloads": 1, "reservingWorkloads": 2, "admittedWorkloads": 1,
        "flavorsReservation": [{"name": "gpu-h100", "resources": [
            {"name": "nvidia.com/gpu", "total": "5", "borrowed": "1"}]}],
        "flavorsUsage": [{"name": "gpu-h100", "resources": [
            {"name": "nvidia.com/gpu", "total": "3", "borrowed": "0"}]}]}
    q = queue_view(cq)
    assert (q.name, q.tenant, q.pending_workloads, q.reserving_workloads,
            q.admitted_workloads, q.stop_policy) == ("kestrel-acme", "acme", 1, 2, 1, "None")
    by = {(r.flavor, r.resource): r for r in q.resources}
    h100 = by[("gpu-h100", "nvidia.com/gpu")]
    assert (h100.nominal_quota, h100.borrowing_limit, h100.reserved, h100.admitted,
            h100.borrowed) == ("4", "2", "5", "3", "1")
    a10 = by[("gpu-a10", "nvidia.com/gpu")]  # no quota, nothing reserved
    assert (a10.nominal_quota, a10.reserved, a10.admitted) == ("0", "0", "0")
    assert ("cpu", "cpu") in by  # the CPU pool's flavor is there too


def test_a_suspended_tenants_queue_says_hold() -> None:
    q = queue_view(cluster_queue("acme", {}, ["gpu-h100"], "", suspended=True))
    assert q.stop_policy == "Hold" and q.pending_workloads == 0
