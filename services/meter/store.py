"""The meter's Postgres adapter: the only code that touches its tables.

Each method is one transaction; batch methods use one round trip per
statement over arrays (unnest) instead of one per row.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import asyncpg

from kestrel.db import Published, migrate
from services.meter.domain import (
    Allocation,
    AllocStatus,
    Event,
    OpenHold,
    Outcome,
    Row,
    RowKind,
    apply_events,
    tick,
)

MIGRATIONS = Path(__file__).parent / "migrations"

_ALLOC_COLS = ("workload_id, tenant, kind, flavor, gpus, price, status, start_us, "
               "metered_until_us, end_us, limit_us")


def _alloc(r: asyncpg.Record) -> Allocation:
    return Allocation(r["workload_id"], r["tenant"], r["kind"], r["flavor"], r["gpus"],
                      r["price"], AllocStatus(r["status"]), r["start_us"],
                      r["metered_until_us"], r["end_us"], r["limit_us"])


@dataclass(frozen=True)
class CommittedRow:
    row_id: int
    row: Row


@dataclass(frozen=True)
class BatchResult:
    new_events: int
    outcome: Outcome
    rows: list[CommittedRow]


@dataclass(frozen=True)
class Totals:
    """Sums straight from the tables, per tenant (for start-up and checks)."""

    credits: dict[str, Decimal]
    top_ups: dict[str, int]
    usage: dict[tuple[str, str], tuple[int, Decimal, int]]  # (tenant, flavor) -> gpu_us, cost, rows
    ledger_seq: int
    tenants: list[str]


@dataclass(frozen=True)
class Mark:
    """How far a replica's projection has read the meter's committed writes: the
    meter_head version, and the highest ledger row, credit and price id it holds."""

    version: int = 0
    ledger_seq: int = 0
    credit_id: int = 0
    price_id: int = 0


@dataclass(frozen=True)
class Changes:
    """What other replicas committed after a mark, up to `mark` (migration 0010)."""

    mark: Mark
    rows: list[CommittedRow] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    credits: list[tuple[str, Decimal]] = field(default_factory=list)
    prices: list[tuple[str, Decimal, int]] = field(default_factory=list)  # id order


@dataclass(frozen=True)
class Snapshot:
    """Everything a starting meter loads, read in one snapshot with its mark."""

    totals: Totals
    open_allocations: list[Allocation]
    open_costs: dict[str, Decimal]
    prices: dict[str, tuple[Decimal, int]]
    mark: Mark


@dataclass
class Writing:
    """One write transaction holding the meter_head row: the changes others committed
    since the writer's mark (to apply before deciding), the version this write commits
    as, and what it wrote (for the mark after)."""

    conn: asyncpg.Connection
    changes: Changes
    last_tick_us: int
    wrote: bool = False
    ticked: bool = False
    committed: bool = False
    ledger_seq: int = 0
    credit_id: int = 0
    price_id: int = 0

    @property
    def version(self) -> int:
        return self.changes.mark.version + 1

    @property
    def after(self) -> Mark:
        """The writer's mark once this transaction is over (committed or not)."""
        seen = self.changes.mark
        if not self.committed or not self.wrote:
            return seen
        return Mark(self.version, max(seen.ledger_seq, self.ledger_seq),
                    max(seen.credit_id, self.credit_id), max(seen.price_id, self.price_id))


@dataclass(frozen=True)
class UsagePage:
    rows: list[tuple[int, Row, int]]  # row_id, row, recorded_us
    next_after: int | None


# The open holds (admission's `open_holds` view, admission migration 0004) less those
# whose allocation has closed: they hold nothing, their cost is charged.
_HOLDING = f"""FROM open_holds r LEFT JOIN allocations a ON a.workload_id = r.workload_id
            WHERE (a.status IS NULL OR a.status <> {AllocStatus.CLOSED.value})"""


class MeterStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.published = Published(pool)

    async def migrate(self) -> list[str]:
        async with self.pool.acquire() as conn:
            return await migrate(conn, "meter", MIGRATIONS)

    # --- reads ---------------------------------------------------------------

    async def prices(self, conn: asyncpg.Connection | None = None
                     ) -> dict[str, tuple[Decimal, int]]:
        rows = await (conn or self.pool).fetch("""
            SELECT DISTINCT ON (flavor) flavor, price_per_gpu_s, effective_us
            FROM prices ORDER BY flavor, effective_us DESC, price_id DESC""")
        return {r["flavor"]: (r["price_per_gpu_s"], r["effective_us"]) for r in rows}

    async def open_allocations(self, conn: asyncpg.Connection | None = None
                               ) -> list[Allocation]:
        rows = await (conn or self.pool).fetch(
            f"SELECT {_ALLOC_COLS} FROM allocations WHERE status = $1", AllocStatus.OPEN.value)
        return [_alloc(r) for r in rows]

    async def totals(self) -> Totals:
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            return await self._totals(conn)

    @staticmethod
    async def _totals(conn: asyncpg.Connection) -> Totals:
        tenants = [r["tenant"] for r in await conn.fetch(
            "SELECT tenant FROM tenants ORDER BY tenant")]
        credits = {r["tenant"]: (r["s"], r["n"]) for r in await conn.fetch(
            "SELECT tenant, sum(amount) s, count(*) n FROM credits GROUP BY tenant")}
        usage = {(r["tenant"], r["flavor"]): (int(r["g"]), r["c"], int(r["n"]))
                 for r in await conn.fetch(
            "SELECT tenant, flavor, sum(gpu_us) g, sum(cost) c, count(*) n "
            "FROM ledger GROUP BY tenant, flavor")}
        seq = await conn.fetchval("SELECT coalesce(max(row_id), 0) FROM ledger")
        return Totals({t: c for t, (c, _) in credits.items()},
                      {t: n for t, (_, n) in credits.items()}, usage, int(seq), tenants)

    async def snapshot(self) -> Snapshot:
        """What a starting meter loads, and its mark, all in one snapshot: the writes
        other replicas commit meanwhile are what its first catch-up reads."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            version = await conn.fetchval("SELECT version FROM meter_head WHERE id = 1")
            totals = await self._totals(conn)
            credit_id = await conn.fetchval("SELECT coalesce(max(credit_id), 0) FROM credits")
            price_id = await conn.fetchval("SELECT coalesce(max(price_id), 0) FROM prices")
            return Snapshot(totals, await self.open_allocations(conn),
                            await self.open_costs(conn), await self.prices(conn),
                            Mark(int(version), totals.ledger_seq, int(credit_id),
                                 int(price_id)))

    async def changes_since(self, mark: Mark) -> Changes:
        """What other replicas committed after `mark`, read without taking turns (one
        query when nothing did): a reader's catch-up. In one snapshot, every write up to
        the version it reads is there and none after it is."""
        async with self.pool.acquire() as conn:
            version = int(await conn.fetchval("SELECT version FROM meter_head WHERE id = 1"))
            if version == mark.version:  # the usual answer: one statement
                return Changes(mark)
            async with conn.transaction(isolation="repeatable_read"):
                version = await conn.fetchval("SELECT version FROM meter_head WHERE id = 1")
                return await self._changes(conn, mark, int(version))

    @staticmethod
    async def _changes(conn: asyncpg.Connection, mark: Mark, version: int) -> Changes:
        if version == mark.version:
            return Changes(mark)
        rows = [CommittedRow(r["row_id"], Row(
                    r["tenant"], r["workload_id"], r["flavor"], r["gpus"], r["start_us"],
                    r["end_us"], r["price"], r["cause_id"], RowKind(r["kind"])))
                for r in await conn.fetch("""
            SELECT row_id, tenant, workload_id, flavor, gpus, start_us, end_us, price,
                   cause_id, kind FROM ledger WHERE row_id > $1 ORDER BY row_id""",
                mark.ledger_seq)]
        credits = await conn.fetch("""
            SELECT credit_id, tenant, amount FROM credits WHERE credit_id > $1
            ORDER BY credit_id""", mark.credit_id)
        prices = await conn.fetch("""
            SELECT price_id, flavor, price_per_gpu_s, effective_us FROM prices
            WHERE price_id > $1 ORDER BY price_id""", mark.price_id)
        allocations = [_alloc(r) for r in await conn.fetch(
            f"SELECT {_ALLOC_COLS} FROM allocations WHERE version > $1", mark.version)]
        return Changes(
            Mark(version, max([mark.ledger_seq] + [r.row_id for r in rows]),
                 max([mark.credit_id] + [r["credit_id"] for r in credits]),
                 max([mark.price_id] + [r["price_id"] for r in prices])),
            rows, allocations, [(r["tenant"], r["amount"]) for r in credits],
            [(r["flavor"], r["price_per_gpu_s"], r["effective_us"]) for r in prices])

    @contextlib.asynccontextmanager
    async def write(self, mark: Mark) -> AsyncIterator[Writing]:
        """One write transaction, taking its turn on the meter_head row (migration 0010):
        yields the changes other replicas committed since `mark`; commits the new
        version if the body wrote anything (`Writing.wrote`). Writes of several meter
        replicas go one after another, each deciding from what the last committed."""
        async with self.pool.acquire() as conn, conn.transaction():
            head = await conn.fetchrow(
                "SELECT version, last_tick_us FROM meter_head WHERE id = 1 FOR UPDATE")
            w = Writing(conn, await self._changes(conn, mark, int(head["version"])),
                        int(head["last_tick_us"]))
            yield w
            if w.wrote:
                await conn.execute(
                    "UPDATE meter_head SET version = $1, last_tick_us = $2 WHERE id = 1",
                    w.version, w.last_tick_us)
        w.committed = True

    async def holds(self, tenants: Sequence[str] | None = None, *,
                    workloads: Sequence[str] | None = None) -> list[OpenHold]:
        """The open holds (admission's `open_holds` view, admission migration 0004) of
        `tenants`, or of `workloads`, or all of them, less those whose allocation has
        closed (they hold nothing: their cost is charged). The meter keeps them in
        memory (domain.HoldBook) and reads a whole tenant's only at start-up and resync;
        admission's job changes name the workloads to read again, one index probe each.
        Before admission has made its schema there is no hold anywhere."""
        if not await self.published.exists("open_holds"):
            return []
        if workloads is not None:
            where, arg = "r.workload_id = ANY($1::text[])", list(workloads)
        elif tenants is not None:
            where, arg = "r.tenant = ANY($1::text[])", list(tenants)
        else:
            where, arg = "$1::text[] IS NULL", None
        rows = await self.pool.fetch(f"""
            SELECT r.tenant, r.workload_id, r.amount, r.rolling
            {_HOLDING} AND {where}""", arg)
        return [OpenHold(r["tenant"], r["workload_id"], r["amount"], r["rolling"]) for r in rows]

    async def hold_sums(self) -> dict[str, tuple[int, Decimal]]:
        """Per tenant, how many open holds (as `holds` reads them) and the sum of their
        amounts: one aggregate, so that a resync reads whole only the tenants whose
        figures differ from the meter's (domain.HoldBook.summary)."""
        if not await self.published.exists("open_holds"):
            return {}
        rows = await self.pool.fetch(f"""
            SELECT r.tenant, count(*) AS n, sum(r.amount) AS amount
            {_HOLDING} GROUP BY r.tenant""")
        return {r["tenant"]: (int(r["n"]), r["amount"]) for r in rows}

    async def open_costs(self, conn: asyncpg.Connection | None = None) -> dict[str, Decimal]:
        """Ledger cost so far of each open allocation (the projection's start)."""
        rows = await (conn or self.pool).fetch("""
            SELECT l.workload_id, sum(l.cost) AS cost FROM ledger l
            JOIN allocations a ON a.workload_id = l.workload_id AND a.status = $1
            GROUP BY l.workload_id""", AllocStatus.OPEN.value)
        return {r["workload_id"]: r["cost"] for r in rows}

    async def tenant_exists(self, tenant: str) -> bool:
        return bool(await self.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM tenants WHERE tenant = $1)", tenant))

    async def usage_page(self, tenant: str, start_us: int, end_us: int, workload_id: str,
                         after_row_id: int, limit: int) -> UsagePage:
        rows = await self.pool.fetch("""
            SELECT row_id, tenant, workload_id, flavor, gpus, start_us, end_us, price,
                   cause_id, kind, recorded_us
            FROM ledger
            WHERE tenant = $1 AND row_id > $2
              AND ($3::bigint = 0 OR end_us > $3) AND ($4::bigint = 0 OR start_us < $4)
              AND ($5 = '' OR workload_id = $5)
            ORDER BY row_id LIMIT $6""", tenant, after_row_id, start_us, end_us, workload_id,
            limit + 1)
        page = [(r["row_id"], Row(r["tenant"], r["workload_id"], r["flavor"], r["gpus"],
                                  r["start_us"], r["end_us"], r["price"], r["cause_id"],
                                  RowKind(r["kind"])), r["recorded_us"]) for r in rows[:limit]]
        return UsagePage(page, page[-1][0] if len(rows) > limit else None)

    # --- writes --------------------------------------------------------------

    async def ensure_tenant(self, tenant: str, now_us: int) -> bool:
        status = await self.pool.execute(
            "INSERT INTO tenants VALUES ($1, $2) ON CONFLICT DO NOTHING", tenant, now_us)
        return bool(status.endswith(" 1"))

    @staticmethod
    async def top_up(w: Writing, tenant: str, amount: Decimal, top_up_id: str, note: str,
                     now_us: int, kind: str = "top_up") -> bool:
        credit_id = await w.conn.fetchval("""
            INSERT INTO credits (tenant, top_up_id, amount, note, recorded_us, kind)
            VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (top_up_id) DO NOTHING
            RETURNING credit_id""", tenant, top_up_id, amount, note, now_us, kind)
        if credit_id is None:
            return False
        w.wrote, w.credit_id = True, int(credit_id)
        return True

    @staticmethod
    async def set_price(w: Writing, flavor: str, price: Decimal, now_us: int) -> None:
        w.price_id = int(await w.conn.fetchval(
            "INSERT INTO prices (flavor, price_per_gpu_s, effective_us) VALUES ($1, $2, $3) "
            "RETURNING price_id", flavor, price, now_us))
        w.wrote = True

    async def apply_batch(self, w: Writing, events: Sequence[Event],
                          prices: dict[str, Decimal], now_us: int) -> BatchResult:
        """Record events (dropping ids already seen), meter them, in `w`'s transaction."""
        conn = w.conn
        fresh_ids = {r["event_id"] for r in await conn.fetch("""
            INSERT INTO workload_events (event_id, tenant, workload_id, kind, type, time_us,
                                         flavor, gpus, received_us, max_duration_s)
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[],
                                 $5::smallint[], $6::bigint[], $7::text[], $8::int[],
                                 $9::bigint[], $10::bigint[])
            ON CONFLICT (event_id) DO NOTHING RETURNING event_id""",
            [e.event_id for e in events], [e.tenant for e in events],
            [e.workload_id for e in events], [e.kind for e in events],
            [int(e.type) for e in events], [e.time_us for e in events],
            [e.flavor for e in events], [e.gpus for e in events],
            [now_us] * len(events), [e.max_duration_s for e in events])}
        # Keep the first copy of each id newly stored (a batch may hold two).
        fresh: list[Event] = []
        for e in events:
            if e.event_id in fresh_ids:
                fresh.append(e)
                fresh_ids.discard(e.event_id)
        metering = [e for e in fresh if not e.type.informational]
        if not metering:
            return BatchResult(len(fresh), Outcome({}, [], frozenset(), frozenset()), [])
        ids = sorted({e.workload_id for e in metering})
        current = {r["workload_id"]: _alloc(r) for r in await conn.fetch(
            f"SELECT {_ALLOC_COLS} FROM allocations WHERE workload_id = ANY($1::text[])",
            ids)}
        outcome = apply_events(current, metering, prices)
        tenants = sorted({a.tenant for a in outcome.allocations.values()})
        await conn.execute(
            "INSERT INTO tenants SELECT t, $2 FROM unnest($1::text[]) t "
            "ON CONFLICT DO NOTHING", tenants, now_us)
        await self._upsert_allocations(w, list(outcome.allocations.values()))
        committed = await self._insert_rows(w, outcome.rows, now_us)
        return BatchResult(len(fresh), outcome, committed)

    async def apply_tick(self, w: Writing, open_allocations: Sequence[Allocation],
                         cut_to_us: int, tick_id: str, now_us: int
                         ) -> tuple[Outcome, list[CommittedRow]]:
        outcome = tick(open_allocations, cut_to_us, tick_id)
        w.last_tick_us, w.ticked = now_us, True
        if not outcome.rows:
            return outcome, []
        await self._upsert_allocations(w, list(outcome.allocations.values()))
        return outcome, await self._insert_rows(w, outcome.rows, now_us)

    @staticmethod
    async def _upsert_allocations(w: Writing, allocs: list[Allocation]) -> None:
        if not allocs:
            return
        w.wrote = True
        await w.conn.execute(f"""
            INSERT INTO allocations ({_ALLOC_COLS}, version)
            SELECT *, $12::bigint FROM unnest(
                $1::text[], $2::text[], $3::smallint[], $4::text[], $5::int[],
                $6::numeric[], $7::smallint[], $8::bigint[], $9::bigint[], $10::bigint[],
                $11::bigint[])
            ON CONFLICT (workload_id) DO UPDATE SET version = excluded.version,
              flavor = excluded.flavor, gpus = excluded.gpus, price = excluded.price,
              status = excluded.status, start_us = excluded.start_us,
              metered_until_us = excluded.metered_until_us, end_us = excluded.end_us,
              limit_us = excluded.limit_us""",
            [a.workload_id for a in allocs], [a.tenant for a in allocs],
            [a.kind for a in allocs], [a.flavor for a in allocs], [a.gpus for a in allocs],
            [a.price for a in allocs], [int(a.status) for a in allocs],
            [a.start_us for a in allocs], [a.metered_until_us for a in allocs],
            [a.end_us for a in allocs], [a.limit_us for a in allocs], w.version)

    @staticmethod
    async def _insert_rows(w: Writing, rows: list[Row], now_us: int) -> list[CommittedRow]:
        if not rows:
            return []
        w.wrote = True
        ids = await w.conn.fetch("""
            INSERT INTO ledger (tenant, workload_id, flavor, gpus, start_us, end_us, gpu_us,
                                price, cost, cause_id, kind, recorded_us)
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::bigint[],
                                 $6::bigint[], $7::bigint[], $8::numeric[], $9::numeric[],
                                 $10::text[], $11::text[], $12::bigint[])
            RETURNING row_id, cause_id""",
            [r.tenant for r in rows], [r.workload_id for r in rows], [r.flavor for r in rows],
            [r.gpus for r in rows], [r.start_us for r in rows], [r.end_us for r in rows],
            [r.gpu_us for r in rows], [r.price for r in rows], [r.cost for r in rows],
            [r.cause_id for r in rows], [r.kind.value for r in rows], [now_us] * len(rows))
        by_cause = {r.cause_id: r for r in rows}
        w.ledger_seq = max(w.ledger_seq, *(i["row_id"] for i in ids))
        return [CommittedRow(i["row_id"], by_cause[i["cause_id"]]) for i in ids]
