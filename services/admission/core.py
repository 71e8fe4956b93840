"""Admission's cycle, one tenant at a time.

Decisions for a tenant are serialised by that tenant's lock within a process and
by its book's version across processes (admission_books: several replicas may run
at once), so two submissions racing for the last of a budget can never both be
admitted. Each decision reads one snapshot of the ledger (credits, charges since
the last look, the state of this tenant's started allocations, its book's
version), decides with the pure domain, commits only while the book is at the
version it read, then publishes. A replica whose book is behind (another wrote
for the tenant) reloads the tenant's holds and held jobs before it decides; one
whose write was fenced out reads again and decides anew.

A hold is spent when the meter has closed its allocation (its final cost is
then in the ledger, written in the same transaction); until then it holds
amount - consumed. A hold whose start admission has not yet heard of counts
whole: never optimistic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TypeVar

from kestrel import db
from kestrel.batching import Batcher
from kestrel.clock import Clock, now_us
from kestrel.errors import PRIMARY_GONE, FailedPrecondition, NotFound, Unavailable
from kestrel.jobs import JobRow
from kestrel.workloads import EventType
from kestrel_sdk.money import ZERO
from kestrel_sdk.v1 import common_pb2
from services.admission.domain import (
    Budget,
    Decision,
    JobAsk,
    JobState,
    Policy,
    Reservation,
    Ruling,
    decide,
    releasable,
)
from services.admission.runway_check import Funds
from services.admission.store import (
    AdmissionStore,
    NewJob,
    Snapshot,
    SnapshotAsk,
    Stored,
    Transition,
)

log = logging.getLogger("kestrel.admission")

# The job state a workload event moves a job to (STARTED changes nothing: a job is
# RUNNING from Kueue's admission, when metering starts).
_STATE_OF: dict[int, JobState] = {
    EventType.ADMITTED: JobState.RUNNING, EventType.FINISHED: JobState.SUCCEEDED,
    EventType.EVICTED: JobState.EVICTED, EventType.FAILED: JobState.FAILED,
    EventType.CANCELLED: JobState.CANCELLED, EventType.QUEUED: JobState.QUEUED}

_KNOWN_EVENTS = frozenset(int(e) for e in EventType)

# Snapshots and INSERTs that tenants' decisions ask for in the same turn of the event
# loop (a batch of submits decides its tenants side by side, each under its own lock)
# go to Postgres as one statement (kestrel.batching): one round trip and one
# transaction for all of them instead of one each. At most this many tenants a
# statement; a statement has no deadline of its own, as before.
STORE_BATCH = 64
STORE_IN_FLIGHT = 4
_NO_DEADLINE_S = 3600.0
# How many times a decision is made again when another replica wrote for its tenant
# between its snapshot and its commit (each round, at least one replica commits), and
# how many times a snapshot reloads a book that is behind before it is used as read.
FENCE_TRIES = 32
RELOAD_TRIES = 3


class _Stale(Exception):
    """The tenant's book moved on since the decision read it: nothing was stored."""

A = TypeVar("A")
B = TypeVar("B")


@dataclass(frozen=True)
class WorkloadChange:
    """One of the placer's WorkloadEvents, as admission follows it."""

    tenant: str
    job_id: str
    kind: int  # kestrel.v1.WorkloadEventType (a newer placer's may be unknown here)
    time_us: int
    reason: str
    flavor: str = ""


def transition_of(c: WorkloadChange) -> Transition | None:
    """The move an event asks of its job, None when it asks none (STARTED, unknown)."""
    target = _STATE_OF.get(c.kind)
    if c.kind not in _KNOWN_EVENTS or target is None:
        return None
    live = (JobState.ADMITTED, JobState.QUEUED, JobState.RUNNING)
    allowed = {JobState.RUNNING: (JobState.ADMITTED, JobState.QUEUED),
               JobState.QUEUED: (JobState.ADMITTED,)}.get(target, live)
    return Transition(c.job_id, target, c.reason or target.name.lower(), allowed,
                      started_us=c.time_us if target is JobState.RUNNING else 0,
                      flavor=c.flavor if target is JobState.QUEUED else "",
                      flavor_reason=c.reason if target is JobState.QUEUED else "")


