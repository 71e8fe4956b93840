"""The placer's pure decisions: flavor choice by runway, and the WorkloadEvents that
Kubernetes objects imply (over dicts shaped like what the apiserver serves)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from services.placer import manifests
from services.placer.core import AdmittedJob, Placer
from services.placer.domain import FlavorAsk, RunwayView, choose_flavor, short_because
from services.placer.kube import JOBS, KINDS, PODS, WATCHED, Kube, Watcher
from services.placer.lifecycle import (
    Derived,
    EventType,
    Observed,
    Waiting,
    allocation_id,
    awaiting_workload,
    derive,
    identity,
    open_allocation,
    requeue_due,
    time_us,
)
from services.placer.observer import key_of
from services.placer.settings import PlacerSettings
from services.placer.store import TenantQuota

PRICES = {"gpu-h100": Decimal("0.001"), "gpu-a10": Decimal("0.0003")}
BOTH = {"gpu-h100": 8, "gpu-a10": 8}


def runway(bp: int = 9000, runway_s: float = 1e6, unlimited: bool = False) -> RunwayView:
    return RunwayView(bp, runway_s, unlimited)


@dataclass(frozen=True)
class FlavorCase:
    id: str
    ask: FlavorAsk
    quota: dict[str, int]
    runway: RunwayView | None
    want_flavor: str
    want_reason: str
    prices: dict[str, Decimal] = field(default_factory=lambda: PRICES)


FLAVOR_CASES = [
    FlavorCase("healthy runway and a preference that fits: the preference",
               FlavorAsk(2, "gpu-a10", 100), BOTH, runway(),
               "gpu-a10", "runway healthy (90% left): preferred flavor fits its quota"),
    FlavorCase("healthy runway, no preference: the dearest flavor that fits",
               FlavorAsk(2, "", 100), BOTH, runway(),
               "gpu-h100", "runway healthy (90% left): no preference; dearest flavor that fits"),
    FlavorCase("healthy runway, preference without enough quota: the dearest that fits",
               FlavorAsk(4, "gpu-h100", 100), {"gpu-h100": 2, "gpu-a10": 8}, runway(),
               "gpu-a10", "runway healthy (90% left): preferred gpu-h100 has quota 2 < 4 GPUs; "
                          "dearest flavor that fits"),
    FlavorCase("under 25% of the credits left: the cheapest flavor, preference overridden",
               FlavorAsk(1, "gpu-h100", 100), BOTH, runway(bp=1800),
               "gpu-a10", "runway short (18% left): cheapest flavor that fits"),
    FlavorCase("exactly 25% left is not short",
               FlavorAsk(1, "gpu-h100", 100), BOTH, runway(bp=2500),
               "gpu-h100", "runway healthy (25% left): preferred flavor fits its quota"),
    FlavorCase("runway under twice the job's max duration is short even with credits left",
               FlavorAsk(1, "", 100), BOTH, runway(bp=9000, runway_s=150),
               "gpu-a10", "runway short (150 s of runway < 2 x max duration 100 s): "
                          "cheapest flavor that fits"),
    FlavorCase("an unlimited runway (nothing burns) is never short by time",
               FlavorAsk(1, "", 100), BOTH, runway(bp=9000, runway_s=0, unlimited=True),
               "gpu-h100", "runway healthy (90% left): no preference; dearest flavor that fits"),
    FlavorCase("short runway but the cheap flavor lacks quota: the cheapest that fits",
               FlavorAsk(4, "", 100), {"gpu-h100": 8, "gpu-a10": 2}, runway(bp=100),
               "gpu-h100", "runway short (1% left): cheapest flavor that fits"),
    FlavorCase("no runway figure yet: treated as healthy",
               FlavorAsk(1, "", 100), BOTH, None,
               "gpu-h100", "no runway figure yet: no preference; dearest flavor that fits"),
    FlavorCase("a flavor without a price is never the cheapest",
               FlavorAsk(1, "", 100), {"gpu-h100": 8, "gpu-a10": 8, "gpu-x": 8}, runway(bp=0),
               "gpu-a10", "runway short (0% left): cheapest flavor that fits"),
    FlavorCase("nothing fits: the preference as asked, to borrow from the cohort",
               FlavorAsk(16, "gpu-a10", 100), BOTH, runway(),
               "gpu-a10", "no flavor's quota fits 16 GPUs: gpu-a10 placed as asked, "
                          "it may borrow from the cohort"),
    FlavorCase("nothing fits and no preference: the dearest known flavor",
               FlavorAsk(16, "", 100), BOTH, runway(),
               "gpu-h100", "no flavor's quota fits 16 GPUs: gpu-h100 placed as asked, "
                           "it may borrow from the cohort"),
]


@pytest.mark.parametrize("case", FLAVOR_CASES, ids=[c.id for c in FLAVOR_CASES])
def test_choose_flavor(case: FlavorCase) -> None:
    got = choose_flavor(case.ask, case.quota, case.prices, case.runway, short_bp=2500)
    assert (got.flavor, got.reason) == (case.want_flavor, case.want_reason)


def test_short_because_uses_the_threshold_given() -> None:
    assert short_because(runway(bp=4000), 10, short_bp=5000) == "40% left"
    assert short_because(runway(bp=4000), 10, short_bp=2500) is None


# --- events from Kubernetes objects ----------------------------------------------

NS, JOB, TENANT = "kestrel-acme", "job-0123456789abcdef", "acme"
T0 = "2026-11-29T14:28:35Z"


def ts(second: int) -> str:
    return f"2026-11-29T14:28:{second:02d}Z"


def us(second: int) -> int:
    return time_us(ts(second))


def cond(ctype: str, status: str, at: int, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": ts(at), "reason": reason,
            "message": message}


def job_obj(gpus: int = 2, failed_at: int | None = None) -> dict[str, Any]:
    body = manifests.job(manifests.JobPlan(JOB, TENANT, "n", gpus, 60, 3, "gpu-h100",
                                           "healthy: dearest", {}))
    body["metadata"]["creationTimestamp"] = ts(30)
    if failed_at is not None:
        body["status"] = {"conditions": [cond("Failed", "True", failed_at, "DeadlineExceeded",
                                              "Job was active longer than specified deadline")]}
    return body


def workload(*conds: dict[str, Any], flavor: str = "gpu-a10", gpus: int = 2,
             evictions: int = 0, deleted_at: int | None = None,
             evicted_for: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in conds):
        status["admission"] = {"clusterQueue": NS, "podSetAssignments": [{
            "name": "main", "count": 1,
            "flavors": {"cpu": flavor, "memory": flavor, "nvidia.com/gpu": flavor},
            "resourceUsage": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": str(gpus)}}]}
    if evictions:
        status["schedulingStats"] = {"evictions": [{"reason": "Deactivated",
                                                    "underlyingCause": "", "count": evictions}]}
    meta: dict[str, Any] = {
        "name": f"job-{JOB}-1a2b3", "namespace": NS,
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB,
                             "uid": "u", "controller": True}]}
    if deleted_at is not None:
        meta["deletionTimestamp"] = ts(deleted_at)
    if evicted_for:
        meta["annotations"] = {"kestrel.dev/eviction-reason": evicted_for}
    template = job_obj(gpus)["spec"]["template"]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
            "spec": {"active": True, "podSets": [{"name": "main", "count": 1,
                                                  "template": template}]},
            "status": status}


def pod(created: int, started: int, running: bool = True) -> dict[str, Any]:
    state = ({"running": {"startedAt": ts(started)}} if running else
             {"terminated": {"startedAt": ts(started), "finishedAt": ts(started + 3),
                             "exitCode": 0}})
    return {"metadata": {"name": f"{JOB}-p{created}", "namespace": NS,
                         "creationTimestamp": ts(created),
                         "labels": {"kestrel.dev/job-id": JOB, "kestrel.dev/tenant": TENANT}},
            "status": {"phase": "Running" if running else "Succeeded",
                       "containerStatuses": [{"name": "work", "state": state}]}}


# Kueue reserved quota and admitted at once (no admission check, or it said Ready).
RESERVED = (cond("QuotaReserved", "True", 35, "QuotaReserved", "Quota reserved in ClusterQueue"),
            cond("Admitted", "True", 35, "Admitted", "The workload is admitted"))


@dataclass(frozen=True)
class EventsCase:
    id: str
    observed: Observed
    want: list[tuple[EventType, str, int, str]]  # type, workload id, time (s), reason prefix
    want_flavor: str = "gpu-a10"


E = EventType
EVENT_CASES = [
    EventsCase("a created Job alone is QUEUED at its creation, with the placer's flavor",
               Observed(job=job_obj()), [(E.QUEUED, JOB, 30, "healthy: dearest")],
               want_flavor="gpu-h100"),
    EventsCase("a Workload still waiting for quota implies nothing more",
               Observed(job_obj(), workload(cond("QuotaReserved", "False", 31, "Pending"))),
               [(E.QUEUED, JOB, 30, "")], want_flavor="gpu-h100"),
    EventsCase("quota reserved: ADMITTED at that transition, on the flavor Kueue assigned",
               Observed(job_obj(), workload(*RESERVED)),
               [(E.QUEUED, JOB, 30, ""), (E.ADMITTED, JOB, 35, "Admitted")]),
    EventsCase("a running pod of this allocation: STARTED at its container start",
               Observed(job_obj(), workload(*RESERVED), (pod(35, 36),)),
               [(E.QUEUED, JOB, 30, ""), (E.ADMITTED, JOB, 35, ""), (E.STARTED, JOB, 36, "")]),
    EventsCase("pods gone but PodsReady=True: STARTED at that condition",
               Observed(None, workload(*RESERVED, cond("PodsReady", "True", 37, "Started"))),
               [(E.ADMITTED, JOB, 35, ""), (E.STARTED, JOB, 37, "")]),
    EventsCase("Finished with Succeeded: FINISHED at that transition",
               Observed(job_obj(), workload(*RESERVED, cond("Finished", "True", 39, "Succeeded",
                                                            "Reached expected number")),
                        (pod(35, 35, running=False),)),
               [(E.QUEUED, JOB, 30, ""), (E.ADMITTED, JOB, 35, ""), (E.STARTED, JOB, 35, ""),
                (E.FINISHED, JOB, 39, "Succeeded: Reached expected number")]),
    EventsCase("Finished with Failed (deadline exceeded): FAILED at that transition",
               Observed(None, workload(*RESERVED, cond("Finished", "True", 39, "Failed",
                                                      "Job was active longer"))),
               [(E.ADMITTED, JOB, 35, ""), (E.FAILED, JOB, 39, "Failed: Job was active")]),
    EventsCase("deactivated: EVICTED at the Evicted transition while quota is still held",
               Observed(None, workload(*RESERVED, cond("Evicted", "True", 41, "Deactivated",
                                                      "The workload is deactivated"),
                                       evictions=1)),
               [(E.ADMITTED, JOB, 35, ""), (E.EVICTED, JOB, 41, "Deactivated")]),
    EventsCase("deactivated by admission for budget: EVICTED says the tenant's budget is spent",
               Observed(None, workload(*RESERVED, cond("Evicted", "True", 41, "Deactivated",
                                                      "The workload is deactivated"),
                                       evictions=1, evicted_for="evicted: tenant acme's "
                                                                "budget is spent")),
               [(E.ADMITTED, JOB, 35, ""),
                (E.EVICTED, JOB, 41, "evicted: tenant acme's budget is spent")]),
    EventsCase("evicted and quota released: EVICTED of the first allocation only",
               Observed(None, workload(cond("QuotaReserved", "False", 41, "Pending"),
                                       cond("Admitted", "False", 41, "NoReservation"),
                                       cond("Evicted", "True", 41, "Deactivated"),
                                       evictions=1)),
               # Kueue's assignment is gone: the flavor the pods were pinned to.
               [(E.EVICTED, JOB, 41, "Deactivated")], want_flavor="gpu-h100"),
    EventsCase("quota again after an eviction is a new allocation <job>.r2",
               Observed(None, workload(cond("QuotaReserved", "True", 45, "QuotaReserved"),
                                       cond("Admitted", "True", 45, "Admitted"),
                                       cond("Evicted", "False", 45, "QuotaReserved"),
                                       evictions=1), (pod(35, 36), pod(45, 46))),
               [(E.ADMITTED, f"{JOB}.r2", 45, ""), (E.STARTED, f"{JOB}.r2", 46, "")]),
    EventsCase("quota reserved but the runway check still Pending: nothing is metered yet",
               Observed(job_obj(), workload(RESERVED[0], cond("Admitted", "False", 35,
                                                              "NoChecks"))),
               [(E.QUEUED, JOB, 30, "")], want_flavor="gpu-h100"),
    EventsCase("the runway check turns Ready later: ADMITTED at the Admitted transition",
               Observed(None, workload(RESERVED[0], cond("Admitted", "True", 52, "Admitted"))),
               [(E.ADMITTED, JOB, 52, "Admitted")]),
    EventsCase("evicted while it waited at the check: no allocation to close",
               Observed(None, workload(cond("QuotaReserved", "False", 41, "Pending"),
                                       cond("Admitted", "False", 35, "NoChecks"),
                                       cond("Evicted", "True", 41, "AdmissionCheck"),
                                       evictions=1)), []),
    EventsCase("the Workload deleted while holding quota: FAILED at its deletionTimestamp",
               Observed(None, workload(*RESERVED, deleted_at=50), workload_deleted=True),
               [(E.ADMITTED, JOB, 35, ""), (E.FAILED, JOB, 50, "deleted from Kubernetes")]),
    EventsCase("deleted after the Job failed: FAILED at the Job's Failed condition",
               Observed(job_obj(failed_at=48), workload(*RESERVED, deleted_at=50),
                        workload_deleted=True),
               [(E.QUEUED, JOB, 30, ""), (E.ADMITTED, JOB, 35, ""),
                (E.FAILED, JOB, 48, "DeadlineExceeded")]),
    EventsCase("deleted after it finished: nothing more than the finish",
               Observed(None, workload(*RESERVED, cond("Finished", "True", 39, "Succeeded"),
                                       deleted_at=50), workload_deleted=True),
               [(E.ADMITTED, JOB, 35, ""), (E.FINISHED, JOB, 39, "Succeeded")]),
    EventsCase("deleted without ever holding quota: nothing to meter",
               Observed(None, workload(cond("QuotaReserved", "False", 31, "Pending"),
                                       deleted_at=50), workload_deleted=True), []),
]


@pytest.mark.parametrize("case", EVENT_CASES, ids=[c.id for c in EVENT_CASES])
def test_events_implied_by_kubernetes_objects(case: EventsCase) -> None:
    got = derive(case.observed)
    assert [(e.type, e.workload_id, e.time_us) for e in got] == [
        (t, wid, us(s)) for t, wid, s, _ in case.want]
    for e, (_, _, _, reason) in zip(got, case.want, strict=True):
        assert e.reason.startswith(reason), e.reason
        assert (e.tenant, e.job_id, e.k8s_namespace) == (TENANT, JOB, NS)
        assert e.event_id == f"{e.workload_id}:{e.type.name.lower()}"
        assert e.gpus == 2
        if e.type is not EventType.QUEUED:
            assert e.flavor == case.want_flavor
            assert e.k8s_name == f"job-{JOB}-1a2b3"


def test_derivation_is_stable_so_a_restart_publishes_the_same_ids() -> None:
    obs = Observed(job_obj(), workload(*RESERVED, cond("Finished", "True", 39, "Succeeded")),
                   (pod(35, 35, running=False),))
    assert derive(obs) == derive(obs)


def test_time_us_reads_rfc3339_with_and_without_fractions() -> None:
    assert time_us("1970-01-01T00:00:01Z") == 1_000_000
    assert time_us("1970-01-01T00:00:01.000002Z") == 1_000_002
    assert time_us("2026-11-29T14:28:35+00:00") == time_us(T0)


def _deleting(job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["deletionTimestamp"] = ts(45)
    return job


@pytest.mark.parametrize(("job", "wl", "now_s", "stuck"), [
    (job_obj(), None, 40, True),                     # 10 s without a Workload: touch it
    (job_obj(), None, 39, False),                    # 9 s: Kueue may still be on it
    (job_obj(), workload(), 59, False),              # Kueue made its Workload
    (job_obj(failed_at=35), None, 59, False),        # over: nothing to admit
    (_deleting(job_obj()), None, 59, False),         # going away
    (None, None, 59, False),                         # only its Workload or pods seen
], ids=["ten-seconds-without-a-workload", "not-yet", "has-its-workload", "finished",
        "being-deleted", "no-job"])
def test_a_job_awaits_its_workload_only_while_live_and_past_the_grace(
        job: dict[str, Any] | None, wl: dict[str, Any] | None, now_s: int, stuck: bool) -> None:
    assert awaiting_workload(job, wl, time_us(ts(now_s)), 10_000_000) is stuck


def test_open_allocation_is_the_admitted_one_without_a_close() -> None:
    open_ = derive(Observed(None, workload(*RESERVED)))
    assert open_allocation(open_) is not None
    closed = derive(Observed(None, workload(*RESERVED, cond("Finished", "True", 39, "Succeeded"))))
    assert open_allocation(closed) is None
    assert allocation_id(JOB, 1) == JOB and allocation_id(JOB, 3) == f"{JOB}.r3"


def test_identity_and_keys_ignore_objects_outside_kestrel_namespaces() -> None:
    assert identity(job_obj()) == (TENANT, JOB)
    assert identity(None, workload(*RESERVED)) == (TENANT, JOB)
    foreign = workload(*RESERVED)
    foreign["metadata"]["namespace"] = "tenant-example"
    foreign["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {}
    assert identity(None, foreign) is None
    assert key_of("workload", foreign) is None
    assert key_of("workload", workload(*RESERVED)) == (NS, JOB)
    assert key_of("pod", pod(35, 36)) == (NS, JOB)


# --- manifests -------------------------------------------------------------------

def test_job_manifest_is_suspended_bounded_and_pinned_to_its_flavor() -> None:
    body = manifests.job(manifests.JobPlan(JOB, TENANT, "train", 4, 600, 0, "gpu-a10",
                                           "why", {"team": "x", "kestrel.dev/job-id": "spoof"}))
    spec, pod_spec = body["spec"], body["spec"]["template"]["spec"]
    assert body["metadata"]["namespace"] == NS and body["metadata"]["name"] == JOB
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert body["metadata"]["labels"]["kestrel.dev/job-id"] == JOB
    assert spec["suspend"] is True and spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 600
    # Without a simulated duration the KWOK pod ends just inside the Job's deadline.
    assert spec["template"]["metadata"]["annotations"][
        "pod-complete.stage.kwok.x-k8s.io/delay"] == "540000ms"
    assert pod_spec["nodeSelector"] == {"kestrel.dev/flavor": "gpu-a10"}
    # Kueue adds the flavor's tolerations (and node labels) when it admits the Job.
    assert "tolerations" not in pod_spec
    res = pod_spec["containers"][0]["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "4"
    assert body["metadata"]["annotations"] == {"kestrel.dev/flavor": "gpu-a10",
                                               "kestrel.dev/flavor-reason": "why",
                                               "kestrel.dev/name": "train"}


@pytest.mark.parametrize(("max_s", "sim_s", "want"), [
    (600, 0, "540000ms"),   # 10% short
    (3600, 0, "3540000ms"),  # at most a minute short
    (40, 0, "36000ms"),
    (10, 0, "7000ms"),      # at least 3 s short: the pod starts after the Job does
    (4, 0, "2000ms"),       # never under half the bound
    (1, 0, "500ms"),
    (60, 5, "5s"),          # declared: as declared
    (10, 30, "30s"),        # declared past the bound: the deadline fails it, as it would
])
def test_a_job_without_a_simulated_duration_ends_inside_its_deadline(
        max_s: int, sim_s: int, want: str) -> None:
    assert manifests.simulated_run(max_s, sim_s) == want


def test_cluster_queue_lists_every_flavor_and_the_check_only_when_named() -> None:
    cq = manifests.cluster_queue(TENANT, {"gpu-h100": 3}, ("gpu-h100", "gpu-a10"),
                                 "kestrel-runway")
    spec = cq["spec"]
    assert cq["metadata"]["name"] == NS and spec["cohortName"] == "kestrel-gpu"
    flavors = spec["resourceGroups"][0]["flavors"]
    # The GPU flavors in order, then the CPU pool's flavor with no GPU quota (issue 12).
    assert [f["name"] for f in flavors] == ["gpu-h100", "gpu-a10", "cpu"]
    gpus = [next(r["nominalQuota"] for r in f["resources"] if r["name"] == "nvidia.com/gpu")
            for f in flavors]
    assert gpus == ["3", "0", "0"]
    assert {r["name"]: r["nominalQuota"] for r in flavors[2]["resources"]} == {
        "cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "0"}
    # The quota is a cap: nothing borrowed from the cohort, on any resource.
    assert {r["borrowingLimit"] for f in flavors for r in f["resources"]} == {"0", "0Gi"}
    may_borrow = manifests.cluster_queue(TENANT, {"gpu-h100": 3}, ("gpu-h100", "gpu-a10"), "",
                                         borrow={"gpu-a10": 2})
    a10 = {r["name"]: r["borrowingLimit"]
           for r in may_borrow["spec"]["resourceGroups"][0]["flavors"][1]["resources"]}
    assert a10 == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    assert spec["admissionChecksStrategy"] == {"admissionChecks": [{"name": "kestrel-runway"}]}
    assert spec["stopPolicy"] == "None"
    no_check = manifests.cluster_queue(TENANT, {}, ("gpu-h100",), "", suspended=True)
    assert no_check["spec"]["admissionChecksStrategy"] is None
    assert no_check["spec"]["stopPolicy"] == "Hold"


# --- the observer, judged by what it publishes -------------------------------------

class Recorder:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, event: Derived) -> None:
        self.ids.append(event.event_id)


def observer(recorder: Recorder) -> Placer:
    return Placer(cast(Any, None), cast(Any, None), recorder, PlacerSettings(),
                  clock=lambda: us(59))


async def test_observer_publishes_only_after_every_kind_is_listed_then_never_twice() -> None:
    rec = Recorder()
    placer = observer(rec)
    running = workload(*RESERVED)
    await placer.observer.observe_now("workload", "RELIST", [running])
    await placer.observer.observe_now("job", "RELIST", [job_obj()])
    assert rec.ids == []  # pods not listed yet: STARTED could still be missing
    await placer.observer.observe_now("pod", "RELIST", [pod(35, 36)])
    assert rec.ids == [f"{JOB}:queued", f"{JOB}:admitted", f"{JOB}:started"]
    await placer.observer.observe_now("workload", "MODIFIED", running)
    assert len(rec.ids) == 3
    done = workload(*RESERVED, cond("Finished", "True", 39, "Succeeded"))
    await placer.observer.observe_now("workload", "MODIFIED", done)
    assert rec.ids[3:] == [f"{JOB}:finished"]


async def test_a_relist_without_a_workload_that_held_quota_closes_it() -> None:
    rec = Recorder()
    placer = observer(rec)
    for kind, items in (("workload", [workload(*RESERVED)]), ("job", []), ("pod", [])):
        await placer.observer.observe_now(kind, "RELIST", items)
    assert rec.ids == [f"{JOB}:admitted"]
    # The watch broke (410 Gone) and the Workload was deleted meanwhile.
    await placer.observer.observe_now("workload", "RELIST", [])
    assert rec.ids == [f"{JOB}:admitted", f"{JOB}:failed"]
    assert placer.observer.views == {}


def test_a_cancelled_allocation_is_closed_so_nothing_else_closes_it() -> None:
    events = derive(Observed(None, workload(*RESERVED)))
    opened = open_allocation(events)
    assert opened is not None
    cancelled = replace(opened, type=EventType.CANCELLED, time_us=us(40))
    assert cancelled.event_id == f"{JOB}:cancelled"
    assert open_allocation([*events, cancelled]) is None


async def test_after_a_cancel_the_deletion_publishes_no_second_close() -> None:
    rec = Recorder()
    placer = observer(rec)
    running = workload(*RESERVED)
    for kind, items in (("workload", [running]), ("job", []), ("pod", [])):
        await placer.observer.observe_now(kind, "RELIST", items)
    view = placer.observer.views[(NS, JOB)]
    view.closed.add(JOB)  # what cancel() records once it published CANCELLED
    await placer.observer.observe_now("workload", "DELETED", workload(*RESERVED, deleted_at=50))
    assert rec.ids == [f"{JOB}:admitted"]  # no ":failed" for the same allocation


async def test_the_observer_applies_each_event_of_a_read_in_order_so_an_eviction_between_is_kept(
        ) -> None:
    """A watch read can bring an allocation's eviction and the next allocation's
    admission together: each is derived in turn, so the first allocation's close is
    published before the second opens (derived from the last state alone it would
    never be)."""
    rec = Recorder()
    placer = observer(rec)
    emit = placer.observer.feed(asyncio.get_running_loop())
    stop = asyncio.Event()
    running = asyncio.create_task(placer.observer.run_observer(stop))
    for kind, items in (("workload", [workload(*RESERVED)]), ("job", []), ("pod", [])):
        emit(kind, [("RELIST", items)])
    evicted = workload(*RESERVED[:1], cond("Admitted", "False", 41, "NoReservation"),
                       cond("Evicted", "True", 41, "Deactivated"), evictions=1)
    again = workload(cond("QuotaReserved", "True", 45, "QuotaReserved"),
                     cond("Admitted", "True", 45, "Admitted"),
                     cond("Evicted", "False", 45, "QuotaReserved"), evictions=1)
    emit("workload", [("MODIFIED", evicted), ("MODIFIED", again)])
    for _ in range(100):
        if len(rec.ids) >= 3:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert rec.ids == [f"{JOB}:admitted", f"{JOB}:evicted", f"{JOB}.r2:admitted"]


def renamed(obj: dict[str, Any], job: str) -> dict[str, Any]:
    """A deep copy of `obj` with job id JOB replaced by `job` throughout."""
    out: dict[str, Any] = json.loads(json.dumps(obj).replace(JOB, job))
    return out


class GatedPublisher(Recorder):
    """Acks nothing until released: what is in flight at once shows."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most = 0
        self.release = asyncio.Event()

    async def __call__(self, event: Derived) -> None:
        self.ids.append(event.event_id)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await self.release.wait()
        self.in_flight -= 1


