"""Two meter processes consume one stream: every row once, runways ordered, a kill -9 survived.

Both replicas pull from the same durable consumer, so JetStream hands each batch to one
of them; both take top-ups over gRPC. Their writes take turns on Postgres' meter_head row
(meter migration 0010), each replica reading what the other committed before it decides.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable
from decimal import Decimal

import asyncpg
import grpc
import pytest
from nats.aio.msg import Msg

from kestrel import bus
from kestrel.clock import now_us
from kestrel.runway import Runways
from kestrel_sdk.v1 import events_pb2, meter_pb2, meter_pb2_grpc
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from services.meter import audit
from tests.integration.helpers import eventually, ledger_settles, publish_events, wev

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANTS = [f"rep-{i}" for i in range(6)]
ALLOCATIONS = 3_000  # x (admitted + finished) = 6,000 events
TOP_UPS = 40  # per replica, spread over the tenants


def _replica(meter_factory: Callable[..., ServiceProcess]) -> tuple[ServiceProcess, int]:
    metrics = free_port()
    proc = meter_factory(KESTREL_METER_PORT=str(free_port()),
                         KESTREL_METER_METRICS_PORT=str(metrics), KESTREL_METER_TICK_S="0.1",
                         KESTREL_METER_BATCH="100", KESTREL_METER_GATHER_S="0.05",
                         KESTREL_METER_ACK_WAIT_S="2")
    return proc.start(), metrics


async def _writes(metrics_port: int) -> float:
    """Ledger transactions a replica committed (its write-latency histogram's count)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = (await asyncio.to_thread(
        lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
    m = re.search(r"^kestrel_ledger_write_seconds_count (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _top_up(address: str, replica: int) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = meter_pb2_grpc.MeterStub(ch)
        for k in range(TOP_UPS):
            await stub.TopUp(meter_pb2.TopUpRequest(
                tenant=TENANTS[k % len(TENANTS)], amount="1.5",
                top_up_id=f"rep-top-{replica}-{k}"))


async def test_two_replicas_meter_every_row_once_and_one_survives_the_others_kill_9(
        meter_factory: Callable[..., ServiceProcess], database: str, clean_bus: str) -> None:
    (a, a_metrics), (b, b_metrics) = _replica(meter_factory), _replica(meter_factory)
    db = await asyncpg.connect(database)
    runways = Runways()
    nc = await bus.connect(clean_bus, "test-runways")

    async def on_runway(msg: Msg) -> None:
        runways.take(bus.parse(msg, events_pb2.RunwayChanged).runway)

    await nc.subscribe("kestrel.runway.>", cb=on_runway)
    async with grpc.aio.insecure_channel(a.grpc_address) as ch:
        stub = meter_pb2_grpc.MeterStub(ch)
        for t in TENANTS:
            await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant=t,
                                                                    initial_credits="1000"))
    t0 = now_us()
    spec = {f"rep-{i}": (1 + i % 8, 100_000 + (i * 7919) % 2_000_000)
            for i in range(ALLOCATIONS)}
    events = []
    for i, (wid, (gpus, length)) in enumerate(spec.items()):
        tenant, start = TENANTS[i % len(TENANTS)], t0 + i * 10
        events.append(wev(f"{wid}-a", tenant, wid, 1, start, gpus=gpus))
        events.append(wev(f"{wid}-f", tenant, wid, 3, start + length, gpus=gpus))
    # Two thirds while both run (and both take top-ups), the rest after one is killed
    # (the kill lands while the first part may still be in flight: redelivered).
    cut = len(events) * 2 // 3
    streaming = asyncio.create_task(publish_events(clean_bus, events[:cut], concurrency=32))
    await asyncio.gather(_top_up(a.grpc_address, 0), _top_up(b.grpc_address, 1))
    both = await eventually(lambda: asyncio.gather(_writes(a_metrics), _writes(b_metrics)),
                            lambda w: min(w) >= 5, timeout_s=60)
    assert min(both) >= 5, f"each replica should have committed writes: {both}"
    b.kill9()
    await streaming
    await publish_events(clean_bus, events[cut:], concurrency=32)

    await ledger_settles(db, spec, len(events))
    # The survivor answers each tenant's figure as the rows sum it; and so does the
    # newest figure on the stream, ordered by meter version whichever replica sent it.
    expected = {r["tenant"]: (r["credits"], r["charged"]) for r in await db.fetch("""
        SELECT t.tenant, (SELECT sum(amount) FROM credits c WHERE c.tenant = t.tenant) credits,
               (SELECT coalesce(sum(cost), 0) FROM ledger l WHERE l.tenant = t.tenant) charged
        FROM tenants t WHERE t.tenant = ANY($1::text[])""", TENANTS)}
    assert {t: c for t, (c, _) in expected.items()} == {
        t: Decimal(1000) + Decimal("1.5") * 2 * sum(1 for k in range(TOP_UPS)
                                                    if TENANTS[k % len(TENANTS)] == t)
        for t in TENANTS}
    async with grpc.aio.insecure_channel(a.grpc_address) as ch:
        stub = meter_pb2_grpc.MeterStub(ch)
        answered = {t: (await stub.GetRunway(meter_pb2.GetRunwayRequest(tenant=t))).runway
                    for t in TENANTS}
    assert {t: (Decimal(r.credits), Decimal(r.charged)) for t, r in answered.items()} \
        == expected
    streamed = await eventually(
        lambda: asyncio.sleep(0, {t: (Decimal(runways[t].credits), Decimal(runways[t].charged))
                                  for t in TENANTS if t in runways}),
        lambda s: s == expected, timeout_s=10)
    assert streamed == expected
    assert (await audit.audit(db)).intact
    await nc.drain()
    await db.close()