def waves(changes: Sequence[WorkloadChange]) -> list[list[int]]:
    """Indexes of `changes` in waves: a job's n-th change in wave n, in batch order."""
    seen: dict[str, int] = {}
    out: list[list[int]] = []
    for i, c in enumerate(changes):
        n = seen.get(c.job_id, 0)
        seen[c.job_id] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(i)
    return out


# (row, previous state or None for a new job, whether it was just admitted)
Publisher = Callable[[JobRow, JobState | None], Awaitable[None]]


async def _alone_on_failure(many: Callable[[list[A]], Awaitable[list[B]]], items: list[A]
                            ) -> Sequence[B | Exception]:
    """`many(items)`; when that one statement fails, each item again alone, so that one
    tenant's failure (its data, its rows) is its own result and not its neighbours'.
    The statement is one transaction: a failed one wrote nothing. A primary gone for
    longer than `db.retrying` waits fails them all at once: alone, each would wait again.
    """
    try:
        return await many(items)
    except PRIMARY_GONE as exc:
        if len(items) == 1:
            raise
        return [exc] * len(items)
    except Exception:
        if len(items) == 1:
            raise
    out: list[B | Exception] = []
    for item in items:
        try:
            out.append((await many([item]))[0])
        except Exception as exc:
            out.append(exc)
    return out