async def test_a_read_that_moves_many_jobs_publishes_them_side_by_side_each_in_its_order(
        ) -> None:
    """Four jobs created and admitted in one read: their events are in flight together
    (one NATS write carries them), while each job's QUEUED still goes before its
    ADMITTED. One at a time, the first publish held every other job back."""
    pub = GatedPublisher()
    placer = Placer(cast(Any, None), cast(Any, None), pub, PlacerSettings(),
                    clock=lambda: us(59))
    jobs = [JOB[:-1] + str(i) for i in range(4)]
    for kind in ("workload", "job", "pod"):
        await placer.observer.observe_now(kind, "RELIST", [])
    read = [("job", [("ADDED", renamed(job_obj(), j)) for j in jobs]),
            ("workload", [("ADDED", renamed(workload(*RESERVED), j)) for j in jobs])]
    observing = asyncio.create_task(placer.observer.observe(read))
    for _ in range(100):
        if pub.in_flight == len(jobs):
            break
        await asyncio.sleep(0.01)
    most = pub.most
    pub.release.set()
    await asyncio.wait_for(observing, 5)
    assert most == len(jobs)
    for j in jobs:
        assert [i for i in pub.ids if i.startswith(f"{j}:")] == [f"{j}:queued", f"{j}:admitted"]


