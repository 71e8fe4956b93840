"""A budget fully reserved by covered jobs is not out of money (issue 10, item 8).

The meter (and then the whole plane, through the gateway and the SDK), as processes
over real Postgres and NATS: one job reserves the tenant's whole budget and runs.
Nothing is free to reserve and the unreserved runway is 0, but the money lasts as
long as the job's reservation — which the figures now say.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from decimal import Decimal

import asyncpg
import grpc
import pytest

from kestrel import bus
from kestrel.clock import now_us
from kestrel.db import migrate
from kestrel.pgroles import OWNER_ROLE
from kestrel_sdk import AsyncClient, JobState, Runway
from kestrel_sdk.v1 import common_pb2, events_pb2, meter_pb2, meter_pb2_grpc
from kestrel_tools.procs import ServiceProcess
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from tests.conftest import OPERATOR_TOKEN, Plane
from tests.integration.helpers import eventually, publish_events, wev

pytestmark = pytest.mark.integration


@pytest.fixture
async def stub(meter_factory: Callable[..., ServiceProcess]
               ) -> AsyncIterator[meter_pb2_grpc.MeterStub]:
    # 1 GPU at 0.01/GPU-s for 1000 s reserves exactly the 10 credits of the budget.
    meter = meter_factory(KESTREL_METER_TICK_S="0.2", KESTREL_PRICES="gpu-h100=0.01").start()
    async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
        yield meter_pb2_grpc.MeterStub(ch)


async def runway(stub: meter_pb2_grpc.MeterStub) -> common_pb2.Runway:
    resp = await stub.GetRunway(meter_pb2.GetRunwayRequest(tenant="acme"))
    figures: common_pb2.Runway = resp.runway
    return figures


async def test_a_fully_reserved_budget_has_nothing_free_but_its_money_lasts(
        stub: meter_pb2_grpc.MeterStub, database: str, clean_bus: str,
        role_dsn: Callable[[str], str]) -> None:
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="acme",
                                                            initial_credits="10"))
    nc = await bus.connect(clean_bus, "test-runway-money")
    changes: asyncio.Queue[events_pb2.RunwayChanged] = asyncio.Queue()

    async def on_msg(msg: object) -> None:
        await changes.put(events_pb2.RunwayChanged.FromString(msg.data))  # type: ignore[attr-defined]

    await nc.subscribe("kestrel.runway.acme", cb=on_msg)
    await nc.flush()

    # Admission's hold for the job: the whole budget (in admission's schema).
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        await migrate(owner, "admission", ADMISSION_MIGRATIONS)
    finally:
        await owner.close()
    db = await asyncpg.connect(database)
    try:
        await db.execute("INSERT INTO reservations VALUES ('r-1', 'acme', 'job-1', $1, $2)",
                         Decimal("10"), now_us())
    finally:
        await db.close()
    queued = await runway(stub)
    # Reserved but not yet running: nothing free, and nothing is being spent either.
    assert (queued.reserved, queued.remaining, queued.free_to_reserve) == ("10", "0", "0")
    assert queued.unlimited

    admitted = wev("a-1", "acme", "job-1", 1, now_us(), gpus=1, flavor="gpu-h100")
    admitted.max_duration_s = 1000
    await publish_events(clean_bus, [admitted])
    running = await eventually(lambda: runway(stub), lambda r: r.running_gpus == 1)
    assert running.burn_per_s == "0.01" and not running.unlimited
    # Still nothing free to reserve, and the unreserved runway is 0 as before ...
    assert (running.remaining, running.free_to_reserve, running.runway_s) == ("0", "0", 0.0)
    # ... but the money lasts as long as the job may run: (10 - charged) / 0.01 s.
    unspent = Decimal(running.credits) - Decimal(running.charged)
    assert running.money_runway_s == pytest.approx(float(unspent / Decimal("0.01")))
    assert 900 < running.money_runway_s <= 1000

    # The published change carries the same figures for every subscriber (its reason
    # is EXHAUSTED: what is free to reserve crossed to 0).
    async with asyncio.timeout(15):
        while True:
            change = await changes.get()
            if change.runway.running_gpus == 1:
                break
    assert change.runway.free_to_reserve == "0" and change.runway.runway_s == 0.0
    assert 900 < change.runway.money_runway_s <= 1000
    await nc.close()

    # And the SDK (the CLI's source) reads both, so no one is shown "runway 0.0s".
    r = Runway.from_pb(running)
    assert r.free_to_reserve == 0 and r.money_runway_s is not None and r.money_runway_s > 900


async def test_the_gateway_and_the_sdk_pass_both_figures_through(
        plane: Plane, clean_bus: str) -> None:
    async with AsyncClient(plane.address("gateway"), operator_token=OPERATOR_TOKEN) as op:
        await op.create_tenant("whole", gpu_quota={"gpu-h100": 8}, rate_per_s=100, burst=100,
                               initial_credits="10")
        key = await op.create_api_key("whole", "test")
    async with AsyncClient(plane.address("gateway"), api_key=key.secret) as c:
        # h100 at 0.01/GPU-s in this plane: 1 GPU x 1000 s reserves the whole budget.
        job = await c.submit_job(name="train", gpus=1, max_duration_s=1000, flavor="gpu-h100")
        assert job.state is JobState.ADMITTED and job.reserved == 10
        admitted = wev("a-w", "whole", job.job_id, 1, now_us(), gpus=1, flavor="gpu-h100")
        admitted.max_duration_s = 1000
        await publish_events(clean_bus, [admitted])  # what the placer reports once it runs
        r = await eventually(c.runway, lambda r: r.running_gpus == 1)
    assert (r.remaining, r.free_to_reserve, r.runway_s) == (Decimal(0), Decimal(0), 0.0)
    assert r.money_runway_s is not None and 900 < r.money_runway_s <= 1000
    assert r.unspent > 9


async def test_cancelling_a_job_kueue_has_queued_but_not_admitted_frees_its_hold(
        plane: Plane, clean_bus: str) -> None:
    """Regression: the placer's QUEUED event (its Job exists, Kueue has not admitted it)
    marked the hold as started, so a cancel left it to the meter's close, which never
    comes for a job that never ran: the hold stayed reserved for good."""
    async with AsyncClient(plane.address("gateway"), operator_token=OPERATOR_TOKEN) as op:
        await op.create_tenant("queued", gpu_quota={"gpu-h100": 8}, rate_per_s=100, burst=100,
                               initial_credits="10")
        key = await op.create_api_key("queued", "test")
    async with AsyncClient(plane.address("gateway"), api_key=key.secret) as c:
        job = await c.submit_job(name="waits", gpus=1, max_duration_s=100, flavor="gpu-h100")
        assert job.reserved == 1
        queued = wev("q-1", "queued", job.job_id, 6, now_us(), gpus=1, flavor="gpu-h100")
        await publish_events(clean_bus, [queued])  # the placer wrote its Job
        await eventually(lambda: c.get_job(job.job_id), lambda j: j.state is JobState.QUEUED)
        await c.cancel_job(job.job_id, reason="test")
        r = await eventually(c.runway, lambda r: r.reserved == 0, timeout_s=10)
        assert r.free_to_reserve == 10
        # ... and admission decides on the same figure: the whole budget is free again.
        again = await c.submit_job(name="whole", gpus=1, max_duration_s=1000,
                                   flavor="gpu-h100")
        assert again.state is JobState.ADMITTED