@dataclass
class Book:
    """What admission remembers of one tenant between decisions."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    version: int = 0  # admission_books' version that holds, started and held reflect
    seq: int = 0
    charged: Decimal = ZERO
    holds: dict[str, Decimal] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)  # holds whose allocation may be metered
    pending: Decimal = ZERO  # sum of holds not (known to be) started
    held: dict[str, JobAsk] = field(default_factory=dict)
    rolling: set[str] = field(default_factory=set)  # holds of endpoint replicas

    def hold(self, job_id: str, amount: Decimal, rolling: bool = False) -> None:
        self.holds[job_id] = amount
        self.pending += amount
        if rolling:
            self.rolling.add(job_id)

    def start(self, job_id: str) -> None:
        if job_id in self.holds and job_id not in self.started:
            self.started.add(job_id)
            self.pending -= self.holds[job_id]

    def drop(self, job_id: str) -> None:
        amount = self.holds.pop(job_id, None)
        if amount is not None and job_id not in self.started:
            self.pending -= amount
        self.started.discard(job_id)
        self.rolling.discard(job_id)

    def wrote(self, version: int | None) -> None:
        """Our own write left the book at `version` (None: it changed nothing). Unless
        it is the very next version, another replica wrote in between, and the book
        stays behind, to be reloaded before the next decision."""
        if version is not None and version == self.version + 1:
            self.version = version


@dataclass(frozen=True)
class Submission:
    ask: JobAsk
    name: str
    spec: bytes  # kestrel.v1.JobSpec, serialized
    key: str  # idempotency key ('' for none)


@dataclass(frozen=True)
class Outcome:
    job: JobRow
    decision: Decision
    budget: Budget
    duplicate: bool = False


def ask_of(row: JobRow, flavor: str) -> JobAsk:
    return JobAsk(row.job_id, row.tenant, row.gpus, flavor, row.max_duration_s, row.priority,
                  row.seq, rolling=bool(common_pb2.JobSpec.FromString(row.spec).endpoint_id))


class Admission:
    def __init__(self, store: AdmissionStore, publish: Publisher, *, max_node_gpus: int = 8,
                 clock: Clock = now_us) -> None:
        self.store = store
        self.publish = publish
        self.max_node_gpus = max_node_gpus
        self.clock = clock
        self.books: dict[str, Book] = {}
        self.prices: dict[str, Decimal] = {}
        self._snapshots: Batcher[SnapshotAsk, Snapshot] = Batcher(
            self._snapshot_batch, max_batch=STORE_BATCH, max_in_flight=STORE_IN_FLIGHT)
        self._inserts: Batcher[tuple[str, Sequence[NewJob], int], Stored] = Batcher(
            self._insert_batch, max_batch=STORE_BATCH, max_in_flight=STORE_IN_FLIGHT)
        self.stale_rounds = 0  # decisions made again: another replica wrote first

    async def _snapshot_batch(self, asks: list[SnapshotAsk], timeout_s: float
                              ) -> Sequence[Snapshot | Exception]:
        return await _alone_on_failure(
            lambda a: db.retrying("snapshots", lambda: self.store.snapshots(a)), asks)

    async def _insert_batch(self, groups: list[tuple[str, Sequence[NewJob], int]],
                            timeout_s: float) -> Sequence[Stored | Exception]:
        now = self.clock()
        # Repeated after a failover: a job's id is its key and the book's version fences
        # the group, so a repeat of a commit whose answer was lost stores nothing twice.
        return await _alone_on_failure(lambda gs: db.retrying("insert", lambda: (
            self.store.insert_many([(t, jobs) for t, jobs, _ in gs], now,
                                   [v for _, _, v in gs]))), groups)

    def book(self, tenant: str) -> Book:
        b = self.books.get(tenant)
        if b is None:
            b = self.books[tenant] = Book()
        return b

    async def load(self) -> None:
        self.prices = await self.store.prices()
        for tenant, job_id, amount, state, rolling in await self.store.open_holds():
            b = self.book(tenant)
            b.hold(job_id, amount, rolling)
            if JobState(state) not in (JobState.ADMITTED, JobState.QUEUED):
                b.start(job_id)
        for tenant in await self.store.held_tenants():
            for row in await self.store.held(tenant):
                self.book(tenant).held[row.job_id] = ask_of(row, self._flavor(row))

    async def _reload(self, tenant: str, b: Book) -> None:
        """Replace what the book holds of the tenant by what is stored: another replica
        wrote for it since this one last did."""
        rows = await self.store.book(tenant)
        b.holds.clear()
        b.started.clear()
        b.rolling.clear()
        b.held.clear()
        b.pending = ZERO
        for job_id, amount, state, rolling in rows.holds:
            b.hold(job_id, amount, rolling)
            if state not in (JobState.ADMITTED, JobState.QUEUED):
                b.start(job_id)
        for row in rows.held:
            b.held[row.job_id] = ask_of(row, self._flavor(row))
        b.version = rows.version

    @staticmethod
    def _flavor(row: JobRow) -> str:
        return common_pb2.JobSpec.FromString(row.spec).flavor

    # --- the ledger snapshot -------------------------------------------------

    async def _snapshot(self, tenant: str, b: Book, costs: bool) -> Snapshot:
        """Read the ledger once: fold the charges since the last look into the book,
        and spend the holds whose allocation the meter has closed. A book behind the
        stored version is reloaded and read again (the started holds asked about are
        the book's)."""
        for _ in range(RELOAD_TRIES):
            snap = await self._snapshots.call(
                SnapshotAsk(tenant, b.seq, tuple(sorted(b.started)), costs), _NO_DEADLINE_S)
            b.charged += snap.charged_since
            b.seq = snap.seq
            if snap.version == b.version:
                break
            await self._reload(tenant, b)
        spent = [jid for jid in snap.closed if jid in b.holds]
        if spent:
            b.wrote(await self.store.release(tenant, spent, "allocation closed by the meter",
                                             self.clock()))
            for jid in spent:
                b.drop(jid)
        return snap

    async def _budget(self, tenant: str, b: Book) -> tuple[Policy | None, Budget]:
        """The budget a decision needs: started holds count what they have not yet
        consumed, so this snapshot carries each started allocation's cost."""
        snap = await self._snapshot(tenant, b, costs=True)
        started = tuple(Reservation(jid, b.holds[jid], snap.consumed.get(jid, ZERO),
                             rolling=jid in b.rolling) for jid in b.started)
        return snap.policy, Budget(snap.credits, b.charged, b.pending, started)

    async def money(self, tenant: str) -> Funds | None:
        """The tenant's credits and charges from a fresh ledger snapshot (None: unknown
        tenant). The runway check asks for this often and needs no hold's cost."""
        b = self.book(tenant)
        async with b.lock:
            snap = await self._snapshot(tenant, b, costs=False)
            charged = b.charged
        if snap.policy is None:
            return None
        return Funds(snap.credits, charged)

    # --- decisions -----------------------------------------------------------

    async def admit(self, ask: JobAsk, name: str, spec: bytes, key: str) -> Outcome:
        """Decide on one job (see admit_many)."""
        (out,) = await self.admit_many([Submission(ask, name, spec, key)])
        if isinstance(out, BaseException):
            raise out
        return out

    async def admit_many(self, subs: Sequence[Submission]) -> list[Outcome | Exception]:
        """Decide on each submission as if they had come one by one, in order: each
        tenant's under its lock, with one ledger snapshot and one insert for all of its
        jobs here (the tenants' snapshots, then their inserts, go to Postgres as one
        statement each: STORE_BATCH). Publish after the locks, so the next decision of a
        tenant does not wait for the bus. Results are in order; a failure is that job's
        result (a tenant's store failure is each of its jobs' result), never another
        tenant's."""
        groups: dict[str, list[int]] = {}
        for i, sub in enumerate(subs):
            groups.setdefault(sub.ask.tenant, []).append(i)
        results: list[Outcome | Exception] = [NotFound("undecided")] * len(subs)

        async def decide_group(idx: list[int]) -> None:
            try:
                outs: Sequence[Outcome | Exception] = await self._admit_group(
                    [subs[i] for i in idx])
            except Exception as exc:  # the snapshot or the insert failed: none decided
                outs = [exc] * len(idx)
            for i, out in zip(idx, outs, strict=True):
                results[i] = out

        await asyncio.gather(*(decide_group(idx) for idx in groups.values()))

        async def announce(i: int, out: Outcome) -> None:
            try:
                await self.publish(out.job, None)
            except Exception as exc:
                results[i] = exc

        await asyncio.gather(*(announce(i, out) for i, out in enumerate(results)
                               if isinstance(out, Outcome) and not out.duplicate))
        return results

    async def _admit_group(self, subs: Sequence[Submission]) -> list[Outcome | Exception]:
        """One tenant's submissions, decided in order under its lock."""
        tenant = subs[0].ask.tenant
        b = self.book(tenant)
        async with b.lock:
            out: list[Outcome | Exception] = [NotFound("undecided")] * len(subs)
            keys = sorted({s.key for s in subs if s.key})
            existing = await self.store.find_by_keys(tenant, keys) if keys else {}
            # A key or a job id used twice here: the later one is answered as it would
            # have been one call later (the first's job, or its id taken).
            first_of: dict[tuple[str, str], int] = {}
            repeats: dict[int, int] = {}
            todo: list[int] = []
            for i, sub in enumerate(subs):
                same_key = first_of.get(("key", sub.key)) if sub.key else None
                same_id = first_of.get(("id", sub.ask.job_id))
                if sub.key in existing:
                    out[i] = self._replay(existing[sub.key])
                elif same_key is not None:
                    repeats[i] = same_key
                elif same_id is not None and not sub.key:
                    repeats[i] = same_id
                elif same_id is not None:
                    out[i] = FailedPrecondition(f"job id {sub.ask.job_id} is taken")
                else:
                    if sub.key:
                        first_of[("key", sub.key)] = i
                    first_of[("id", sub.ask.job_id)] = i
                    todo.append(i)
            for _ in range(FENCE_TRIES if todo else 0):
                policy, budget = await self._budget(tenant, b)
                if policy is None:
                    for i in todo:
                        out[i] = NotFound(f"tenant {tenant!r} does not exist")
                    break
                try:
                    decided = await self._decide_and_store(b, policy, budget,
                                                           [subs[i] for i in todo])
                except _Stale:  # another replica wrote first: read again, decide anew
                    self.stale_rounds += 1
                    continue
                for i, o in zip(todo, decided, strict=True):
                    out[i] = o
                break
            else:
                if todo:
                    for i in todo:
                        out[i] = Unavailable(f"tenant {tenant!r}'s budget is contended by "
                                             "other admission replicas; try again")
            for i, first in repeats.items():
                done = out[first]
                out[i] = self._replay(done.job) if isinstance(done, Outcome) else done
            return out

    async def _decide_and_store(self, b: Book, policy: Policy, budget: Budget,
                                subs: Sequence[Submission]) -> list[Outcome | Exception]:
        """Decide each in order (each sees the holds and the queue the ones before it
        left), store them in one statement, then remember what was stored."""
        held_priorities = [h.priority for h in b.held.values()]
        decided: list[tuple[NewJob, Budget]] = []
        for sub in subs:
            queue_ahead = any(p >= sub.ask.priority for p in held_priorities)
            d = decide(sub.ask, policy, budget, self.prices, self.max_node_gpus, queue_ahead)
            if d.verdict is Ruling.ADMITTED:
                budget = budget.plus(d.reserved)
            elif d.verdict is Ruling.HELD:
                held_priorities.append(sub.ask.priority)
            decided.append((NewJob(sub.ask, sub.name, sub.spec, sub.key, d), budget))
        stored = await self._inserts.call((policy.tenant, [n for n, _ in decided], b.version),
                                          _NO_DEADLINE_S)
        if stored.version is None:
            raise _Stale(policy.tenant)
        b.version = stored.version
        rows = stored.rows
        # What was stored is held in the book before anything else is awaited: a later
        # failure must not leave a committed hold unknown to the next decision.
        out: list[Outcome | Exception | None] = []
        for new, after in decided:
            row = rows.get(new.ask.job_id)
            if row is None:  # the job id or key exists already: reported below
                out.append(None)
                continue
            if new.decision.verdict is Ruling.ADMITTED:
                b.hold(new.ask.job_id, new.decision.reserved, new.ask.rolling)
            elif new.decision.verdict is Ruling.HELD:
                b.held[new.ask.job_id] = ask_of(row, new.ask.flavor)
            out.append(Outcome(row, new.decision, after))
        again: dict[str, JobRow] | Exception = {}
        if any(o is None for o in out):
            try:
                again = await self._already_stored(
                    policy.tenant, [n for n, _ in decided if n.ask.job_id not in rows])
            except Exception as exc:  # only the collided ones fail with it
                again = exc
        return [o if o is not None else self._collided(n, again)
                for o, (n, _) in zip(out, decided, strict=True)]

    def _collided(self, new: NewJob, stored: dict[str, JobRow] | Exception
                  ) -> Outcome | Exception:
        """A job whose id or key was already used: that job, replayed."""
        if isinstance(stored, Exception):
            return stored
        row = stored.get(new.ask.job_id)
        return (self._replay(row) if row is not None else
                FailedPrecondition(f"job id {new.ask.job_id} is taken"))

    async def _already_stored(self, tenant: str, jobs: Sequence[NewJob]) -> dict[str, JobRow]:
        """The tenant's stored job each of `jobs` collided with (by its key, else its
        id), by the id it was submitted with; another tenant's job is left out."""
        keys = [n.key for n in jobs if n.key]
        ids = [n.ask.job_id for n in jobs if not n.key]
        by_key = await self.store.find_by_keys(tenant, keys) if keys else {}
        by_id = await self.store.get_many(ids) if ids else {}
        out = {n.ask.job_id: by_key[n.key] for n in jobs if n.key in by_key}
        out.update({jid: row for jid, row in by_id.items() if row.tenant == tenant})
        return out

    def _replay(self, row: JobRow) -> Outcome:
        verdict = {JobState.HELD: Ruling.HELD, JobState.REJECTED: Ruling.REJECTED}.get(
            row.state, Ruling.ADMITTED)
        if row.state is JobState.CANCELLED and row.admitted_us == 0:
            verdict = Ruling.HELD
        d = Decision(verdict, row.reason, row.reserved, row.priced_flavor)
        return Outcome(row, d, Budget(ZERO, ZERO), duplicate=True)

    async def reevaluate(self, tenant: str) -> list[JobRow]:
        """Spend closed holds, then release held jobs that now fit, in order."""
        b = self.book(tenant)
        released: list[JobRow] = []
        async with b.lock:
            if not b.held:  # nothing to release (unless the book was behind): spend holds
                await self._snapshot(tenant, b, costs=False)
                if not b.held:
                    return released
            for _ in range(FENCE_TRIES):
                policy, budget = await self._budget(tenant, b)
                if policy is None or not await self._release_held(b, policy, budget,
                                                                  released):
                    break
                self.stale_rounds += 1
        return released

    async def _release_held(self, b: Book, policy: Policy, budget: Budget,
                            released: list[JobRow]) -> bool:
        """Admit (or reject) the held jobs that now fit, in order, into `released`;
        True when another replica wrote for the tenant first (decide again)."""
        for ask, d in releasable(list(b.held.values()), policy, budget, self.prices,
                                 self.max_node_gpus):
            version, row = await db.retrying("admit held", functools.partial(
                self.store.admit_held, ask, d, self.clock(), b.version))
            if version is None:
                return True
            b.wrote(version)
            b.held.pop(ask.job_id, None)
            if row is None:
                continue
            if d.verdict is Ruling.ADMITTED:
                b.hold(ask.job_id, d.reserved, ask.rolling)
            await self.publish(row, JobState.HELD)
            released.append(row)
        return False

    async def cancel(self, tenant: str, job_id: str, reason: str) -> JobRow:
        b = self.book(tenant)
        async with b.lock:
            await self._snapshot(tenant, b, costs=False)  # the book current: what started
            row = await self.store.get(job_id)
            if row is None or row.tenant != tenant:
                raise NotFound(f"job {job_id} not found")
            if row.state.terminal:
                raise FailedPrecondition(f"job {job_id} is already {row.state.name.lower()}")
            never_ran = row.state in (JobState.HELD, JobState.ADMITTED, JobState.QUEUED) and (
                job_id not in b.started)
            moved, version = await self.store.transition(
                job_id, JobState.CANCELLED, reason or "cancelled by the tenant", self.clock(),
                allowed_from=[row.state], release=never_ran)
            if moved is None:
                raise FailedPrecondition(f"job {job_id} changed state; try again")
            b.wrote(version)
            prev, new = moved
            b.held.pop(job_id, None)
            if never_ran:
                b.drop(job_id)
            await self.publish(new, prev)
        if never_ran:
            await self.reevaluate(tenant)
        return new

    async def workload_event(self, tenant: str, job_id: str, kind: int, time_us: int,
                             reason: str, flavor: str = "") -> JobRow | None:
        """Follow a job through Kubernetes (one event from the placer)."""
        change = WorkloadChange(tenant, job_id, kind, time_us, reason, flavor)
        return (await self.workload_events([change]))[0]

    async def workload_events(self, changes: Sequence[WorkloadChange]
                              ) -> list[JobRow | None]:
        """Follow jobs through Kubernetes: a fetched batch of the placer's events, each
        applied as workload_event would, in order; the job each moved (None where none).

        The batch goes in waves, a job at most once in each (its first event in the
        first wave, its second in the second...), so its states still follow stream
        order; each wave is one statement and one round of announcements, sent
        together, with the locks of its tenants held throughout."""
        out: list[JobRow | None] = [None] * len(changes)
        for wave in waves(changes):
            tenants = sorted({changes[i].tenant for i in wave})
            async with contextlib.AsyncExitStack() as held:
                for tenant in tenants:  # in one order: two waves never wait on each other
                    await held.enter_async_context(self.book(tenant).lock)
                moves: list[tuple[int, Transition]] = []
                for i in wave:
                    c = changes[i]
                    if c.kind not in _KNOWN_EVENTS:  # a newer placer's event: not followed
                        continue
                    if not EventType(c.kind).informational:
                        # Only Kueue's admission (or a close) means the meter may hold an
                        # allocation for it. A QUEUED job has none: cancelled, it never
                        # will, so cancel() releases its hold itself.
                        self.book(c.tenant).start(c.job_id)
                    if (t := transition_of(c)) is not None:
                        moves.append((i, t))
                if not moves:
                    continue
                result = await self.store.transition_many([t for _, t in moves],
                                                          self.clock())
                for tenant, version in result.versions.items():
                    self.book(tenant).wrote(version)
                moved = result.jobs
                announce = []
                for i, t in moves:
                    m = moved.get(t.job_id)
                    if m is None:
                        if t.to is JobState.QUEUED and t.flavor:
                            # Placed but not moved (a HELD job waits at the runway check):
                            # the placer's choice is recorded all the same. A moved job
                            # got it with its transition.
                            await self.store.set_flavor(t.job_id, t.flavor, t.flavor_reason)
                        continue
                    out[i] = m[1]
                    announce.append(self.publish(m[1], m[0]))
                await asyncio.gather(*announce)
        return out
