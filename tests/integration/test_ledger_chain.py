"""The ledger's hash chain in a real Postgres: written by the meter's own role, and
every rewrite a superuser can still make is reported by the audit."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from kestrel.db import migrate
from kestrel.pgroles import OWNER_ROLE, READER_ROLE, SERVICE_ROLES
from services.meter import audit
from services.meter.domain import Event, EventType
from services.meter.store import MIGRATIONS, Mark, MeterStore

pytestmark = pytest.mark.integration
T0 = 1_700_000_000_000_000
PRICE = {"gpu-h100": Decimal("0.001")}


@pytest.fixture
async def meter_pool(database: str, role_dsn: Callable[[str], str]
                     ) -> AsyncIterator[asyncpg.Pool]:
    """The meter's own role over a schema its owner migrated, with 3 allocations
    closed and ticked: a dozen ledger rows."""
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        await migrate(owner, "meter", MIGRATIONS)
    finally:
        await owner.close()
    pool = await asyncpg.create_pool(role_dsn(SERVICE_ROLES["meter"]), min_size=1, max_size=4)
    store = MeterStore(pool)
    await store.ensure_tenant("acme", T0)
    async with store.write(Mark()) as tx:
        await store.set_price(tx, "gpu-h100", PRICE["gpu-h100"], T0)
        await store.apply_batch(tx, [Event(f"{w}-a", "acme", w, 1, EventType.ADMITTED, T0,
                                          "gpu-h100", 2) for w in ("w1", "w2", "w3")],
                                PRICE, T0)
    for k in range(1, 4):
        async with store.write(tx.after) as tx:
            await store.apply_tick(tx, await store.open_allocations(), T0 + k * 1_000_000,
                                   f"tick-{k}", T0 + k * 1_000_000)
    async with store.write(tx.after) as tx:
        await store.apply_batch(tx, [Event(f"{w}-f", "acme", w, 1, EventType.FINISHED,
                                          T0 + 3_500_000, "gpu-h100", 2)
                                    for w in ("w1", "w2", "w3")], PRICE, T0)
    yield pool
    await pool.close()


async def run_audit(dsn: str, expect_head: tuple[int, bytes] | None = None) -> audit.Report:
    conn = await asyncpg.connect(dsn)
    try:
        return await audit.audit(conn, expect_head)
    finally:
        await conn.close()


async def tamper(superuser_dsn: str, *statements: str) -> None:
    """As a superuser, with the triggers off (replica mode): what the roles cannot do."""
    conn = await asyncpg.connect(superuser_dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            for s in statements:
                await conn.execute(s)
    finally:
        await conn.close()


async def test_the_meters_rows_form_one_chain_the_reader_can_audit(
        meter_pool: asyncpg.Pool, role_dsn: Callable[[str], str]) -> None:
    n = await meter_pool.fetchval("SELECT count(*) FROM ledger")
    assert n == 12
    report = await run_audit(role_dsn(READER_ROLE))
    assert report.intact, report.lines()
    assert (report.rows, report.chained, report.head_seq) == (n, n, n)
    # Whatever a writer puts in the chain's columns is overwritten.
    await meter_pool.execute("""INSERT INTO ledger (tenant, workload_id, flavor, gpus, start_us,
        end_us, gpu_us, price, cost, cause_id, kind, recorded_us, chain_seq, prev_hash,
        row_hash) VALUES ('acme', 'x', 'gpu-h100', 1, 0, 10, 10, 0.001, 0.00000001, 'forged',
        'usage', 0, 1, '\\x00', '\\x00')""")
    report = await run_audit(role_dsn(READER_ROLE))
    assert report.intact and report.head_seq == n + 1, report.lines()


async def test_concurrent_writers_append_one_chain(
        meter_pool: asyncpg.Pool, role_dsn: Callable[[str], str]) -> None:
    async def write(k: int) -> None:
        await meter_pool.execute("""INSERT INTO ledger (tenant, workload_id, flavor, gpus,
            start_us, end_us, gpu_us, price, cost, cause_id, kind, recorded_us)
            SELECT 'acme', 'c' || $1, 'gpu-h100', 1, i, i + 10, 10, 0.001, 0.00000001,
                   'c-' || $1 || '-' || i, 'usage', 0 FROM generate_series(1, 20) i""", str(k))

    await asyncio.gather(*(write(k) for k in range(8)))
    report = await run_audit(role_dsn(READER_ROLE))
    assert report.intact, report.lines()
    assert report.chained == 12 + 8 * 20


@pytest.mark.parametrize(("what", "statements", "finding"), [
    ("a row's cost rewritten (its price too, so the CHECKs hold)",
     ["UPDATE ledger SET price = 0, cost = 0 WHERE chain_seq = 5"], "altered"),
    ("a row moved to another tenant", ["UPDATE ledger SET tenant = 'other' WHERE chain_seq = 2"],
     "altered"),
    ("a row deleted", ["DELETE FROM ledger WHERE chain_seq = 7"], "gaps"),
    ("a row forged", ["""INSERT INTO ledger (tenant, workload_id, flavor, gpus, start_us,
        end_us, gpu_us, price, cost, cause_id, kind, recorded_us) VALUES ('acme', 'w9',
        'gpu-h100', 1, 0, 10, 10, 0.001, 0.00000001, 'forged', 'usage', 0)"""], "unchained"),
    ("a row's hash recomputed after an edit, the next link then breaks",
     ["UPDATE ledger SET price = 0, cost = 0 WHERE chain_seq = 5",
      "UPDATE ledger SET row_hash = kestrel_ledger_digest(prev_hash, ledger) "
      "WHERE chain_seq = 5"], "broken"),
])
async def test_what_a_superuser_rewrites_the_audit_reports(
        meter_pool: asyncpg.Pool, database: str, role_dsn: Callable[[str], str],
        what: str, statements: list[str], finding: str) -> None:
    await tamper(database, *statements)
    report = await run_audit(role_dsn(READER_ROLE))
    assert not report.intact and getattr(report, finding), (what, report.lines())


async def test_a_deleted_tail_or_a_rewritten_chain_needs_a_head_kept_outside(
        meter_pool: asyncpg.Pool, database: str, role_dsn: Callable[[str], str]) -> None:
    before = await run_audit(role_dsn(READER_ROLE))
    head = (before.head_seq, before.head_hash)
    await tamper(database, "DELETE FROM ledger WHERE chain_seq > 10")
    alone = await run_audit(role_dsn(READER_ROLE))
    assert alone.intact  # by itself, a shorter chain verifies
    with_head = await run_audit(role_dsn(READER_ROLE), head)
    assert not with_head.intact and with_head.head_missing, with_head.lines()
    # The meter's role cannot do even this.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await meter_pool.execute("DELETE FROM ledger WHERE chain_seq > 10")


async def test_the_sql_digest_function_agrees_with_the_trigger(
        meter_pool: asyncpg.Pool) -> None:
    assert await meter_pool.fetchval(
        "SELECT count(*) FROM ledger WHERE kestrel_ledger_digest(prev_hash, ledger) "
        "IS DISTINCT FROM row_hash") == 0


async def test_rows_written_before_the_chain_join_it_in_row_id_order(
        database: str, role_dsn: Callable[[str], str], tmp_path: Path) -> None:
    before = tmp_path / "meter"
    before.mkdir()
    for f in sorted(MIGRATIONS.glob("000[1-5]_*.sql")):
        shutil.copy(f, before / f.name)
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        await migrate(owner, "meter", before)
        pool = await asyncpg.create_pool(role_dsn(SERVICE_ROLES["meter"]), min_size=1,
                                         max_size=1)
        try:  # the rows as the meter of that schema wrote them (today's store needs 0010)
            await pool.execute("INSERT INTO tenants VALUES ('acme', $1)", T0)
            for wid, gpus, length in (("w1", 1, 5), ("w2", 3, 7)):
                await pool.execute("""
                    INSERT INTO ledger (tenant, workload_id, flavor, gpus, start_us, end_us,
                                        gpu_us, price, cost, cause_id, kind, recorded_us)
                    VALUES ('acme', $1, 'gpu-h100', $2, $3, $4, $5, $6, $7, $8, 'usage', $3)""",
                    wid, gpus, T0, T0 + length, gpus * length, PRICE["gpu-h100"],
                    PRICE["gpu-h100"] * gpus * length / 1_000_000, f"{wid}-f")
        finally:
            await pool.close()
        assert await migrate(owner, "meter", MIGRATIONS) == [
            "0006_ledger_chain.sql", "0007_rolling_reservations.sql",
            "0008_open_reservations.sql", "0009_reads_for_others.sql",
            "0010_meter_replicas.sql"]
        rows = await owner.fetch("SELECT row_id, chain_seq FROM ledger ORDER BY row_id")
        assert [r["chain_seq"] for r in rows] == list(range(1, len(rows) + 1)) and rows
    finally:
        await owner.close()
    report = await run_audit(role_dsn(READER_ROLE))
    assert report.intact and report.chained == len(rows), report.lines()
