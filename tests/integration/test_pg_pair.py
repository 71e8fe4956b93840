"""The meter on a Postgres pair (Patroni, a synchronous standby): kill -9 of the primary's
postmaster mid-stream fails over to the standby, and the ledger loses and doubles nothing.

The meter acknowledges a batch to JetStream only after its transaction committed, and a
commit returns only once the synchronous standby has the WAL: so the standby Patroni
promotes holds every batch the stream will not deliver again, and a batch cut off by the
kill is delivered again and written to the new primary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest

from kestrel.clock import now_us
from kestrel_sdk.v1 import meter_pb2, meter_pb2_grpc
from kestrel_tools.devstack import SUPERUSER, Stack, free_port
from kestrel_tools.procs import ServiceProcess
from services.meter import audit
from tests.integration.helpers import eventually, ledger_settles, publish_events, wev

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANTS = [f"pair-{i}" for i in range(4)]
ALLOCATIONS = 1_500  # x (admitted + finished) = 3,000 events


@pytest.fixture(scope="module")
def pair() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="kestrel-pair-", dir="/tmp"))
    os.chmod(root, 0o755)
    s = Stack(root, pg_nodes=2)
    s.start_postgres()
    try:
        yield s
    finally:
        s.destroy()


async def _connect(dsn: str) -> asyncpg.Connection | None:
    try:
        return await asyncpg.connect(dsn, timeout=2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None


async def test_kill_9_of_the_primary_mid_stream_fails_over_and_the_ledger_is_exact(
        pair: Stack, stack: Stack, clean_bus: str, tmp_path: Path) -> None:
    env = {**pair.service_dsns(), **stack.service_nats_urls(), "KESTREL_NATS_URL": clean_bus,
           "KESTREL_METER_PORT": str(free_port()), "KESTREL_METER_METRICS_PORT": "0",
           "KESTREL_METER_TICK_S": "0.2", "KESTREL_METER_BATCH": "100",
           "KESTREL_METER_GATHER_S": "0.05", "KESTREL_METER_ACK_WAIT_S": "2",
           "KESTREL_REDIS_URL": stack.redis_url}
    meter = ServiceProcess("meter", env, f"127.0.0.1:{env['KESTREL_METER_PORT']}",
                           tmp_path / "meter.log").start()
    db = await asyncpg.connect(pair.dsn(SUPERUSER))
    try:
        async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
            stub = meter_pb2_grpc.MeterStub(ch)
            for t in TENANTS:
                await stub.CreateAccount(meter_pb2.CreateAccountRequest(
                    tenant=t, initial_credits="1000"))
        t0 = now_us()
        spec = {f"pair-{i}": (1 + i % 4, 100_000 + (i * 7919) % 1_000_000)
                for i in range(ALLOCATIONS)}
        events = []
        for i, (wid, (gpus, length)) in enumerate(spec.items()):
            start = t0 + i * 10
            events.append(wev(f"{wid}-a", TENANTS[i % len(TENANTS)], wid, 1, start, gpus=gpus))
            events.append(wev(f"{wid}-f", TENANTS[i % len(TENANTS)], wid, 3, start + length,
                              gpus=gpus))
        first = pair.pg_primary()
        assert first is not None and pair.pg_pair_whole()
        streaming = asyncio.create_task(publish_events(clean_bus, events, concurrency=16))
        await eventually(lambda: db.fetchval("SELECT count(*) FROM workload_events"),
                         lambda n: n >= len(events) // 4, timeout_s=60)
        victim = pair.pg_postmaster_pid(first)
        assert victim
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        promoted = await eventually(lambda: asyncio.sleep(0, pair.pg_primary()),
                                    lambda p: p is not None and p != first, timeout_s=60)
        assert promoted is not None and promoted != first, "the standby took over"
        led_s = time.monotonic() - killed
        await streaming
        await db.close()
        again = await eventually(lambda: _connect(pair.dsn(SUPERUSER)),
                                 lambda c: c is not None, timeout_s=30)
        assert again is not None
        db = again
        await ledger_settles(db, spec, len(events))
        print(f"\npair failover: the standby led {led_s:.1f} s after kill -9 of the "
              "primary's postmaster; the ledger exact")
        assert (await audit.audit(db)).intact
        assert meter.proc is not None and meter.proc.poll() is None, "the meter rode it out"
        # The old primary rejoins as the synchronous standby: the pair is whole again.
        assert await eventually(lambda: asyncio.sleep(0, pair.pg_pair_whole()),
                                bool, timeout_s=90)
    finally:
        meter.stop()
        await db.close()
