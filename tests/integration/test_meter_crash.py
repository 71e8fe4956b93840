"""kill -9 of the meter while 10,000 events stream in, then restart: nothing lost, nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from kestrel.clock import now_us
from kestrel_tools.procs import ServiceProcess
from tests.integration.helpers import eventually, ledger_settles, publish_events, wev

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALLOCATIONS = 5_000  # x (admitted + finished) = 10,000 events


async def test_kill_9_mid_stream_then_restart_loses_and_duplicates_nothing(
        meter_factory: Callable[..., ServiceProcess], database: str, clean_bus: str) -> None:
    meter = meter_factory(KESTREL_METER_TICK_S="0.1", KESTREL_METER_BATCH="200").start()
    db = await asyncpg.connect(database)
    t0 = now_us()
    spec = {f"crash-{i}": (1 + i % 8, 100_000 + (i * 7919) % 3_000_000) for i in range(ALLOCATIONS)}
    events = []
    for i, (wid, (gpus, length)) in enumerate(spec.items()):
        start = t0 + i * 10
        events.append(wev(f"{wid}-a", f"tenant-{i % 7}", wid, 1, start, gpus=gpus))
        events.append(wev(f"{wid}-f", f"tenant-{i % 7}", wid, 3, start + length, gpus=gpus))
    streaming = asyncio.create_task(publish_events(clean_bus, events, concurrency=64))

    seen = await eventually(lambda: db.fetchval("SELECT count(*) FROM workload_events"),
                            lambda n: n >= 1_500, timeout_s=60)
    meter.kill9()
    assert 0 < seen < len(events), "the kill must land mid-stream"
    await streaming
    meter_factory(KESTREL_METER_TICK_S="0.1", KESTREL_METER_BATCH="200").start()

    await ledger_settles(db, spec, len(events))
    await db.close()
