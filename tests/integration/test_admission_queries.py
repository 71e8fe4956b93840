"""Admission's periodic reads of held jobs use the partial index jobs_held, whatever
plan Postgres keeps for them, so their cost follows the held jobs, not every job
ever submitted."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from kestrel.jobs import JOB_COLS
from services.admission.domain import QUEUED_BEHIND, Decision, JobAsk, JobState, Ruling
from services.admission.metrics import AdmissionMetrics, HeldCount
from services.admission.store import (
    HELD_FOR_METRICS,
    HELD_OF_TENANT,
    HELD_TENANTS,
    AdmissionStore,
    NewJob,
    SnapshotAsk,
)

pytestmark = pytest.mark.integration


async def _generic_plan(conn: asyncpg.Connection, sql: str, args: str) -> str:
    """The plan Postgres keeps once it settles on a generic one (asyncpg prepares
    every statement), with sequential scans priced out: an index that can serve the
    statement is then used; one that cannot leaves the sequential scan."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute(f"PREPARE q AS {sql}")
        try:
            rows = await conn.fetch(f"EXPLAIN EXECUTE q{args}")
        finally:
            await conn.execute("DEALLOCATE q")
    return "\n".join(r[0] for r in rows)


@pytest.mark.parametrize(("sql", "args"), [
    (HELD_OF_TENANT, "('acme')"), (HELD_TENANTS, ""), (HELD_FOR_METRICS, ""),
], ids=["a-tenants-held-jobs", "the-tenants-with-held-jobs", "held-jobs-for-metrics"])
async def test_reads_of_held_jobs_use_the_held_index_under_a_generic_plan(
        owner: asyncpg.Connection, sql: str, args: str) -> None:
    assert "jobs_held" in await _generic_plan(owner, sql, args)


async def test_the_state_passed_as_a_parameter_would_scan_every_job(
        owner: asyncpg.Connection) -> None:
    """Why the state is written into the statements above."""
    plan = await _generic_plan(owner, f"SELECT {JOB_COLS} FROM jobs WHERE tenant = $1 "
                               "AND state = $2 ORDER BY priority DESC, seq", "('acme', 1)")
    assert "jobs_held" not in plan


def _new_job(tenant: str, job_id: str, verdict: Ruling, key: str = "",
             reason: str = "why") -> NewJob:
    ask = JobAsk(job_id, tenant, 1, "gpu-h100", 60, 0, 0)
    reserved = Decimal("0.06") if verdict is Ruling.ADMITTED else Decimal(0)
    return NewJob(ask, "j", b"", key, Decision(verdict, reason, reserved, "gpu-h100"))


async def test_several_tenants_snapshots_in_one_statement_are_each_ones_own(
        owner: asyncpg.Connection, role_dsn: Callable[[str], str]) -> None:
    for tenant, credits in (("acme", "5"), ("beta", "7")):
        await owner.execute("INSERT INTO tenants (tenant, created_us) VALUES ($1, 1)", tenant)
        await owner.execute("INSERT INTO credits (tenant, top_up_id, amount, recorded_us) "
                            "VALUES ($1, $2, $3::numeric, 1)", tenant, f"t-{tenant}", credits)
        await owner.execute(
            "INSERT INTO tenant_profiles (tenant, gpu_quota, rate_per_s, burst, created_us) "
            "VALUES ($1, '{\"gpu-h100\": 2}', 1, 1, 1)", tenant)
    pool = await asyncpg.create_pool(role_dsn("kestrel_admission"), min_size=1, max_size=2)
    try:
        store = AdmissionStore(pool)
        asks = [SnapshotAsk("beta", 0, ("b-1",), True), SnapshotAsk("ghost", 0, (), False),
                SnapshotAsk("acme", 0, (), True)]
        together = await store.snapshots(asks)
        alone = [(await store.snapshots([a]))[0] for a in asks]
    finally:
        await pool.close()
    assert together == alone
    assert [s.credits for s in together] == [Decimal(7), Decimal(0), Decimal(5)]
    assert together[1].policy is None and together[0].policy is not None


async def test_several_tenants_jobs_in_one_insert_land_each_under_its_tenant(
        owner: asyncpg.Connection, role_dsn: Callable[[str], str]) -> None:
    pool = await asyncpg.create_pool(role_dsn("kestrel_admission"), min_size=1, max_size=2)
    try:
        store = AdmissionStore(pool)
        (first,) = await store.insert_many([("acme", [_new_job("acme", "j-1", Ruling.HELD)])],
                                           10, [0])
        out = await store.insert_many([
            ("acme", [_new_job("acme", "j-2", Ruling.ADMITTED),
                      _new_job("acme", "j-3", Ruling.REJECTED)]),
            # j-1 is acme's already: absent from beta's answer, beta's other job stored.
            ("beta", [_new_job("beta", "j-1", Ruling.ADMITTED),
                      _new_job("beta", "j-4", Ruling.ADMITTED)])], 20, [1, 0])
    finally:
        await pool.close()
    assert list(first.rows) == ["j-1"] and first.version == 1
    assert [sorted(o.rows) for o in out] == [["j-2", "j-3"], ["j-4"]]
    assert [o.version for o in out] == [2, 1]
    rows = {r["job_id"]: (r["tenant"], r["state"]) for r in
            await owner.fetch("SELECT job_id, tenant, state FROM jobs")}
    assert rows == {"j-1": ("acme", JobState.HELD), "j-2": ("acme", JobState.ADMITTED),
                    "j-3": ("acme", JobState.REJECTED), "j-4": ("beta", JobState.ADMITTED)}
    held = {r["workload_id"]: r["tenant"] for r in
            await owner.fetch("SELECT workload_id, tenant FROM reservations")}
    assert held == {"j-2": "acme", "j-4": "beta"}


async def test_held_jobs_are_counted_per_tenant_and_kind_of_reason_in_postgres(
        owner: asyncpg.Connection, role_dsn: Callable[[str], str]) -> None:
    """The metrics read one row per tenant and kind: the counts, and since when the
    oldest of each has waited, from every held job and no other."""
    budget, behind = "needs 0.06 credits, 0 remain; held", f"needs 0.06; {QUEUED_BEHIND} ..."
    pool = await asyncpg.create_pool(role_dsn("kestrel_admission"), min_size=1, max_size=2)
    try:
        store = AdmissionStore(pool)
        await store.insert_many([("acme", [_new_job("acme", "a-1", Ruling.HELD, reason=budget),
                                           _new_job("acme", "a-2", Ruling.ADMITTED)])],
                                1_000_000, [0])
        await store.insert_many([("acme", [_new_job("acme", "a-3", Ruling.HELD, reason=behind),
                                           _new_job("acme", "a-4", Ruling.HELD, reason=behind)]),
                                 ("beta", [_new_job("beta", "b-1", Ruling.HELD, reason=behind)])],
                                3_000_000, [1, 0])
        metrics = AdmissionMetrics(CollectorRegistry())
        await metrics.read_held(pool, ["idle"])
    finally:
        await pool.close()
    got = sorted(metrics.held.held, key=lambda h: (h.tenant, h.reason))
    assert got == [HeldCount("acme", "budget", 1, 1.0), HeldCount("acme", "queue", 2, 3.0),
                   HeldCount("beta", "queue", 1, 3.0)]
    assert metrics.held.tenants == {"acme", "beta", "idle"}