async def test_an_object_the_observer_cannot_read_is_logged_and_the_rest_of_the_read_goes_on(
        ) -> None:
    rec = Recorder()
    placer = observer(rec)
    for kind in ("workload", "job", "pod"):
        await placer.observer.observe_now(kind, "RELIST", [])
    broken = renamed(workload(*RESERVED), JOB)  # a copy: RESERVED's dicts stay as they are
    broken["status"]["conditions"][1]["lastTransitionTime"] = "not a time"
    other = renamed(workload(*RESERVED), JOB[:-1] + "0")
    await placer.observer.observe([("workload", [("ADDED", broken), ("ADDED", other)])])
    assert rec.ids == [f"{JOB[:-1]}0:admitted"]


class FlakyWatchKube:
    """Lists at resourceVersion 10, then 20; the first watch answers 410 Gone."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lists = 0
        self.watched_from: list[str] = []

    def list_raw(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [{"metadata": {"name": f"w{self.lists}"}}], str(self.lists * 10)

    def watch_raw(self, kind: str, rv: str, timeout_s: int) -> Iterator[list[dict[str, Any]]]:
        self.watched_from.append(rv)
        if len(self.watched_from) == 1:
            raise ApiException(status=410, reason="Expired")
        yield [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "21"}}}]
        yield [{"type": "MODIFIED", "object": {"metadata": {"name": "w2",
                                                            "resourceVersion": "22"}}},
               {"type": "DELETED", "object": {"metadata": {"name": "w1",
                                                           "resourceVersion": "23"}}}]
        self.stop.set()


def test_a_watch_that_answers_410_gone_is_relisted_and_resumed_from_the_new_list() -> None:
    stop = threading.Event()
    fake = FlakyWatchKube(stop)
    seen: list[tuple[str, list[Any]]] = []
    watcher = Watcher(lambda: cast(Any, fake), "workload",
                      lambda k, changes: seen.append((k, changes)), stop)
    watcher.run()  # in this thread: returns once the fake sets stop
    assert fake.lists == 2 and fake.watched_from == ["10", "20"]
    # Bookmarks are not emitted; one read's events go out together, in order.
    assert [[t for t, _ in changes] for _, changes in seen] == [
        ["RELIST"], ["RELIST"], ["MODIFIED", "DELETED"]]
    assert [o["metadata"]["name"] for _, o in seen[-1][1]] == ["w2", "w1"]


S = 1_000_000


@pytest.mark.parametrize(("waiting", "served_s", "now_s", "due"), [
    (Waiting(100 * S), 110, 112, True),              # a Job 10 s younger got its Workload
    (Waiting(100 * S), 102, 104, False),             # Kueue is about there: leave it
    (Waiting(100 * S), 0, 110, False),               # a backlog, nothing served yet
    (Waiting(100 * S), 0, 115, True),                # waited the patience: touch anyway
    (Waiting(100 * S, 111 * S, 1), 120, 116, False),  # touched 5 s ago: backs off 6 s
    (Waiting(100 * S, 111 * S, 1), 120, 117, True),   # ... and then again
    (Waiting(100 * S, 111 * S, 2), 120, 122, False),  # twice: 12 s
    (Waiting(100 * S, 100 * S, 9), 200, 159, False),  # the backoff is capped at 60 s
    (Waiting(100 * S, 100 * S, 9), 200, 160, True),
], ids=["a-younger-job-was-served", "kueue-is-about-there", "a-backlog-is-left-to-kueue",
        "patience-runs-out", "backs-off-after-a-touch", "touched-again-after-the-backoff",
        "backoff-doubles", "backoff-is-capped", "capped-backoff-elapses"])
def test_a_job_kueue_skipped_is_touched_with_a_backoff_and_a_backlog_is_left_alone(
        waiting: Waiting, served_s: int, now_s: int, due: bool) -> None:
    got = requeue_due({"j": waiting}, served_s * S, now_s * S, 3 * S, 15 * S)
    assert got == (["j"] if due else [])


@pytest.mark.parametrize(("served_s", "progress_s", "now_s", "due"), [
    (90, 112, 116, False),   # Kueue gave an older Job its Workload 4 s ago: still working
    (90, 112, 126, False),   # ... 14 s ago: the patience counts from then
    (90, 112, 127, True),    # no Workload for anyone in 15 s: Kueue has stopped, touch
    (90, 0, 115, True),      # nothing served since the Job was made: as before
    (110, 114, 116, True),   # a Job 10 s younger was served: skipped, whatever the progress
], ids=["kueue-works-through-older-jobs", "patience-counts-from-the-last-progress",
        "no-progress-for-the-patience", "no-progress-ever", "skipped-beats-progress"])
def test_a_backlog_kueue_works_through_is_left_alone_however_long_it_takes(
        served_s: int, progress_s: int, now_s: int, due: bool) -> None:
    got = requeue_due({"j": Waiting(100 * S)}, served_s * S, now_s * S, 3 * S, 15 * S,
                      progress_us=progress_s * S)
    assert got == (["j"] if due else [])


def test_the_placer_lists_and_watches_only_its_pods_that_left_pending() -> None:
    seen: list[Any] = []

    class Api:
        def param_serialize(self, method: str, path: str, query_params: Any,
                            **kw: Any) -> tuple[Any, ...]:
            seen.append((method, path, dict(query_params)))
            return ()

        def call_api(self, *request: Any) -> Any:
            class Resp:
                status = 200
                response = None
            return Resp()

    kube = Kube.__new__(Kube)
    kube.api = Api()
    kube.lister(PODS)(watch=True, resource_version="7")
    [(method, path, query)] = seen
    assert (method, path) == ("GET", "/api/v1/pods")
    assert query["fieldSelector"] == "status.phase!=Pending"
    assert query["labelSelector"] == "kestrel.dev/job-id" and query["resourceVersion"] == "7"


class TouchRecorder:
    """The one Kube call requeue_stuck makes."""

    def __init__(self) -> None:
        self.touched: list[str] = []

    def touch_job(self, ns: str, name: str, stamp: str) -> bool:
        self.touched.append(name)
        return True


async def test_jobs_behind_a_backlog_kueue_works_through_are_touched_only_once_it_stops(
        ) -> None:
    """Two Jobs wait for their Workloads (made at 0:30) while Kueue gives older Jobs
    theirs: left alone past the patience, touched once Kueue has served nobody for it."""
    now = [us(40)]
    kube = TouchRecorder()
    placer = Placer(cast(Any, kube), cast(Any, None), Recorder(), PlacerSettings(),
                    clock=lambda: now[0])
    older = renamed(job_obj(), "job-older")
    older["metadata"]["creationTimestamp"] = ts(20)
    waiting = [job_obj(), renamed(job_obj(), "job-twin")]
    for kind, items in (("job", [older, *waiting]), ("workload", []), ("pod", [])):
        await placer.observer.observe_now(kind, "RELIST", items)
    await placer.observer.observe_now("workload", "ADDED", renamed(workload(), "job-older"))
    now[0] = us(54)  # 24 s after the Jobs were made, 14 s after Kueue's last progress
    assert await placer.observer.requeue_stuck() == []
    now[0] = us(55)
    assert sorted(k[1] for k in await placer.observer.requeue_stuck()) == ["job-0123456789abcdef",
                                                                  "job-twin"]
    assert sorted(kube.touched) == ["job-0123456789abcdef", "job-twin"]


async def test_the_placer_tracks_jobs_without_a_workload_as_changes_arrive() -> None:
    """requeue_stuck reads what each change left (not a walk of every view): a Job
    that gets its Workload leaves the waiting set and counts as served, one a relist
    no longer holds leaves it, and a Job made again under its name waits from anew."""
    now = [us(40)]
    placer = Placer(cast(Any, TouchRecorder()), cast(Any, None), Recorder(),
                    PlacerSettings(), clock=lambda: now[0])
    a, b = job_obj(), renamed(job_obj(), "job-b")
    for kind, items in (("job", [a, b]), ("workload", []), ("pod", [])):
        await placer.observer.observe_now(kind, "RELIST", items)
    key_a = ("kestrel-acme", "job-0123456789abcdef")
    assert set(placer.observer.unserved) == {key_a, ("kestrel-acme", "job-b")}
    assert placer.observer.unserved[key_a] == us(30) and placer.observer.served_us == 0

    await placer.observer.observe_now("workload", "ADDED", workload())
    assert set(placer.observer.unserved) == {("kestrel-acme", "job-b")}
    assert placer.observer.served_us == us(30)

    await placer.observer.observe_now("job", "RELIST", [a])  # job-b is gone from Kubernetes
    assert placer.observer.unserved == {}

    again = renamed(job_obj(), "job-b")
    again["metadata"]["creationTimestamp"] = ts(50)
    await placer.observer.observe_now("job", "ADDED", again)
    assert placer.observer.unserved == {("kestrel-acme", "job-b"): us(50)}


class TenantApplies:
    """A Kube that records which tenant objects were applied, each call a little slow
    (as an apiserver round trip is), so concurrent placements overlap."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    def _apply(self, what: str) -> None:
        time.sleep(0.01)
        self.applied.append(what)

    def apply_namespace(self, body: dict[str, Any]) -> None:
        self._apply("namespace")

    def apply_cluster(self, plural: str, body: dict[str, Any]) -> None:
        self._apply(plural)

    def apply_local_queue(self, body: dict[str, Any]) -> None:
        self._apply("localqueue")


