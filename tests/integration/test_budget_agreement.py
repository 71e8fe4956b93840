"""One budget, read two ways, agrees with the ledger (issue 11, item 1).

The meter (its projection and its reserved figure read through admission's
`open_holds`) and admission (its books and the meter's `meter_budget()`) run over one
real Postgres, fed the same history: top-ups, adjustments, submissions (holds),
starts, ticks (ledger rows) and ends. After every step the meter's published
remaining, admission's remaining for its next decision and a recomputation from the
rows themselves (credits, ledger, open reservations, allocations) are the same figure,
at the same ledger sequence.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kestrel.db import create_pool
from kestrel.workloads import EventType
from kestrel_sdk.v1 import common_pb2
from services.admission.core import Admission
from services.admission.domain import JobAsk
from services.admission.store import AdmissionStore
from services.meter.core import Meter, MeterSettings
from services.meter.domain import Event
from services.meter.store import MeterStore

pytestmark = pytest.mark.integration
T0 = 1_700_000_000_000_000
PRICE = Decimal("0.001")


@pytest.fixture
async def pool(database: str, owner: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(database, max_size=4)
    yield p
    await p.close()


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> int:
        return self.t


step = st.one_of(
    st.tuples(st.just("top_up"), st.integers(1, 50)),
    st.tuples(st.just("adjust"), st.integers(-30, 30).filter(bool)),
    st.tuples(st.just("submit"), st.integers(1, 4), st.integers(1, 60)),  # gpus, seconds
    st.tuples(st.just("start"), st.integers(0, 9)),
    st.tuples(st.just("tick"), st.integers(1, 20)),  # seconds
    st.tuples(st.just("end"), st.integers(0, 9)),
)


async def recomputed(pool: asyncpg.Pool, tenant: str) -> tuple[Decimal, int]:
    """credits - charged - held, from the rows alone, and the highest ledger row."""
    r = await pool.fetchrow("""
        SELECT (SELECT coalesce(sum(amount), 0) FROM credits WHERE tenant = $1) AS credits,
               (SELECT coalesce(sum(cost), 0) FROM ledger WHERE tenant = $1) AS charged,
               (SELECT coalesce(max(row_id), 0) FROM ledger) AS seq,
               (SELECT coalesce(sum(CASE
                    WHEN a.workload_id IS NULL OR r.rolling THEN r.amount
                    ELSE greatest(r.amount - coalesce((SELECT sum(l.cost) FROM ledger l
                                  WHERE l.workload_id = r.workload_id), 0), 0) END), 0)
                FROM reservations r
                LEFT JOIN allocations a ON a.workload_id = r.workload_id
                WHERE r.tenant = $1
                  AND NOT EXISTS (SELECT 1 FROM reservation_releases x
                                  WHERE x.reservation_id = r.reservation_id)
                  AND (a.status IS NULL OR a.status <> 2)) AS held""", tenant)
    return r["credits"] - r["charged"] - r["held"], int(r["seq"])


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=25))
async def test_the_meter_and_admission_decide_on_the_figure_the_ledger_gives(
        pool: asyncpg.Pool, steps: list[tuple[object, ...]]) -> None:
    tenant = f"agree-{abs(hash(tuple(steps))) % 10**9}"
    clock = Clock()

    async def publish_runway(*_: object) -> None:
        return None

    async def publish_job(*_: object) -> None:
        return None

    meter = Meter(MeterStore(pool), publish_runway, MeterSettings(settle_us=0), clock=clock)
    await meter.start()
    await meter.set_price("gpu-h100", PRICE)
    await meter.create_account(tenant)
    await meter.top_up(tenant, Decimal(10), f"{tenant}-initial", "")
    await pool.execute(
        "INSERT INTO tenant_profiles (tenant, display_name, gpu_quota, rate_per_s, burst, "
        "suspended, created_us, gpu_borrow) VALUES ($1, '', $2, 1, 1, false, $3, '{}')",
        tenant, json.dumps({"gpu-h100": 8}), T0)
    admission = Admission(AdmissionStore(pool), publish_job, clock=clock)
    await admission.load()
    jobs: list[tuple[str, int, int]] = []  # admitted: (job id, gpus, max seconds)
    started: set[str] = set()
    ended: set[str] = set()

    async def event(job: str, kind: EventType, gpus: int, bound: int) -> None:
        await meter.ingest([Event(f"{job}-{kind.word}", tenant, job, 1, kind, clock.t,
                                  "gpu-h100", gpus, bound)])
        await admission.workload_event(tenant, job, int(kind), clock.t, "")

    for i, s in enumerate(steps):
        if s[0] == "top_up":
            await meter.top_up(tenant, Decimal(int(s[1])), f"{tenant}-t{i}", "")  # type: ignore[call-overload]
        elif s[0] == "adjust":
            await meter.top_up(tenant, Decimal(int(s[1])), f"{tenant}-a{i}", "why",  # type: ignore[call-overload]
                               adjustment=True)
        elif s[0] == "submit":
            gpus, seconds = int(s[1]), int(s[2])  # type: ignore[call-overload]
            job = f"{tenant}-j{i}"
            ask = JobAsk(job, tenant, gpus, "gpu-h100", seconds, 0)
            spec = common_pb2.JobSpec(name="p", gpus=gpus, flavor="gpu-h100",
                                      max_duration_s=seconds).SerializeToString()
            out = await admission.admit(ask, "p", spec, "")
            if out.decision.verdict.name == "ADMITTED":
                jobs.append((job, gpus, seconds))
            # What admission's announcement of the job makes the meter read again.
            await meter.reservation_changed(workloads=[job])
        elif s[0] in ("start", "end") and jobs:
            job, gpus, bound = jobs[int(s[1]) % len(jobs)]  # type: ignore[call-overload]
            if s[0] == "start" and job not in started:
                started.add(job)
                await event(job, EventType.ADMITTED, gpus, bound)
            elif s[0] == "end" and job in started and job not in ended:
                ended.add(job)
                await event(job, EventType.FINISHED, gpus, bound)
        elif s[0] == "tick":
            clock.t += int(s[1]) * 1_000_000  # type: ignore[call-overload]
            await meter.tick()

        b = admission.book(tenant)
        async with b.lock:
            _, decided = await admission._budget(tenant, b)
        # The figure the meter keeps (what it publishes next) without reading any hold
        # again: one admission releases silently (its allocation closed, above) already
        # holds nothing in its book. Then GetRunway's, which reads the tenant's again.
        kept = meter.projection.figures(tenant, clock.t)
        published = await meter.runway(tenant)
        truth, seq = await recomputed(pool, tenant)
        assert kept.remaining == published.remaining == decided.remaining == truth, (i, s)
        assert published.ledger_seq == seq, (i, s)
