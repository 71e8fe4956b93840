"""Admission's Postgres adapter. Writes jobs, job_transitions and the budget holds
(reservations, reservation_releases; open_reservations follows them by trigger):
admission is their one writer and their schema is in its migrations. Each tenant's
book has a version (admission_books, migration 0006): every statement that changes a
tenant's book bumps it, and those that open a hold are fenced on it, so that several
admission replicas deciding at once never reserve one budget twice. Reads what the
meter and the gateway publish for it,
never their tables: the meter's meter_budget() and current_prices, the gateway's
tenant_policies, a decision's figures in one statement so it sees one snapshot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import asyncpg

from kestrel.db import migrate
from kestrel.jobs import JOB_COLS, JobRow, JobState, job_row
from services.admission.domain import QUEUED_BEHIND, Decision, JobAsk, Policy, Ruling

MIGRATIONS = Path(__file__).parent / "migrations"

# The held jobs, read through the partial index jobs_held (WHERE state = 1). The state
# is written into the text, not passed: asyncpg prepares each statement, and after
# five runs Postgres may keep a generic plan, which cannot know that a parameter
# `state = $2` matches the index's predicate, and scans the whole jobs table instead
# (every job ever submitted; bench-jobs: 113 rows scanned a job, growing with history).
HELD_OF_TENANT = (f"SELECT {JOB_COLS} FROM jobs WHERE tenant = $1 "
                  f"AND state = {int(JobState.HELD)} ORDER BY priority DESC, seq")
HELD_TENANTS = f"SELECT DISTINCT tenant FROM jobs WHERE state = {int(JobState.HELD)}"
# Per tenant and kind of reason (behind: waiting behind another held job), how many
# jobs are held and since when the oldest: a row per tenant and kind, however many wait.
HELD_FOR_METRICS = (f"SELECT tenant, strpos(reason, '{QUEUED_BEHIND}') > 0 AS behind, "
                    f"count(*) AS n, min(created_us) AS since_us FROM jobs "
                    f"WHERE state = {int(JobState.HELD)} GROUP BY 1, 2")


def _qualified(alias: str, cols: str) -> str:
    """`a, b` -> `j.a, j.b`: the columns of one table in a statement that joins it."""
    return ", ".join(f"{alias}.{c.strip()}" for c in cols.split(","))


def _bump_books(rows: str, fence: str = "") -> str:
    """The one way a statement moves tenants' books on: `rows` gives (tenant, version
    for a book not yet stored); a stored book's version goes up by one, only where
    `fence` holds when there is one. Alias `b` names the book in RETURNING."""
    return (f"INSERT INTO admission_books AS b (tenant, version) {rows} "
            f"ON CONFLICT (tenant) DO UPDATE SET version = b.version + 1 {fence}")


# insert_many: each tenant's book, only where it is still at the version expected ($17, $18)
_BUMP_EXPECTED = _bump_books(
    "SELECT e.tenant, e.expected + 1 "
    "FROM unnest($17::text[], $18::bigint[]) WITH ORDINALITY AS e(tenant, expected, o) "
    "ORDER BY e.o", fence="WHERE b.version = EXCLUDED.version - 1")
# transition_many: the books of the tenants whose jobs moved (CTE u)
_BUMP_MOVED = _bump_books("SELECT DISTINCT tenant, 1 FROM u ORDER BY tenant")
# release: tenant $4's book, when a hold was released (CTE r)
_BUMP_RELEASED = _bump_books("SELECT $4, 1 WHERE EXISTS (SELECT 1 FROM r)")


@dataclass(frozen=True)
class NewJob:
    """A decided job, to be stored."""

    ask: JobAsk
    name: str
    spec: bytes
    key: str  # idempotency key ('' for none)
    decision: Decision


@dataclass(frozen=True)
class Snapshot:
    policy: Policy | None
    credits: Decimal
    charged_since: Decimal  # ledger cost of the tenant with row_id > the given seq
    seq: int
    closed: frozenset[str]  # of the started job ids asked about: allocation closed
    consumed: dict[str, Decimal]  # started job id -> its ledger cost so far (when asked)
    version: int = 0  # the tenant's book version (0: no book stored yet)


@dataclass(frozen=True)
class Stored:
    """What one tenant's fenced write stored: the jobs by id, and its book's version
    after the write; version None when the book had moved on since the decision read it
    (another replica wrote first): then nothing of the tenant's was stored."""

    version: int | None
    rows: dict[str, JobRow]


