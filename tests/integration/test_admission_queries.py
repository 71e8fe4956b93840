"""Admission's periodic reads of held jobs use the partial index jobs_held, whatever
plan Postgres keeps for them, so their cost follows the held jobs, not every job
ever submitted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from kestrel.db import migrate
from kestrel.jobs import JOB_COLS
from kestrel.pgroles import OWNER_ROLE
from services.admission.store import (
    HELD_FOR_METRICS,
    HELD_OF_TENANT,
    HELD_TENANTS,
)
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from services.gateway.store import MIGRATIONS as GATEWAY_MIGRATIONS
from services.meter.store import MIGRATIONS as METER_MIGRATIONS

pytestmark = pytest.mark.integration


@pytest.fixture
async def owner(database: str, role_dsn: Callable[[str], str]
                ) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(role_dsn(OWNER_ROLE))
    for component, directory in (("meter", METER_MIGRATIONS), ("gateway", GATEWAY_MIGRATIONS),
                                 ("admission", ADMISSION_MIGRATIONS)):
        await migrate(conn, component, directory)
    yield conn
    await conn.close()


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
