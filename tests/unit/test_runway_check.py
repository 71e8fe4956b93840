"""The runway AdmissionCheck's decisions, without Kubernetes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kestrel.checkfeed import WorkloadView, view
from kestrel.jobs import JobRow, JobState
from kestrel_sdk.v1 import common_pb2
from services.admission.kueue import RunwayCheckController, idle_wait_s
from services.admission.runway_check import (
    CheckState,
    Funds,
    changes,
    decides_alike,
    money_of,
    settled,
    to_deactivate,
    unsettled,
    verdict,
)


def job(state: JobState, reason: str = "needs 1 credit, 0 remain") -> JobRow:
    return JobRow("job-1", "acme", b"", state, reason, Decimal("1.2"), "gpu-h100", "", "", "",
                  1, 0, 0, 0, 1, 0, 1, 60)


FINE = Funds(Decimal(10), Decimal(2))
SPENT = Funds(Decimal(10), Decimal(10))


@pytest.mark.parametrize(("name", "state", "money", "want", "says"), [
    ("an admitted job with money left is ready", JobState.ADMITTED, FINE, CheckState.READY,
     "reservation of 1.2"),
    ("a queued job is ready", JobState.QUEUED, FINE, CheckState.READY, "reservation"),
    ("a held job waits with admission's reason", JobState.HELD, FINE, CheckState.PENDING,
     "held by Kestrel for budget: needs 1 credit"),
    ("a reserved job of a tenant whose money is spent waits", JobState.ADMITTED, SPENT,
     CheckState.PENDING, "budget is spent"),
    ("a cancelled job is rejected", JobState.CANCELLED, FINE, CheckState.REJECTED, "cancelled"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_verdict(name: str, state: JobState, money: Funds, want: CheckState,
                 says: str) -> None:
    v = verdict(job(state), money)
    assert v.state is want and says in v.message


def wl(check: str = "Pending", message: str = "", admitted: bool = False,
       active: bool = True, job_id: str = "job-1", finished: bool = False) -> WorkloadView:
    return WorkloadView("kestrel-acme", "job-job-1-abc", job_id, check, message, admitted,
                        active, finished, tenant="acme")


@pytest.mark.parametrize(("name", "w", "money", "want"), [
    ("a new workload is decided", wl(""), FINE, False),
    ("a held workload is decided again", wl("Pending"), FINE, False),
    ("a ready workload of a tenant with money is left alone", wl("Ready", admitted=True),
     FINE, True),
    ("a ready workload of a tenant whose money is unknown is left alone", wl("Ready"), None,
     True),
    ("a ready workload of a spent tenant is decided (pending or deactivated)",
     wl("Ready", admitted=True), SPENT, False),
    ("a finished workload is left alone", wl("Pending", finished=True), SPENT, True),
    ("a deactivated workload is left alone", wl("Ready", admitted=True, active=False), SPENT,
     True),
], ids=lambda x: x if isinstance(x, str) else "")
def test_settled(name: str, w: WorkloadView, money: Funds | None, want: bool) -> None:
    assert settled(w, money) is want


def test_only_unsettled_workloads_are_looked_up() -> None:
    new, ready = wl(""), wl("Ready", admitted=True)
    assert unsettled([new, ready], {"acme": FINE}) == [new]
    assert unsettled([new, ready], {"acme": SPENT}) == [new, ready]


def test_only_differences_are_patched() -> None:
    ready = verdict(job(JobState.ADMITTED), FINE)
    assert changes([wl("Ready", ready.message)], {"job-1": job(JobState.ADMITTED)},
                   {"acme": FINE}) == []
    assert len(changes([wl()], {"job-1": job(JobState.ADMITTED)}, {"acme": FINE})) == 1


def test_spending_alone_does_not_patch_a_workload_again() -> None:
    running = {"job-1": job(JobState.RUNNING)}
    before = verdict(running["job-1"], FINE)
    later = Funds(Decimal(10), Decimal(7))  # ticks charged more since
    assert changes([wl("Ready", before.message)], running, {"acme": later}) == []
    spent = verdict(running["job-1"], SPENT)
    more = Funds(Decimal(10), Decimal(12))
    assert changes([wl("Pending", spent.message)], running, {"acme": more}) == []


def test_workloads_of_jobs_this_admission_does_not_know_are_left_alone() -> None:
    assert changes([wl(job_id="job-elsewhere")], {}, {}) == []
    assert to_deactivate([wl(admitted=True, job_id="job-elsewhere")], {}, {}) == []


def test_admitted_workloads_of_a_spent_tenant_are_deactivated_once_active() -> None:
    jobs = {"job-1": job(JobState.RUNNING)}
    assert to_deactivate([wl(admitted=True)], jobs, {"acme": SPENT}) == [wl(admitted=True)]
    assert to_deactivate([wl(admitted=True)], jobs, {"acme": FINE}) == []
    assert to_deactivate([wl(admitted=True, active=False)], jobs, {"acme": SPENT}) == []
    assert to_deactivate([wl(admitted=False)], jobs, {"acme": SPENT}) == []


def test_a_workload_view_reads_our_check_entry_owner_and_conditions() -> None:
    obj = {"metadata": {"namespace": "kestrel-acme", "name": "w",
                        "ownerReferences": [{"kind": "Job", "name": "job-1"}]},
           "spec": {"active": True, "podSets": [{"name": "main", "template": {"metadata": {
               "labels": {"kestrel.dev/tenant": "acme", "kestrel.dev/job-id": "job-1"}}}}]},
           "status": {"admissionChecks": [{"name": "kestrel-runway", "state": "Ready",
                                           "message": "ok"}],
                      "conditions": [{"type": "Admitted", "status": "True"}]}}
    v = view(obj, "kestrel-runway")
    assert v is not None
    assert (v.job_id, v.check_state, v.admitted, v.tenant) == ("job-1", "Ready", True, "acme")
    assert view(obj, "another-check") is None


def test_the_money_a_runway_carries_is_what_the_check_decides_spent_on() -> None:
    fresh = money_of(common_pb2.Runway(tenant="acme", credits="10.5", charged="2.25"))
    assert fresh == Funds(Decimal("10.5"), Decimal("2.25")) and not fresh.spent
    assert money_of(common_pb2.Runway(tenant="acme", credits="3", charged="3")).spent
    assert money_of(common_pb2.Runway(tenant="acme")).spent  # nothing topped up yet


@pytest.mark.parametrize(("name", "old", "new", "alike"), [
    ("charging more with money left decides alike", FINE, Funds(Decimal(10), Decimal(7)),
     True),
    ("a top-up with money left decides alike", FINE, Funds(Decimal(50), Decimal(2)), True),
    ("spending the last of it does not", FINE, SPENT, False),
    ("a top-up of a spent tenant does not", SPENT, Funds(Decimal(20), Decimal(10)), False),
    ("a spent tenant's smaller top-up changes its message", SPENT,
     Funds(Decimal(11), Decimal(12)), False),
    ("a spent tenant charged more keeps its verdicts", SPENT, Funds(Decimal(10), Decimal(12)),
     True),
])
def test_decides_alike(name: str, old: Funds, new: Funds, alike: bool) -> None:
    assert decides_alike(old, new) is alike
    # What it promises, on a pending Workload and a Ready one: the same decisions.
    for w in (WorkloadView("ns", "w", "job-1", "Pending", "", False, True, False,
                           tenant="acme"),
              WorkloadView("ns", "w", "job-1", "Ready", "", False, True, True,
                           tenant="acme")):
        for state in (JobState.ADMITTED, JobState.HELD):
            same = (verdict(job(state), old) == verdict(job(state), new)
                    and settled(w, old) == settled(w, new))
            assert same or not alike, name


def test_a_runway_that_decides_alike_wakes_no_tenant_pass() -> None:
    rc = RunwayCheckController(None, "", "kestrel-runway")  # type: ignore[arg-type]
    rc.heard(common_pb2.Runway(tenant="acme", credits="10", charged="2"))
    assert rc.stale == {"acme"}  # the first money heard: decide with it
    rc.stale.clear()
    rc.heard(common_pb2.Runway(tenant="acme", credits="10", charged="7"))
    assert rc.stale == set() and rc.money["acme"] == Funds(Decimal(10), Decimal(7))
    rc.heard(common_pb2.Runway(tenant="acme", credits="10", charged="10"))
    assert rc.stale == {"acme"}  # spent: its Workloads wait, admitted ones stop


@pytest.mark.parametrize(("now", "full_at", "active_at", "retry", "wait"), [
    (101.0, 100.0, 100.0, False, 4.0),   # the next full pass comes first (every 5 s)
    (101.0, 100.0, 93.0, False, 2.0),    # the Active renewal (every 10 s) comes first
    (101.0, 100.0, 0.0, False, 1.0),     # the AdmissionCheck not there yet: look each second
    (101.0, 100.0, 100.0, True, 1.0),    # a failed pass is tried again after a second
    (106.0, 100.0, 100.0, False, 0.0),   # overdue: at once
], ids=["until-the-next-full-pass", "until-the-active-renewal", "check-not-created-yet",
        "after-a-failure", "overdue"])
def test_an_idle_controller_sleeps_until_its_next_duty_not_every_second(
        now: float, full_at: float, active_at: float, retry: bool, wait: float) -> None:
    assert idle_wait_s(now, full_at, 5.0, active_at, retry) == wait
