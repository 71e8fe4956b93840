"""The admission outbox: a decision committed while NATS was away is announced once it
is back, unless the job has moved on (its newer state is announced by itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

import pytest

from kestrel.jobs import JobRow, JobState
from services.admission.outbox import Outbox


def row(job_id: str, state: JobState) -> JobRow:
    return JobRow(job_id, "acme", b"", state, "", Decimal("1"), "gpu-h100", "", "", "",
                  0, 0, 0, 0, 1, 0, 1, 60)


class Bus:
    """Sends fail while `down`; what went out is recorded in order."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[tuple[str, JobState, JobState | None]] = []

    async def send(self, r: JobRow, prev: JobState | None) -> None:
        if self.down:
            raise TimeoutError("nats: no response from stream")
        self.sent.append((r.job_id, r.state, prev))


class Store:
    def __init__(self, *rows: JobRow) -> None:
        self.rows = {r.job_id: r for r in rows}

    async def get_many(self, ids: Sequence[str]) -> dict[str, JobRow]:
        return {i: self.rows[i] for i in ids if i in self.rows}


async def test_an_admission_made_while_nats_is_away_is_announced_once_it_is_back() -> None:
    bus, store = Bus(), Store(row("j1", JobState.ADMITTED), row("j2", JobState.HELD))
    box = Outbox(bus.send, store.get_many)
    bus.down = True
    await box.publish(store.rows["j1"], None)
    await box.publish(store.rows["j2"], None)
    assert await box.retry() == 2 and bus.sent == []  # still away: still owed
    bus.down = False
    assert await box.retry() == 0
    assert bus.sent == [("j1", JobState.ADMITTED, None), ("j2", JobState.HELD, None)]
    assert await box.retry() == 0 and len(bus.sent) == 2  # nothing owed twice


async def test_a_job_that_moved_on_is_not_announced_in_its_old_state() -> None:
    bus, store = Bus(), Store(row("j1", JobState.ADMITTED))
    box = Outbox(bus.send, store.get_many)
    bus.down = True
    await box.publish(store.rows["j1"], None)
    store.rows["j1"] = replace(store.rows["j1"], state=JobState.CANCELLED)  # cancelled meanwhile
    bus.down = False
    assert await box.retry() == 0
    assert bus.sent == []  # the placer is never told to place a cancelled job


async def test_a_newer_announcement_that_goes_out_settles_the_older_one_owed() -> None:
    bus, store = Bus(), Store(row("j1", JobState.HELD))
    box = Outbox(bus.send, store.get_many)
    bus.down = True
    await box.publish(store.rows["j1"], None)
    bus.down = False
    store.rows["j1"] = replace(store.rows["j1"], state=JobState.ADMITTED)
    await box.publish(store.rows["j1"], JobState.HELD)
    assert box.pending == {}
    assert await box.retry() == 0
    assert bus.sent == [("j1", JobState.ADMITTED, JobState.HELD)]


async def test_an_announcement_cut_short_by_a_cancelled_rpc_is_still_owed_and_goes_out() -> None:
    # The RPC that admitted the job awaits its announcement; while NATS restarts the
    # publish waits out its ack timeout and the client's deadline cancels the RPC. The
    # retried submit finds the job by its key and announces nothing, so the outbox must.
    bus, store = Bus(), Store(row("j1", JobState.ADMITTED))
    box = Outbox(bus.send, store.get_many)
    entered = asyncio.Event()

    async def hangs(r: JobRow, prev: JobState | None) -> None:
        entered.set()
        await asyncio.Event().wait()  # a publish that never hears its ack

    box.send = hangs
    rpc = asyncio.create_task(box.publish(store.rows["j1"], None))
    await entered.wait()
    rpc.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rpc
    box.send = bus.send  # NATS is back
    assert await box.retry() == 0
    assert bus.sent == [("j1", JobState.ADMITTED, None)]


async def test_an_announcement_made_while_a_retry_reads_the_store_is_left_to_its_own_send() -> None:
    bus, store = Bus(), Store(row("j1", JobState.HELD))
    box = Outbox(bus.send, store.get_many)
    bus.down = True
    await box.publish(store.rows["j1"], None)  # HELD owed
    reading = asyncio.Event()
    go_on = asyncio.Event()
    stale = dict(store.rows)  # what the retry's read returns: still HELD

    async def slow_read(ids: Sequence[str]) -> dict[str, JobRow]:
        reading.set()
        await go_on.wait()
        return {i: stale[i] for i in ids if i in stale}

    box.read = slow_read
    retry = asyncio.create_task(box.retry())
    await reading.wait()
    # Released meanwhile: its ADMITTED announcement is owed and in flight (NATS still away).
    store.rows["j1"] = replace(store.rows["j1"], state=JobState.ADMITTED)
    await box.publish(store.rows["j1"], JobState.HELD)
    go_on.set()
    await retry
    # The stale read neither dropped the newer owed announcement nor re-sent the old one.
    assert box.pending == {"j1": (JobState.ADMITTED, JobState.HELD)}
    bus.down = False
    box.read = store.get_many
    assert await box.retry() == 0
    assert bus.sent == [("j1", JobState.ADMITTED, JobState.HELD)]


async def test_an_announcement_still_in_flight_is_not_sent_again_by_a_retry() -> None:
    bus, store = Bus(), Store(row("j1", JobState.ADMITTED))
    box = Outbox(bus.send, store.get_many)
    entered, ack = asyncio.Event(), asyncio.Event()

    async def slow(r: JobRow, prev: JobState | None) -> None:
        entered.set()
        await ack.wait()  # the stream's ack on its way
        await bus.send(r, prev)

    box.send = slow
    sending = asyncio.create_task(box.publish(store.rows["j1"], None))
    await entered.wait()
    assert await box.retry() == 1  # owed until acked, but its own send is on it
    ack.set()
    await sending
    assert box.pending == {} and box.sending == {}
    assert bus.sent == [("j1", JobState.ADMITTED, None)]
