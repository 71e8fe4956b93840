"""Endpoint replicas as Kestrel jobs: the rolling hold, the CPU replica's Job, and the
units Kueue reports for it (pure, no I/O)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kestrel.workloads import CPU_FLAVOR, KWOK_DURATION_ANNOTATION
from kestrel_sdk import budget
from kestrel_sdk.v1 import common_pb2
from services.admission.domain import Budget, JobAsk, Policy, Reservation, Ruling, decide
from services.gateway.replicas import DEFAULT_HORIZON_S, replica_spec, units_of
from services.placer import lifecycle, manifests

D = Decimal


@pytest.mark.parametrize(("hold", "held"), [
    pytest.param(budget.Hold(D(6), D(4)), D(2),
                 id="a job's hold shrinks as the ledger consumes it"),
    pytest.param(budget.Hold(D(6), D(9), rolling=True), D(6),
                 id="a replica's rolling hold keeps its whole horizon however long it ran"),
    pytest.param(budget.Hold(D(6), D(1), closed=True, rolling=True), D(0),
                 id="a closed rolling hold holds nothing"),
])
def test_what_a_hold_still_holds(hold: budget.Hold, held: Decimal) -> None:
    assert hold.held == held
    # admission's own Reservation (open by definition: a closed one is released) answers
    # with the same formula
    if not hold.closed:
        assert Reservation("j", hold.amount, hold.consumed, hold.rolling).held == held


def test_a_running_replica_keeps_reserving_its_horizon_in_admissions_budget() -> None:
    b = Budget(D(10), D(3), started=(Reservation("r", D(6), D(3), rolling=True),))
    assert b.reserved == D(6) and b.remaining == D(1)


@pytest.mark.parametrize(("cores", "charged", "verdict"), [
    pytest.param(1, "4", Ruling.ADMITTED, id="one core for 600 s at 0.01 fits 6 remaining"),
    pytest.param(1, "4.01", Ruling.HELD, id="one cent short of the horizon is held"),
    pytest.param(3, "0", Ruling.REJECTED, id="more cores than the CPU pool's quota never run"),
])
def test_the_cpu_pool_is_priced_per_core_second(cores: int, charged: str,
                                                verdict: Ruling) -> None:
    ask = JobAsk("job-1", "t", cores, CPU_FLAVOR, DEFAULT_HORIZON_S, 0, rolling=True)
    d = decide(ask, Policy("t", {}, False), Budget(D(10), D(charged)),
               {CPU_FLAVOR: D("0.01")}, 8, False)
    assert d.verdict is verdict, d.reason
    if verdict is Ruling.ADMITTED:
        assert d.reserved == D(6) and "1 core x 600 s" in d.reason


def test_a_replica_spec_names_its_endpoint_and_horizon() -> None:
    spec = common_pb2.EndpointSpec(name="e" * 63, flavor=CPU_FLAVOR)
    job = replica_spec("ep-0123456789abcdef", spec, 12)
    assert job.endpoint_id == "ep-0123456789abcdef"
    assert job.name.endswith("-r12") and len(job.name) <= 63
    assert (job.gpus, job.max_duration_s) == (1, DEFAULT_HORIZON_S)
    assert units_of(common_pb2.EndpointSpec(flavor="gpu-h100", gpus_per_replica=2)) == 2


def _cpu_replica() -> dict[str, Any]:
    plan = manifests.JobPlan("job-0123456789abcdef", "acme", "emb-r0", 1, 600, 0, CPU_FLAVOR,
                             "the CPU pool", {}, manifests.Worker(
                                 "ep-0123456789abcdef", "kestrel.dev/kestrel:abc",
                                 "redis://127.0.0.1:6379/0"))
    return manifests.job(plan)


def test_a_cpu_replica_runs_the_worker_with_no_deadline_on_the_real_node() -> None:
    body = _cpu_replica()
    spec = body["spec"]
    assert spec["suspend"] is True and "activeDeadlineSeconds" not in spec
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {lifecycle.FLAVOR_NODE_LABEL: CPU_FLAVOR}
    (c,) = pod["containers"]
    assert c["command"] == ["kestrel-worker"] and c["image"] == "kestrel.dev/kestrel:abc"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["KESTREL_WORKER_ENDPOINT"] == "ep-0123456789abcdef"
    assert env["KESTREL_WORKER_REPLICA"] == "job-0123456789abcdef"
    assert c["resources"]["requests"]["cpu"] == "1"
    assert lifecycle.job_gpus(body) == 1  # metered as one core


@pytest.mark.parametrize(("usage", "units"), [
    pytest.param({"cpu": "1"}, 1, id="a whole core"),
    pytest.param({"cpu": "2000m"}, 2, id="milli-cores that make whole cores"),
])
def test_kueues_assignment_on_the_cpu_pool_counts_cores(usage: dict[str, str], units: int) -> None:
    wl = {"status": {"admission": {"podSetAssignments": [
        {"flavors": {"cpu": CPU_FLAVOR, "memory": CPU_FLAVOR}, "resourceUsage": usage}]}}}
    assert lifecycle.assignment(wl) == (CPU_FLAVOR, units)


def test_a_gpu_replica_is_a_kwok_pod_that_keeps_running_until_it_is_deleted() -> None:
    """Regression: with no completion delay KWOK's stage ended the pod after 1 s, so the
    replica 'succeeded' a second after it started."""
    plan = manifests.JobPlan("job-0123456789abcdef", "acme", "emb-r0", 1, 600, 0, "gpu-a10",
                             "by runway", {}, manifests.Worker(
                                 "ep-0123456789abcdef", "kestrel.dev/kestrel:abc",
                                 "redis://127.0.0.1:6379/0"))
    spec = manifests.job(plan)["spec"]
    assert "activeDeadlineSeconds" not in spec
    template = spec["template"]
    assert template["metadata"]["annotations"][KWOK_DURATION_ANNOTATION] == "87600h"
    assert template["metadata"]["labels"]["kestrel.dev/endpoint"] == "ep-0123456789abcdef"
    (c,) = template["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
