"""The runway check controller writing its verdicts (RunwayCheckController.reconcile),
with the store and the Kueue client behind small fakes: patches go out side by side,
bounded; a refused one is decided again; a broken apiserver is reported after the rest."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from decimal import Decimal

import pytest
from kubernetes.client.exceptions import ApiException

from kestrel.checkfeed import WorkloadView
from kestrel.jobs import JobRow, JobState
from services.admission.kueue import PATCH_CONCURRENCY, RunwayCheckController
from services.admission.runway_check import CheckAnswer, Funds, verdict

CHECK = "kestrel-runway"


def row(job_id: str) -> JobRow:
    return JobRow(job_id, "acme", b"", JobState.ADMITTED, "", Decimal("1.2"), "gpu-h100", "",
                  "", "", 1, 0, 0, 0, 1, 0, 1, 60)


def pending(job_id: str) -> WorkloadView:
    return WorkloadView("kestrel-acme", f"job-{job_id}", job_id, "Pending", "", False, True,
                        False, tenant="acme")


class Store:
    def __init__(self, rows: dict[str, JobRow]) -> None:
        self.rows = rows

    async def get_many(self, ids: list[str]) -> dict[str, JobRow]:
        return {i: self.rows[i] for i in ids if i in self.rows}


class Admission:
    def __init__(self, rows: dict[str, JobRow]) -> None:
        self.store = Store(rows)


class Kueue:
    """set_check as the real client runs it (blocking, in a thread), slow enough that
    patches overlap; `fail` maps a Workload name to what its patch raises."""

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.fail = fail or {}
        self.patched: list[tuple[str, str]] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

    def set_check(self, w: WorkloadView, check: str, v: CheckAnswer) -> None:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(0.05)
            if w.name in self.fail:
                raise self.fail[w.name]
            with self.lock:
                self.patched.append((w.name, v.state.value))
        finally:
            with self.lock:
                self.in_flight -= 1


def controller(ids: list[str]) -> RunwayCheckController:
    rc = RunwayCheckController(Admission({i: row(i) for i in ids}),  # type: ignore[arg-type]
                               kubeconfig="", check=CHECK)
    rc.money = {"acme": Funds(Decimal(10), Decimal(2))}
    return rc


def test_verdicts_for_many_workloads_go_out_side_by_side_and_bounded() -> None:
    ids = [f"j{i}" for i in range(3 * PATCH_CONCURRENCY)]
    rc, kueue = controller(ids), Kueue()
    asyncio.run(rc.reconcile(kueue, [pending(i) for i in ids]))  # type: ignore[arg-type]
    assert sorted(n for n, _ in kueue.patched) == sorted(f"job-{i}" for i in ids)
    assert {s for _, s in kueue.patched} == {"Ready"}
    assert 1 < kueue.most_in_flight <= PATCH_CONCURRENCY
    assert not rc.dirty


def test_a_refused_patch_is_decided_again_and_the_others_are_written() -> None:
    ids = ["a", "b", "c"]
    rc = controller(ids)
    kueue = Kueue({"job-b": ApiException(status=422, reason="test op failed")})
    asyncio.run(rc.reconcile(kueue, [pending(i) for i in ids]))  # type: ignore[arg-type]
    assert sorted(n for n, _ in kueue.patched) == ["job-a", "job-c"]
    assert rc.dirty == {"kestrel-acme/job-b"}


def test_an_apiserver_that_is_gone_is_raised_after_the_other_patches_end() -> None:
    ids = ["a", "b", "c"]
    rc = controller(ids)
    kueue = Kueue({"job-a": ConnectionRefusedError("apiserver gone")})
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(rc.reconcile(kueue, [pending(i) for i in ids]))  # type: ignore[arg-type]
    assert sorted(n for n, _ in kueue.patched) == ["job-b", "job-c"]
    assert kueue.in_flight == 0


def test_workloads_already_carrying_their_verdict_are_not_patched() -> None:
    rc, kueue = controller(["a", "b"]), Kueue()
    v = verdict(row("a"), rc.money["acme"])
    done = replace(pending("a"), check_state=v.state.value, check_message=v.message)
    asyncio.run(rc.reconcile(kueue, [done, pending("b")]))  # type: ignore[arg-type]
    assert kueue.patched == [("job-b", "Ready")]
