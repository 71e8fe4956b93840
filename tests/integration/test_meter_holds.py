"""The meter's reserved figure follows admission's holds from its announcements.

The meter as a process over real Postgres and NATS keeps every open hold in memory
(domain.HoldBook). A job's change on kestrel.jobs.state makes it read that job's holds
again, and publish the tenant's runway when its reserved figure moved; a hold written
without any announcement (one lost while NATS was away) shows at the next resync.
Nothing here asks GetRunway, which would read the tenant's holds itself.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal

import asyncpg
import grpc
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from kestrel import bus
from kestrel.clock import now_us
from kestrel.db import migrate
from kestrel.pgroles import OWNER_ROLE
from kestrel_sdk.v1 import common_pb2, events_pb2, meter_pb2, meter_pb2_grpc
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS

pytestmark = pytest.mark.integration


class Bench:
    """A meter process, admission's schema, and a tap on the tenant's runway changes
    made for a reservation (their `reserved` figure, in order)."""

    def __init__(self, database: str, js: JetStreamContext, metrics_port: int) -> None:
        self.database = database
        self.js = js
        self.metrics_port = metrics_port
        self.reserved: asyncio.Queue[str] = asyncio.Queue()

    async def on_runway(self, msg: Msg) -> None:
        change = events_pb2.RunwayChanged.FromString(msg.data)
        if change.reason == events_pb2.RUNWAY_CHANGE_REASON_RESERVATION:
            await self.reserved.put(change.runway.reserved)

    async def next_reserved(self) -> str:
        return await asyncio.wait_for(self.reserved.get(), timeout=10)

    async def announce(self, job_id: str, to: common_pb2.JobState.ValueType) -> None:
        """What admission publishes once a job's change (and its hold) committed."""
        msg = events_pb2.JobStateChanged(job_id=job_id, tenant="acme", to_state=to,
                                         time_us=now_us())
        await bus.publish(self.js, bus.subject_job_state("acme"), msg, f"state-{job_id}-{to}")

    async def stale_tenants_read(self) -> float:
        """The meter's kestrel_meter_resync_stale_tenants_total, from its /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        for line in text.decode().splitlines():
            if line.startswith("kestrel_meter_resync_stale_tenants_total "):
                return float(line.split()[1])
        raise AssertionError("kestrel_meter_resync_stale_tenants_total is not exported")

    async def sql(self, statement: str, *args: object) -> None:
        db = await asyncpg.connect(self.database)
        try:
            await db.execute(statement, *args)
        finally:
            await db.close()


@pytest.fixture
async def bench_of(meter_factory: Callable[..., ServiceProcess], database: str,
                   clean_bus: str, role_dsn: Callable[[str], str]
                   ) -> AsyncIterator[Callable[[str], Awaitable[Bench]]]:
    conns: list[NATS] = []

    async def make(resync_s: str) -> Bench:
        metrics_port = free_port()
        meter = meter_factory(KESTREL_METER_HOLDS_RESYNC_S=resync_s,
                              KESTREL_METER_METRICS_PORT=str(metrics_port)).start()
        async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
            await meter_pb2_grpc.MeterStub(ch).CreateAccount(
                meter_pb2.CreateAccountRequest(tenant="acme", initial_credits="10"))
        owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
        try:
            await migrate(owner, "admission", ADMISSION_MIGRATIONS)
        finally:
            await owner.close()
        nc = await bus.connect(clean_bus, "test-meter-holds")
        conns.append(nc)
        b = Bench(database, nc.jetstream(), metrics_port)
        await nc.subscribe("kestrel.runway.acme", cb=b.on_runway)
        await nc.flush()
        return b

    yield make
    for nc in conns:
        await nc.close()


async def test_a_jobs_announcement_makes_the_meter_read_its_holds_again(
        bench_of: Callable[[str], Awaitable[Bench]]) -> None:
    b = await bench_of("3600")  # no resync: only the announcements can move the figure
    # Admission commits a hold, then announces the job: the meter reads that job's.
    await b.sql("INSERT INTO reservations VALUES ('job-1', 'acme', 'job-1', $1, $2)",
                Decimal("2"), now_us())
    await b.announce("job-1", common_pb2.JOB_STATE_ADMITTED)
    assert await b.next_reserved() == "2"
    # Released as the job ends: announced, read again, gone.
    await b.sql("INSERT INTO reservation_releases VALUES ('job-1', 'done', $1)", now_us())
    await b.announce("job-1", common_pb2.JOB_STATE_SUCCEEDED)
    assert await b.next_reserved() == "0"


async def test_a_hold_nobody_announced_shows_at_the_next_resync(
        bench_of: Callable[[str], Awaitable[Bench]]) -> None:
    """As one whose announcement was lost while NATS was away (plain NATS: no replay)."""
    b = await bench_of("1")
    await b.sql("INSERT INTO reservations VALUES ('job-2', 'acme', 'job-2', $1, $2)",
                Decimal("3"), now_us())
    assert await b.next_reserved() == "3"
    assert await b.stale_tenants_read() >= 1
    # Released, unannounced too: the resync's per-tenant count and sum no longer agree
    # with the meter's, so it reads the tenant again.
    await b.sql("INSERT INTO reservation_releases VALUES ('job-2', 'done', $1)", now_us())
    assert await b.next_reserved() == "0"


async def test_a_resync_that_finds_nothing_changed_publishes_nothing(
        bench_of: Callable[[str], Awaitable[Bench]]) -> None:
    """Holds the meter was told of: each resync's per-tenant count and sum agree, so
    no tenant is read whole and nothing is published again; an unannounced change
    still shows at the next one."""
    b = await bench_of("0.2")
    await b.sql("INSERT INTO reservations VALUES ('job-3', 'acme', 'job-3', $1, $2)",
                Decimal("4"), now_us())
    await b.announce("job-3", common_pb2.JOB_STATE_ADMITTED)
    assert await b.next_reserved() == "4"
    # A resync may have come between the insert and the announcement, and read the
    # tenant itself: count from here.
    before = await b.stale_tenants_read()
    await asyncio.sleep(1.5)  # seven resyncs
    assert b.reserved.empty()
    assert await b.stale_tenants_read() == before  # none read whole: the figures agreed
    await b.sql("INSERT INTO reservations VALUES ('job-4', 'acme', 'job-4', $1, $2)",
                Decimal("0.5"), now_us())
    assert await b.next_reserved() == "4.5"
