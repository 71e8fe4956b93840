"""Small helpers for integration tests: publishing workload events, waiting on SQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from kestrel import bus
from kestrel_sdk.v1 import common_pb2, events_pb2

T = TypeVar("T")
T0 = 1_700_000_000_000_000


def wev(event_id: str, tenant: str, workload_id: str, typ: int, time_us: int, gpus: int = 1,
        flavor: str = "gpu-h100") -> events_pb2.WorkloadEvent:
    return events_pb2.WorkloadEvent(
        event_id=event_id, tenant=tenant, workload_id=workload_id,
        kind=common_pb2.WORKLOAD_KIND_JOB, type=typ,  # type: ignore[arg-type]
        time_us=time_us, flavor=flavor, gpus=gpus)


async def publish_events(nats_url: str, events: Sequence[events_pb2.WorkloadEvent],
                         msg_id_suffix: str = "", concurrency: int = 256) -> None:
    """Publish to JetStream with acks.

    Each call's Nats-Msg-Ids carry a nonce: tests reuse event ids, and JetStream's
    duplicate window (2 min) outlives a stream purge, so without it a later test's
    events would be dropped before the meter saw them. The meter's own idempotency
    is by event id, which is what the tests exercise."""
    nc = await bus.connect(nats_url, "test-publisher")
    js = nc.jetstream()
    sem = asyncio.Semaphore(concurrency)
    nonce = uuid.uuid4().hex[:8]

    async def one(e: events_pb2.WorkloadEvent) -> None:
        async with sem:
            await bus.publish(js, bus.subject_workload(e.tenant, int(e.type)), e,
                              f"{e.event_id}{msg_id_suffix}~{nonce}")

    await asyncio.gather(*(one(e) for e in events))
    await nc.drain()


async def eventually(fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool],
                     timeout_s: float = 30.0) -> T:
    """Poll fn until ok(result); returns the last result (assert on it afterwards)."""
    deadline = time.monotonic() + timeout_s
    value = await fn()
    while not ok(value) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        value = await fn()
    return value


async def ledger_settles(db: Any, spec: dict[str, tuple[int, int]], events: int) -> None:
    """After a stream of `events` for `spec` (workload -> (gpus, length_us)): every event
    stored, every allocation closed, and each workload's rows sum to gpus x length, none
    closed twice (what a kill -9 mid-stream must not change)."""
    stored = await eventually(lambda: db.fetchval("SELECT count(*) FROM workload_events"),
                              lambda n: n == events, timeout_s=120)
    assert stored == events
    open_left = await eventually(
        lambda: db.fetchval("SELECT count(*) FROM allocations WHERE status <> 2"),
        lambda n: n == 0, timeout_s=30)
    assert open_left == 0
    sums = {r["workload_id"]: (r["g"], r["closing"]) for r in await db.fetch("""
        SELECT workload_id, sum(gpu_us) g,
               count(*) FILTER (WHERE cause_id NOT LIKE 'tick-%') closing
        FROM ledger GROUP BY workload_id""")}
    lost = [w for w in spec if w not in sums]
    wrong = [w for w, (gpus, length) in spec.items() if w in sums and sums[w][0] != gpus * length]
    closed_twice = [w for w, (_, closing) in sums.items() if closing > 1]
    assert (lost, wrong, closed_twice) == ([], [], [])
