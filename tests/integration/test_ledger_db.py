"""The ledger in a real Postgres: append-only, exact, and traced to rows."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from decimal import Decimal

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kestrel.db import create_pool, migrate
from kestrel.pgroles import OWNER_ROLE
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from services.meter.core import Meter, MeterSettings
from services.meter.domain import Event, EventType, HoldBook, Reason, RunwayFigures
from services.meter.store import MIGRATIONS, Mark, MeterStore

pytestmark = pytest.mark.integration
T0 = 1_700_000_000_000_000


@pytest.fixture
async def pool(database: str, role_dsn: Callable[[str], str]) -> AsyncIterator[asyncpg.Pool]:
    """The superuser's pool over the meter's schema and admission's (the budget holds
    the meter reads), migrated by their owner as in a deployment."""
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        await migrate(owner, "meter", MIGRATIONS)
        await migrate(owner, "admission", ADMISSION_MIGRATIONS)
    finally:
        await owner.close()
    p = await create_pool(database, max_size=4)
    yield p
    await p.close()


async def seed_row(pool: asyncpg.Pool) -> None:
    store = MeterStore(pool)
    await store.ensure_tenant("acme", T0)
    async with store.write(Mark()) as tx:
        await store.top_up(tx, "acme", Decimal("10"), "t1", "", T0)
        await store.set_price(tx, "gpu-h100", Decimal("0.001"), T0)
        await store.apply_batch(tx, [
            Event("a", "acme", "w1", 1, EventType.ADMITTED, T0, "gpu-h100", 1),
            Event("f", "acme", "w1", 1, EventType.FINISHED, T0 + 1_000_000, "gpu-h100", 1)],
            {"gpu-h100": Decimal("0.001")}, T0)


@pytest.mark.parametrize("statement", [
    "UPDATE ledger SET cost = 0",
    "DELETE FROM ledger",
    "TRUNCATE ledger",
    "UPDATE credits SET amount = 1000000",
    "DELETE FROM credits",
    "TRUNCATE credits CASCADE",
    "UPDATE workload_events SET time_us = 0",
    "DELETE FROM prices",
])
async def test_the_database_rejects_changes_to_append_only_tables(
        pool: asyncpg.Pool, statement: str) -> None:
    await seed_row(pool)
    before = await pool.fetchval("SELECT count(*) FROM ledger") + await pool.fetchval(
        "SELECT count(*) FROM credits")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
        await pool.execute(statement)  # as the superuser, even
    after = await pool.fetchval("SELECT count(*) FROM ledger") + await pool.fetchval(
        "SELECT count(*) FROM credits")
    assert after == before


async def test_the_ledger_rejects_a_row_whose_cost_is_not_gpu_time_times_price(
        pool: asyncpg.Pool) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("""INSERT INTO ledger (tenant, workload_id, flavor, gpus, start_us,
            end_us, gpu_us, price, cost, cause_id, kind, recorded_us)
            VALUES ('acme', 'w', 'f', 2, 0, 10, 20, 1, 1, 'x', 'usage', 0)""")


async def test_migrations_are_idempotent(pool: asyncpg.Pool) -> None:
    assert await MeterStore(pool).migrate() == []


async def test_the_reader_role_can_select_but_never_write(pool: asyncpg.Pool) -> None:
    await seed_row(pool)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE kestrel_reader")
        assert await conn.fetchval("SELECT count(*) FROM ledger") == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO credits (tenant, top_up_id, amount, recorded_us) "
                               "VALUES ('acme', 'x', 1, 0)")


# --- the meter core over the real database ------------------------------------

specs = st.lists(st.tuples(st.integers(1, 8), st.sampled_from(["gpu-h100", "gpu-a10"]),
                           st.integers(0, 5_000_000), st.integers(0, 5_000_000)),
                 min_size=1, max_size=8)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> int:
        return self.t


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(allocs=specs, order=st.randoms(use_true_random=False),
       tick_us=st.integers(100_000, 2_000_000))
async def test_ledger_sums_and_cost_are_exact_in_postgres(
        pool: asyncpg.Pool, allocs: list[tuple[int, str, int, int]], order: object,
        tick_us: int) -> None:
    await pool.execute("SELECT 1")
    run = f"r{id(allocs) % 100_000}{tick_us}"
    clock = Clock()
    published: list[tuple[RunwayFigures, Reason]] = []

    async def publish(f: RunwayFigures, r: Reason, _: int) -> None:
        published.append((f, r))

    meter = Meter(MeterStore(pool), publish, MeterSettings(settle_us=0), clock=clock)
    await meter.start()
    for flavor, price in (("gpu-h100", "0.001"), ("gpu-a10", "0.000300001")):
        await meter.set_price(flavor, Decimal(price))
    tenant = f"t{run}"
    await meter.create_account(tenant)
    events = []
    for i, (gpus, flavor, start, length) in enumerate(allocs):
        wid = f"{run}-{i}"
        events.append(Event(f"{wid}-a", tenant, wid, 1, EventType.ADMITTED, T0 + start,
                            flavor, gpus))
        events.append(Event(f"{wid}-f", tenant, wid, 1, EventType.FINISHED,
                            T0 + start + length, flavor, gpus))
    order.shuffle(events)  # type: ignore[attr-defined]
    # Stream in small batches with ticks in between, and redeliver everything once.
    for k in range(0, len(events), 3):
        await meter.ingest(events[k:k + 3])
        clock.t += tick_us
        await meter.tick()
    assert await meter.ingest(events) == 0
    rows = await pool.fetch("""SELECT workload_id, sum(gpu_us) g, sum(cost) c, min(price) p
                               FROM ledger WHERE tenant = $1 GROUP BY workload_id""", tenant)
    by_wid = {r["workload_id"]: r for r in rows}
    for i, (gpus, _flavor, _start, length) in enumerate(allocs):
        expect = gpus * length
        got = by_wid.get(f"{run}-{i}")
        assert (got["g"] if got else 0) == expect
        if got:
            assert got["c"] == Decimal(expect) * got["p"] / Decimal(1_000_000)
    totals = await MeterStore(pool).totals()
    charged_sql = sum((c for (t, _), (_, c, _) in totals.usage.items() if t == tenant),
                      Decimal(0))
    assert meter.projection.account(tenant).charged == charged_sql
    assert await pool.fetchval(
        "SELECT count(*) FROM allocations WHERE tenant = $1 AND status <> 2", tenant) == 0
    await asyncio.sleep(0)


async def test_reserved_holds_what_open_reservations_have_not_yet_consumed(
        pool: asyncpg.Pool) -> None:
    store = MeterStore(pool)
    price = {"gpu-h100": Decimal("0.001")}
    async with store.write(Mark()) as tx:
        for tenant in ("holds", "other"):
            await store.ensure_tenant(tenant, T0)
            await store.top_up(tx, tenant, Decimal("100"), f"{tenant}-t", "", T0)
        await store.set_price(tx, "gpu-h100", price["gpu-h100"], T0)
        # w2, w3 and w6 run 100 s (0.1 credits each); w4 ran 1 s and finished.
        await store.apply_batch(tx, [
            Event(f"{w}-a", "holds", w, 1, EventType.ADMITTED, T0, "gpu-h100", 1)
            for w in ("w2", "w3", "w4", "w6")] + [
            Event("w4-f", "holds", "w4", 1, EventType.FINISHED, T0 + 1_000_000, "gpu-h100", 1)],
            price, T0)
    async with store.write(tx.after) as tx:
        await store.apply_tick(tx, await store.open_allocations(), T0 + 100_000_000, "tick-1",
                               T0 + 100_000_000)
    for rid, tenant, wid, amount in [
            ("r1", "holds", "w1", "1"),     # not started: holds it all
            ("r2", "holds", "w2", "1"),     # 0.1 consumed: holds 0.9
            ("r3", "holds", "w3", "0.05"),  # consumed past it: holds nothing
            ("r4", "holds", "w4", "1"),     # closed: its cost is charged instead
            ("r5", "holds", "w5", "1"),     # released by admission
            ("r6", "other", "x1", "7")]:
        await pool.execute("INSERT INTO reservations VALUES ($1, $2, $3, $4, $5)",
                           rid, tenant, wid, Decimal(amount), T0)
    # An endpoint replica's hold is rolling: it holds its whole amount while it runs.
    await pool.execute("INSERT INTO reservations VALUES ('r7', 'holds', 'w6', 2, $1, true)",
                       T0)
    await pool.execute("INSERT INTO reservation_releases VALUES ('r5', 'cancelled', $1)", T0)
    # The meter's projection keeps each open allocation's cost; open_costs() is its start.
    costs = await store.open_costs()
    book = HoldBook()
    book.replace_tenants(["holds", "nobody"], await store.holds(["holds", "nobody"]))
    assert (book.reserved("holds", costs), book.reserved("nobody", costs)) == (
        Decimal("3.9"), Decimal(0))
    # Read all at once, or workload by workload (what admission's announcements make the
    # meter do), the same holds: r4's allocation closed and r5 was released.
    assert sorted(h.workload_id for h in await store.holds()) == ["w1", "w2", "w3", "w6",
                                                                   "x1"]
    assert sorted(h.workload_id for h in await store.holds(
        workloads=["w1", "w4", "w5", "w6"])) == ["w1", "w6"]


async def test_open_reservations_is_always_reservations_less_their_releases(
        pool: asyncpg.Pool) -> None:
    """The projection the meter's reserved figure reads, kept by triggers: after any mix
    of holds and releases (batched, repeated, out of order) it is exactly the anti-join
    it replaces, and it cannot be written except through them."""
    rng = random.Random(7)
    ids = [f"p{i}" for i in range(60)]
    for i, rid in enumerate(ids):
        await pool.execute(
            "INSERT INTO reservations (reservation_id, tenant, workload_id, amount, "
            "created_us, rolling) VALUES ($1, $2, $1, $3, $4, $5)",
            rid, f"proj-{i % 3}", Decimal(i), T0, i % 5 == 0)
        if rng.random() < 0.5:
            done = rng.sample(ids[:i + 1], k=min(3, i + 1))
            await pool.execute(
                "INSERT INTO reservation_releases (reservation_id, reason, released_us) "
                "SELECT reservation_id, 'done', $2 FROM reservations "
                "WHERE reservation_id = ANY($1::text[]) ON CONFLICT DO NOTHING", done, T0)
    expected = await pool.fetch("""
        SELECT r.reservation_id, r.tenant, r.workload_id, r.amount, r.rolling
        FROM reservations r LEFT JOIN reservation_releases x USING (reservation_id)
        WHERE x.reservation_id IS NULL AND r.tenant LIKE 'proj-%' ORDER BY 1""")
    got = await pool.fetch("SELECT * FROM open_reservations WHERE tenant LIKE 'proj-%' "
                           "ORDER BY 1")
    assert 0 < len(got) < len(ids)
    assert [tuple(r.values()) for r in got] == [tuple(r.values()) for r in expected]
    # A release of a reservation that does not exist is refused, projection untouched.
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await pool.execute("INSERT INTO reservation_releases VALUES ('nope', 'x', $1)", T0)
    assert await pool.fetchval(
        "SELECT count(*) FROM open_reservations WHERE tenant LIKE 'proj-%'") == len(got)


async def test_a_multi_host_dsn_skips_a_dead_host_and_writes_to_the_one_that_answers(
        database: str) -> None:
    """What an HA Postgres gives the services (docs/operations.md): a libpq multi-host
    URL with target_session_attrs=read-write, whose first host is gone (a primary that
    failed over): the services' pool connects to the next and writes there."""
    from urllib.parse import urlsplit

    from kestrel_tools.devstack import free_port

    url = urlsplit(database)
    assert url.hostname and url.port
    user = f"{url.username}:{url.password}@" if url.password else f"{url.username}@"
    dsn = (f"postgresql://{user}127.0.0.1:{free_port()},{url.hostname}:{url.port}{url.path}"
           "?target_session_attrs=read-write")
    pool = await create_pool(dsn, max_size=1)
    try:
        assert await pool.fetchval("SELECT inet_server_port()") == url.port
        assert await pool.fetchval("SHOW transaction_read_only") == "off"
        await pool.execute("CREATE TEMP TABLE t (x int); INSERT INTO t VALUES (1)")
    finally:
        await pool.close()