class Profiles:
    def __init__(self) -> None:
        self.reads = 0

    async def profiles(self, tenants: list[str]) -> dict[str, TenantQuota]:
        self.reads += 1
        return {t: TenantQuota({"gpu-h100": 8}) for t in tenants}


async def test_a_new_tenants_first_burst_of_placements_applies_its_queues_once() -> None:
    """Twenty placements of a tenant the placer has not seen, at once (a fetched batch
    is placed concurrently): its namespace and queues are applied once, not twenty
    times; after its namespace vanished, the next burst applies them once again."""
    kube, store = TenantApplies(), Profiles()
    placer = Placer(cast(Any, kube), cast(Any, store), Recorder(), PlacerSettings())
    quotas = await asyncio.gather(*(placer.tenancy.tenant_quota("acme") for _ in range(20)))
    assert {q.limit("gpu-h100") for q in quotas} == {8}
    assert kube.applied == ["namespace", "clusterqueues", "localqueue"]
    assert store.reads == 1

    placer.tenancy.tenants.pop("acme")  # what place() does when the namespace is gone (a 404)
    await asyncio.gather(*(placer.tenancy.tenant_quota("acme") for _ in range(20)))
    assert kube.applied == ["namespace", "clusterqueues", "localqueue"] * 2


# --- Jobs: listed once, then known from what the placer creates -------------------

class EventRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[Derived] = []

    async def __call__(self, event: Derived) -> None:
        await super().__call__(event)
        self.events.append(event)


class JobKube:
    """The Kube calls place(), cancel() and requeue_stuck() make, against one namespace:
    a Job created is stored with a creation stamp; its Workload is whatever the test set."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.workload: dict[str, Any] | None = None
        self.deleted: list[str] = []

    def create_job(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        stored = json.loads(json.dumps(body))
        stored["metadata"]["creationTimestamp"] = ts(30)
        self.jobs[body["metadata"]["name"]] = stored
        return stored, True

    def read_job(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.jobs.get(name)

    def workload_of(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.workload

    def delete_job(self, ns: str, name: str) -> bool:
        self.deleted.append(name)
        return self.jobs.pop(name, None) is not None

    def touch_job(self, ns: str, name: str, stamp: str) -> bool:
        return name in self.jobs


async def placed(kube: JobKube, rec: Recorder, now: list[int]) -> Placer:
    """A synced placer (every kind listed empty) that has placed job JOB."""
    placer = Placer(cast(Any, kube), cast(Any, None), rec, PlacerSettings(),
                    clock=lambda: now[0])
    placer.tenancy.tenants[TENANT] = TenantQuota({"gpu-h100": 8, "gpu-a10": 8})
    for kind in ("workload", "job", "pod"):
        await placer.observer.observe_now(kind, "RELIST", [])
    assert await placer.place(AdmittedJob(JOB, TENANT, "n", 2, "", 60, 3, {}), False)
    return placer


async def test_a_job_the_placer_created_is_known_without_a_job_watch_until_its_workload_goes(
        ) -> None:
    """Jobs are listed once and not watched: the Job as created is what its events read
    (QUEUED, and the bound the meter holds each allocation to), it waits for its
    Workload in the requeue set, and the Workload's deletion (the garbage collector's,
    after the Job's) is the end of the job in the placer."""
    kube, rec, now = JobKube(), EventRecorder(), [us(31)]
    placer = await placed(kube, rec, now)
    key = (NS, JOB)
    assert rec.ids == [f"{JOB}:queued"]
    assert placer.observer.unserved == {key: us(30)}

    await placer.observer.observe_now("workload", "ADDED", workload(*RESERVED))
    assert rec.ids[1:] == [f"{JOB}:admitted"]
    assert rec.events[1].max_duration_s == 60  # the Job's activeDeadlineSeconds
    assert placer.observer.unserved == {} and placer.observer.served_us == us(30)

    done = workload(*RESERVED, cond("Finished", "True", 39, "Succeeded"))
    await placer.observer.observe_now("workload", "MODIFIED", done)
    assert key in placer.observer.views  # the Job is still there: so is the job
    await placer.observer.observe_now("workload", "DELETED", done)
    assert rec.ids[2:] == [f"{JOB}:finished"]
    assert placer.observer.views == {}


