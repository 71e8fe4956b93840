"""Who may take the Lease (kestrel/lease.py decide): client-go's leaderelection rule."""

from __future__ import annotations

import asyncio

import pytest

from kestrel.lease import Seen, Step, decide, while_leading

ME = "autoscaler-a"


@pytest.mark.parametrize(("name", "seen", "now", "want"), [
    ("no Lease yet: take it", None, 100.0, Step.TAKE),
    ("a Lease nobody holds (released on a clean stop): take it",
     Seen("", 90.0, 5), 100.0, Step.TAKE),
    ("ours: renew it", Seen(ME, 99.0, 5), 100.0, Step.RENEW),
    ("ours even when it expired: renew (nobody else wrote it)", Seen(ME, 50.0, 5), 100.0,
     Step.RENEW),
    ("another's, renewed within its duration: follow", Seen("b", 96.0, 5), 100.0,
     Step.FOLLOW),
    ("another's, exactly at its expiry: still follow", Seen("b", 95.0, 5), 100.0,
     Step.FOLLOW),
    ("another's, not renewed for longer than its duration: take it",
     Seen("b", 94.9, 5), 100.0, Step.TAKE),
    ("another's without a renew time: take it", Seen("b", None, 5), 100.0, Step.TAKE),
])
def test_decide(name: str, seen: Seen | None, now: float, want: Step) -> None:
    assert decide(seen, ME, now) is want, name


class FakeElector:
    """What while_leading reads of an Elector: whether it leads, and its Lease's name."""

    name, namespace = "kestrel-test", "default"

    def __init__(self) -> None:
        self.leading = False


async def test_the_leaders_work_runs_only_while_it_leads_and_again_when_it_leads_again(
) -> None:
    elector, stop = FakeElector(), asyncio.Event()
    runs: list[str] = []

    async def work(until: asyncio.Event) -> None:
        runs.append("start")
        await until.wait()
        runs.append("end")

    task = asyncio.create_task(while_leading(elector, stop, work, poll_s=0.01))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert runs == []  # a standby does nothing of it
    elector.leading = True
    await asyncio.sleep(0.05)
    assert runs == ["start"]
    elector.leading = False
    await asyncio.sleep(0.05)
    assert runs == ["start", "end"]  # the Lease lost: the work was told and has ended
    elector.leading = True
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert runs == ["start", "end", "start", "end"]


async def test_a_leaders_work_that_fails_is_started_again_while_it_still_leads() -> None:
    elector, stop = FakeElector(), asyncio.Event()
    elector.leading = True
    starts = 0

    async def work(until: asyncio.Event) -> None:
        nonlocal starts
        starts += 1
        if starts == 1:
            raise RuntimeError("the apiserver went away")
        await until.wait()

    task = asyncio.create_task(while_leading(elector, stop, work, poll_s=0.01))  # type: ignore[arg-type]
    await asyncio.sleep(1.3)  # the failure is retried after a second
    stop.set()
    await asyncio.wait_for(task, 1)
    assert starts == 2
