"""The placer's consumer of admitted jobs, over fakes of its core and of the messages:
one read of which jobs were cancelled per fetched batch, each job acknowledged or
negatively acknowledged on its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kestrel_sdk.v1 import common_pb2, events_pb2
from services.placer.consumers import handle_admitted
from services.placer.core import AdmittedJob


class Msg:
    def __init__(self, job_id: str) -> None:
        self.subject = f"kestrel.jobs.admitted.t.{job_id}"
        self.headers = {"Kestrel-Type": events_pb2.JobAdmitted.DESCRIPTOR.full_name}
        self.data = events_pb2.JobAdmitted(job=common_pb2.Job(
            job_id=job_id, tenant="t",
            spec=common_pb2.JobSpec(name="n", gpus=1, max_duration_s=60))).SerializeToString()
        self.outcome = ""

    async def ack(self) -> None:
        self.outcome = "ack"

    async def nak(self, delay: float | None = None) -> None:
        self.outcome = "nak"


class Placer:
    def __init__(self, cancelled: set[str] | Exception,
                 failing: frozenset[str] = frozenset()) -> None:
        self.cancelled = cancelled
        self.failing = failing
        self.asked: list[list[str]] = []
        self.placed: list[tuple[str, bool]] = []

    async def cancelled_before(self, job_ids: Sequence[str]) -> set[str]:
        self.asked.append(list(job_ids))
        if isinstance(self.cancelled, Exception):
            raise self.cancelled
        return self.cancelled & set(job_ids)

    async def place(self, job: AdmittedJob, cancelled: bool) -> None:
        self.placed.append((job.job_id, cancelled))
        if job.job_id in self.failing:
            raise RuntimeError("apiserver away")


async def test_a_batch_is_asked_once_which_were_cancelled_and_each_job_acked_on_its_own(
        ) -> None:
    msgs = [Msg("j1"), Msg("j2"), Msg("j3")]
    placer = Placer({"j2"}, failing=frozenset({"j3"}))
    await handle_admitted(Any, placer, msgs)  # type: ignore[arg-type]
    assert placer.asked == [["j1", "j2", "j3"]]
    assert placer.placed == [("j1", False), ("j2", True), ("j3", False)]
    assert [m.outcome for m in msgs] == ["ack", "ack", "nak"]  # a failed one comes back


async def test_a_batch_whose_cancel_read_fails_is_placed_by_nobody_and_comes_back_whole(
        ) -> None:
    msgs = [Msg("j1"), Msg("j2")]
    placer = Placer(RuntimeError("postgres away"))
    await handle_admitted(Any, placer, msgs)  # type: ignore[arg-type]
    assert placer.placed == []
    assert [m.outcome for m in msgs] == ["nak", "nak"]