async def test_a_job_cancelled_before_kueue_gave_it_a_workload_is_forgotten_at_once() -> None:
    kube, rec, now = JobKube(), Recorder(), [us(31)]
    placer = await placed(kube, rec, now)
    assert await placer.cancel(TENANT, JOB) == (True, us(31))
    assert kube.deleted == [JOB]
    assert placer.observer.views == {} and placer.observer.unserved == {}


async def test_a_cancelled_job_with_a_workload_is_kept_until_the_watch_brings_its_deletion(
        ) -> None:
    """Its close is CANCELLED, published by the cancel: the Workload's deletion that
    follows closes nothing twice, and then the job is forgotten."""
    kube, rec, now = JobKube(), Recorder(), [us(40)]
    placer = await placed(kube, rec, now)
    await placer.observer.observe_now("workload", "ADDED", workload(*RESERVED))
    kube.workload = workload(*RESERVED)
    await placer.cancel(TENANT, JOB)
    assert rec.ids == [f"{JOB}:queued", f"{JOB}:admitted", f"{JOB}:cancelled"]
    assert (NS, JOB) in placer.observer.views
    await placer.observer.observe_now("workload", "DELETED", workload(*RESERVED, deleted_at=41))
    assert rec.ids[3:] == []
    assert placer.observer.views == {}