@dataclass(frozen=True)
class BookRows:
    """A tenant's book as stored, read in one snapshot: its version, open holds
    (job id, amount, job state, rolling) and held jobs in the order they wait."""

    version: int
    holds: list[tuple[str, Decimal, JobState, bool]]
    held: list[JobRow]


@dataclass(frozen=True)
class Moved:
    """transition_many's answer: the jobs moved (with the state each left) and the new
    book version of each tenant whose jobs moved."""

    jobs: dict[str, tuple[JobState, JobRow]]
    versions: dict[str, int]


@dataclass(frozen=True)
class SnapshotAsk:
    """What one tenant's snapshot is asked with (AdmissionStore.snapshots)."""

    tenant: str
    after_seq: int
    started: tuple[str, ...]
    costs: bool


def _snapshot_of(tenant: str, r: asyncpg.Record) -> Snapshot:
    policy = None
    if r["known"]:
        # The most it may hold at once: its quota plus what it may borrow.
        quota = {k: int(v) for k, v in json.loads(r["gpu_quota"]).items()}
        for k, v in json.loads(r["gpu_borrow"]).items():
            quota[k] = quota.get(k, 0) + int(v)
        policy = Policy(tenant, quota, bool(r["suspended"]))
    allocs = json.loads(r["allocs"])
    closed = frozenset(wid for wid, is_closed, _ in allocs if is_closed)
    consumed = {wid: Decimal(c) for wid, _, c in allocs if c is not None}
    return Snapshot(policy, r["credits"], r["charged"], int(r["seq"]), closed, consumed,
                    int(r["version"]))


@dataclass(frozen=True)
class Transition:
    """One job's move, made only from one of `allowed_from`."""

    job_id: str
    to: JobState
    reason: str
    allowed_from: Sequence[JobState]
    started_us: int = 0  # set once: the first start stands
    flavor: str = ""  # with its reason, recorded when set
    flavor_reason: str = ""


class AdmissionStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def migrate(self) -> list[str]:
        async with self.pool.acquire() as conn:
            return await migrate(conn, "admission", MIGRATIONS)

    async def schema_ready(self) -> bool:
        """What admission reads of others exists (the meter and the gateway migrated)."""
        return bool(await self.pool.fetchval(
            "SELECT to_regprocedure('meter_budget(text, bigint, text[], boolean)') IS NOT NULL "
            "AND to_regclass('tenant_policies') IS NOT NULL"))

    async def prices(self) -> dict[str, Decimal]:
        rows = await self.pool.fetch("SELECT flavor, price_per_gpu_s FROM current_prices")
        return {r["flavor"]: r["price_per_gpu_s"] for r in rows}

    async def snapshots(self, asks: Sequence[SnapshotAsk]) -> list[Snapshot]:
        """For each tenant asked (each at most once), in the order asked: credits,
        charges since its `after_seq`, which of its `started` allocations the meter has
        closed and, with `costs`, each one's ledger cost so far. The meter's own
        meter_budget(), which reads its tables, with the gateway's tenant_policies, in
        one statement: one round trip, and one snapshot of the ledger for all."""
        started = [(job_id, i) for i, a in enumerate(asks, 1) for job_id in a.started]
        rows = await self.pool.fetch("""
            SELECT p.gpu_quota, p.gpu_borrow, p.suspended, (p.tenant IS NOT NULL) AS known,
                   b.credits, b.charged, b.seq, b.allocs, coalesce(v.version, 0) AS version
            FROM unnest($1::text[], $2::bigint[], $3::boolean[])
                   WITH ORDINALITY AS t(tenant, after_seq, costs, i)
            CROSS JOIN LATERAL meter_budget(
                t.tenant, t.after_seq,
                ARRAY(SELECT s.job_id FROM unnest($4::text[], $5::bigint[]) AS s(job_id, i)
                      WHERE s.i = t.i),
                t.costs) b
            LEFT JOIN tenant_policies p ON p.tenant = t.tenant
            LEFT JOIN admission_books v ON v.tenant = t.tenant
            ORDER BY t.i""", [a.tenant for a in asks], [a.after_seq for a in asks],
            [a.costs for a in asks], [j for j, _ in started], [i for _, i in started])
        return [_snapshot_of(a.tenant, r) for a, r in zip(asks, rows, strict=True)]

    async def get(self, job_id: str) -> JobRow | None:
        r = await self.pool.fetchrow(f"SELECT {JOB_COLS} FROM jobs WHERE job_id = $1", job_id)
        return job_row(r) if r else None

    async def find_by_keys(self, tenant: str, keys: Sequence[str]) -> dict[str, JobRow]:
        """The tenant's jobs stored under any of `keys`, by key."""
        rows = await self.pool.fetch(
            f"SELECT {JOB_COLS} FROM jobs WHERE tenant = $1 AND idempotency_key = ANY($2)",
            tenant, list(keys))
        return {r["idempotency_key"]: job_row(r) for r in rows}

    async def book(self, tenant: str) -> BookRows:
        """The tenant's book as stored (a replica whose book is behind reloads it)."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            version = await conn.fetchval(
                "SELECT version FROM admission_books WHERE tenant = $1", tenant)
            holds = await conn.fetch("""
                SELECT r.reservation_id, r.amount, j.state, r.rolling
                FROM open_reservations r JOIN jobs j ON j.job_id = r.reservation_id
                WHERE r.tenant = $1""", tenant)
            held = await conn.fetch(HELD_OF_TENANT, tenant)
        return BookRows(int(version or 0),
                        [(r["reservation_id"], r["amount"], JobState(r["state"]), r["rolling"])
                         for r in holds], [job_row(r) for r in held])

    async def insert_many(self, groups: Sequence[tuple[str, Sequence[NewJob]]], now_us: int,
                          expected: Sequence[int]) -> list[Stored]:
        """Store tenants' decided jobs, each tenant's in order (their seq follows the
        order of `groups`, then of each group's jobs), with each one's first transition
        and, when admitted, its reservation; each group only while its tenant's book is
        still at the version its decision read (`expected`, by group), bumping it.
        Returns, for each group, what was stored: a job whose idempotency key or id was
        already used is absent, and the caller reports that job instead.

        One statement (so one round trip and one implicit transaction) for all of
        them, or nothing at all."""
        state = {Ruling.ADMITTED: JobState.ADMITTED, Ruling.HELD: JobState.HELD,
                 Ruling.REJECTED: JobState.REJECTED}
        cols: list[list[object]] = [[] for _ in range(15)]
        for tenant, jobs in groups:
            for j in jobs:
                admitted = j.decision.verdict is Ruling.ADMITTED
                for col, value in zip(cols, (
                        j.ask.job_id, j.name, j.spec, j.ask.gpus, j.ask.priority,
                        j.ask.max_duration_s, int(state[j.decision.verdict]),
                        j.decision.reason, j.decision.reserved if admitted else 0,
                        j.decision.priced_flavor, j.key, now_us if admitted else 0,
                        now_us if j.decision.verdict is Ruling.REJECTED else 0,
                        j.ask.rolling, tenant), strict=True):
                    col.append(value)
        order = sorted(range(len(groups)), key=lambda i: groups[i][0])  # locks in one order
        rows = await self.pool.fetch(f"""
            WITH book AS (
              {_BUMP_EXPECTED}
              RETURNING b.tenant, b.version),
            v AS (
              SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int[], $5::int[],
                                   $6::bigint[], $7::smallint[], $8::text[], $9::numeric[],
                                   $10::text[], $11::text[], $12::bigint[], $13::bigint[],
                                   $14::boolean[], $15::text[])
                WITH ORDINALITY AS v(job_id, name, spec, gpus, priority, max_duration_s,
                                     state, reason, reserved, priced_flavor, idempotency_key,
                                     admitted_us, finished_us, rolling, tenant, ord)),
            j AS (
              INSERT INTO jobs (job_id, tenant, name, spec, gpus, priority, max_duration_s,
                                state, reason, reserved, priced_flavor, idempotency_key,
                                created_us, admitted_us, finished_us)
              SELECT job_id, tenant, name, spec, gpus, priority, max_duration_s, state, reason,
                     reserved, priced_flavor, idempotency_key, $16, admitted_us, finished_us
              FROM v WHERE v.tenant IN (SELECT tenant FROM book) ORDER BY ord
              ON CONFLICT DO NOTHING RETURNING {JOB_COLS}),
            t AS (
              INSERT INTO job_transitions (job_id, tenant, from_state, to_state, reason, time_us)
              SELECT job_id, tenant, 0, state, reason, $16 FROM j),
            r AS (
              INSERT INTO reservations (reservation_id, tenant, workload_id, amount, created_us,
                                        rolling)
              SELECT j.job_id, j.tenant, j.job_id, j.reserved, $16, v.rolling
              FROM j JOIN v USING (job_id, tenant) WHERE j.state = {int(JobState.ADMITTED)})
            SELECT book.tenant AS book_tenant, book.version AS book_version, j.*
            FROM book LEFT JOIN j ON j.tenant = book.tenant""", *cols, now_us,
            [groups[i][0] for i in order], [expected[i] for i in order])
        versions = {r["book_tenant"]: int(r["book_version"]) for r in rows}
        stored: dict[tuple[str, str], JobRow] = {(r["tenant"], r["job_id"]): job_row(r)
                                                 for r in rows if r["job_id"] is not None}
        return [Stored(versions.get(tenant),
                       {j.ask.job_id: row for j in jobs
                        if (row := stored.get((tenant, j.ask.job_id))) is not None})
                for tenant, jobs in groups]

    async def admit_held(self, ask: JobAsk, d: Decision, now_us: int, expected: int
                         ) -> tuple[int | None, JobRow | None]:
        """HELD -> ADMITTED (or REJECTED) with its reservation, while the tenant's book
        is at `expected`: (its new version, the row), (None, None) when the book had moved
        on (nothing written), (version, None) when the job is no longer HELD.
        One statement, like insert_many()."""
        state = JobState.ADMITTED if d.verdict is Ruling.ADMITTED else JobState.REJECTED
        admitted = state is JobState.ADMITTED
        rows = await self.pool.fetch(f"""
            WITH book AS (
              UPDATE admission_books SET version = version + 1
              WHERE tenant = $11 AND version = $12 RETURNING version),
            u AS (
              UPDATE jobs SET state = $2, reason = $3, reserved = $4, priced_flavor = $5,
                     admitted_us = $6, finished_us = $7
              WHERE job_id = $1 AND tenant = $11 AND state = {int(JobState.HELD)}
                AND EXISTS (SELECT 1 FROM book) RETURNING {JOB_COLS}),
            t AS (
              INSERT INTO job_transitions (job_id, tenant, from_state, to_state, reason, time_us)
              SELECT job_id, tenant, {int(JobState.HELD)}, $2, $3, $8 FROM u),
            r AS (
              INSERT INTO reservations (reservation_id, tenant, workload_id, amount, created_us,
                                        rolling)
              SELECT job_id, tenant, job_id, reserved, $8, $10 FROM u WHERE $9::boolean)
            SELECT book.version AS book_version, u.* FROM book LEFT JOIN u ON true""",
            ask.job_id, int(state), d.reason, d.reserved if admitted else 0, d.priced_flavor,
            now_us if admitted else 0, 0 if admitted else now_us, now_us, admitted,
            ask.rolling, ask.tenant, expected)
        if not rows:
            return None, None
        r = rows[0]
        return int(r["book_version"]), job_row(r) if r["job_id"] is not None else None

    async def transition(self, job_id: str, to: JobState, reason: str, now_us: int, *,
                         allowed_from: Sequence[JobState], release: bool = False,
                         started_us: int = 0, flavor: tuple[str, str] | None = None
                         ) -> tuple[tuple[JobState, JobRow] | None, int | None]:
        """Move a job between states: (the state it left, its row), or None if it is not
        in one of `allowed_from`; and its tenant's new book version (None: not moved).
        With `release`, its reservation is released in the same statement."""
        move = Transition(job_id, to, reason, allowed_from, started_us, *(flavor or ("", "")))
        moved = await self.transition_many([move], now_us, release=release)
        got = moved.jobs.get(job_id)
        return got, moved.versions.get(got[1].tenant) if got else None

    async def transition_many(self, moves: Sequence[Transition], now_us: int, *,
                              release: bool = False) -> Moved:
        """Several jobs' moves (each job at most once) in one statement: the jobs moved,
        by id, with the state each left. A job in none of its `allowed_from` states (or
        unknown) is left as it is and absent from the answer. With `release`, each moved
        job's reservation is released too.

        One round trip and one implicit transaction for a whole batch of the placer's
        events (it was five round trips per event once: BEGIN, SELECT FOR UPDATE,
        UPDATE, INSERT, COMMIT). The books of the jobs' tenants are locked first, in
        tenant order, then the jobs in job id order (the fenced writes lock a book before
        its jobs too), so two statements over the same jobs wait rather than deadlock;
        the books of the tenants whose jobs moved are bumped."""
        if len({m.job_id for m in moves}) != len(moves):
            raise ValueError("a job may move once per statement")
        rows = await self.pool.fetch(f"""
            WITH a AS (
              SELECT * FROM unnest($1::text[], $2::smallint[], $3::text[], $4::boolean[],
                                   $5::bigint[], $6::text[], $7::text[], $8::int[])
                AS a(job_id, to_state, reason, terminal, started_us, flavor, flavor_reason,
                     allowed)),
            books AS MATERIALIZED (
              SELECT b.tenant FROM admission_books b
              WHERE b.tenant IN (SELECT j.tenant FROM jobs j JOIN a ON a.job_id = j.job_id)
              ORDER BY b.tenant FOR UPDATE OF b),
            old AS (
              SELECT j.job_id, j.state FROM jobs j JOIN a ON a.job_id = j.job_id
              WHERE (SELECT count(*) FROM books) >= 0
              ORDER BY j.job_id FOR UPDATE OF j),
            u AS (
              UPDATE jobs j SET state = a.to_state, reason = a.reason,
                finished_us = CASE WHEN a.terminal THEN $9::bigint ELSE j.finished_us END,
                started_us = CASE WHEN a.started_us > 0 AND j.started_us = 0
                                  THEN a.started_us ELSE j.started_us END,
                flavor = CASE WHEN a.flavor <> '' THEN a.flavor ELSE j.flavor END,
                flavor_reason = CASE WHEN a.flavor <> '' THEN a.flavor_reason
                                     ELSE j.flavor_reason END
              FROM a JOIN old ON old.job_id = a.job_id
              WHERE j.job_id = a.job_id AND (a.allowed >> old.state) & 1 = 1
              RETURNING old.state AS prev_state, a.reason AS moved_reason,
                        {_qualified("j", JOB_COLS)}),
            t AS (
              INSERT INTO job_transitions (job_id, tenant, from_state, to_state, reason, time_us)
              SELECT job_id, tenant, prev_state, state, moved_reason, $9 FROM u),
            r AS (
              INSERT INTO reservation_releases (reservation_id, reason, released_us)
              SELECT r.reservation_id, u.moved_reason, $9 FROM reservations r
              JOIN u ON r.reservation_id = u.job_id WHERE $10::boolean
              ON CONFLICT DO NOTHING),
            bump AS (
              {_BUMP_MOVED}
              RETURNING b.tenant, b.version)
            SELECT bump.version AS book_version, u.* FROM u JOIN bump USING (tenant)""",
            [m.job_id for m in moves], [int(m.to) for m in moves],
            [m.reason for m in moves], [m.to.terminal for m in moves],
            [m.started_us for m in moves], [m.flavor for m in moves],
            [m.flavor_reason for m in moves],
            [sum(1 << int(s) for s in set(m.allowed_from)) for m in moves], now_us, release)
        return Moved({r["job_id"]: (JobState(r["prev_state"]), job_row(r)) for r in rows},
                     {r["tenant"]: int(r["book_version"]) for r in rows})

    async def set_flavor(self, job_id: str, flavor: str, reason: str) -> None:
        """The placer's choice, recorded whatever the job's state (a HELD job is placed
        too, and waits at the runway check)."""
        await self.pool.execute(
            "UPDATE jobs SET flavor = $2, flavor_reason = $3 WHERE job_id = $1",
            job_id, flavor, reason)

    async def release(self, tenant: str, job_ids: Sequence[str], reason: str, now_us: int
                      ) -> int | None:
        """Release the tenant's holds `job_ids`: its book's new version, None when none
        was still open (another replica released them first)."""
        version = await self.pool.fetchval(f"""
            WITH book AS MATERIALIZED (
              SELECT tenant FROM admission_books WHERE tenant = $4 FOR UPDATE),
            r AS (
              INSERT INTO reservation_releases (reservation_id, reason, released_us)
              SELECT reservation_id, $2, $3 FROM reservations
              WHERE reservation_id = ANY($1::text[]) AND tenant = $4
                AND (SELECT count(*) FROM book) >= 0
              ON CONFLICT DO NOTHING RETURNING reservation_id),
            bump AS (
              {_BUMP_RELEASED}
              RETURNING b.version)
            SELECT version FROM bump""", list(job_ids), reason, now_us, tenant)
        return int(version) if version is not None else None

    async def open_holds(self) -> list[tuple[str, str, Decimal, int, bool]]:
        """(tenant, job id, amount, state, rolling) of every unreleased reservation."""
        rows = await self.pool.fetch("""
            SELECT r.tenant, r.reservation_id, r.amount, j.state, r.rolling
            FROM open_reservations r JOIN jobs j ON j.job_id = r.reservation_id""")
        return [(r["tenant"], r["reservation_id"], r["amount"], r["state"], r["rolling"])
                for r in rows]

    async def get_many(self, job_ids: Sequence[str]) -> dict[str, JobRow]:
        rows = await self.pool.fetch(
            f"SELECT {JOB_COLS} FROM jobs WHERE job_id = ANY($1::text[])", list(job_ids))
        return {r["job_id"]: job_row(r) for r in rows}

    async def held(self, tenant: str) -> list[JobRow]:
        rows = await self.pool.fetch(HELD_OF_TENANT, tenant)
        return [job_row(r) for r in rows]

    async def held_tenants(self) -> list[str]:
        return [r["tenant"] for r in await self.pool.fetch(HELD_TENANTS)]

    async def admitted_not_placed(self) -> list[JobRow]:
        """Jobs the placer may not have heard of (it acknowledges by reporting QUEUED)."""
        rows = await self.pool.fetch(f"SELECT {JOB_COLS} FROM jobs WHERE state = ANY($1)",
                                     [int(JobState.ADMITTED), int(JobState.HELD)])
        return [job_row(r) for r in rows]