async def test_a_waiting_job_deleted_behind_the_placers_back_is_forgotten_when_touched(
        ) -> None:
    """An operator deleted a Job Kueue never gave a Workload: with no Job watch the
    placer learns it when its touch finds the Job gone (a 404), and stops touching it."""
    kube, rec, now = JobKube(), Recorder(), [us(31)]
    placer = await placed(kube, rec, now)
    kube.jobs.clear()
    now[0] = us(50)  # past the patience: Kueue served nobody for 15 s
    assert await placer.observer.requeue_stuck() == [(NS, JOB)]
    obs = placer.observer
    assert obs.views == {} and obs.unserved == {} and obs.touched == {}
    now[0] = us(59)
    assert await placer.observer.requeue_stuck() == []


class ListOnce:
    def __init__(self) -> None:
        self.lists = 0

    def list_raw(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.lists == 1:
            raise ApiException(status=503, reason="apiserver starting")
        return [{"metadata": {"name": "j1"}}], "10"

    def watch_raw(self, kind: str, rv: str, timeout_s: int) -> Iterator[list[dict[str, Any]]]:
        raise AssertionError("a list-once kind is not watched")


def test_jobs_are_listed_until_a_list_succeeds_and_then_not_watched() -> None:
    fake, stop = ListOnce(), threading.Event()
    seen: list[tuple[str, list[Any]]] = []
    watcher = Watcher(lambda: cast(Any, fake), JOBS, lambda k, c: seen.append((k, c)), stop,
                      watch=False)
    watcher.run()  # in this thread: returns after the first list that succeeded
    assert fake.lists == 2 and not stop.is_set()
    assert [(k, [t for t, _ in c]) for k, c in seen] == [(JOBS, ["RELIST"])]
    assert JOBS not in WATCHED and set(WATCHED) | {JOBS} == set(KINDS)
