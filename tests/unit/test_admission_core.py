"""services.admission.core: admission's cycle with its store and publisher behind small
in-memory fakes (the Postgres store is exercised by the integration tier). What the
fakes keep is what the store promises: one row per job id and key, holds opened with
an admission and closed with a release, and the ledger's sums as the meter's
published function gives them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

from kestrel.errors import FailedPrecondition, NotFound
from kestrel.jobs import JobRow
from kestrel.workloads import EventType
from kestrel_sdk.v1 import common_pb2
from services.admission.core import Admission, Outcome, Submission, WorkloadChange, waves
from services.admission.domain import Decision, JobAsk, JobState, Policy, Ruling
from services.admission.store import (
    BookRows,
    Moved,
    NewJob,
    Snapshot,
    SnapshotAsk,
    Stored,
    Transition,
)

PRICE = Decimal("0.001")  # per GPU-second: a 1-GPU, 100 s job reserves 0.1
SPEC = common_pb2.JobSpec(name="train", gpus=1, flavor="gpu-h100",
                          max_duration_s=100).SerializeToString()


@dataclass
class Store:
    credits: dict[str, Decimal] = field(default_factory=dict)
    ledger: list[tuple[str, str, Decimal]] = field(default_factory=list)  # tenant, job, cost
    closed: set[str] = field(default_factory=set)  # allocations the meter closed
    jobs: dict[str, JobRow] = field(default_factory=dict)
    holds: dict[str, Decimal] = field(default_factory=dict)  # open reservations
    released: list[str] = field(default_factory=list)
    interleave: bool = False  # let another decision run at each read and write
    statements: int = 0  # transition_many calls
    snapshot_calls: list[list[str]] = field(default_factory=list)  # tenants, by statement
    insert_calls: list[list[str]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)  # admission_books

    def _bump(self, tenant: str, expected: int | None = None) -> int | None:
        """The book's next version, or None when `expected` is given and not current."""
        if expected is not None and self.versions.get(tenant, 0) != expected:
            return None
        self.versions[tenant] = self.versions.get(tenant, 0) + 1
        return self.versions[tenant]

    async def prices(self) -> dict[str, Decimal]:
        return {"gpu-h100": PRICE}

    async def snapshot(self, tenant: str, after_seq: int, started: Sequence[str],
                       costs: bool) -> Snapshot:
        if self.interleave:
            await asyncio.sleep(0)
        if tenant not in self.credits:
            return Snapshot(None, Decimal(0), Decimal(0), after_seq, frozenset(), {},
                            self.versions.get(tenant, 0))
        rows = [(i + 1, t, j, c) for i, (t, j, c) in enumerate(self.ledger) if t == tenant]
        since = [r for r in rows if r[0] > after_seq]
        consumed = {j: sum((c for _, _, jj, c in rows if jj == j), Decimal(0))
                    for j in started} if costs else {}
        return Snapshot(Policy(tenant, {"gpu-h100": 8}, False), self.credits[tenant],
                        sum((r[3] for r in since), Decimal(0)),
                        max([after_seq, *(r[0] for r in since)]),
                        frozenset(j for j in started if j in self.closed), consumed,
                        self.versions.get(tenant, 0))

    async def snapshots(self, asks: Sequence[SnapshotAsk]) -> list[Snapshot]:
        self.snapshot_calls.append([a.tenant for a in asks])
        return [await self.snapshot(a.tenant, a.after_seq, a.started, a.costs) for a in asks]

    async def release(self, tenant: str, job_ids: Sequence[str], reason: str, now_us: int
                      ) -> int | None:
        if self.interleave:
            await asyncio.sleep(0)
        return self._release(tenant, job_ids)

    def _release(self, tenant: str, job_ids: Sequence[str]) -> int | None:
        done = [j for j in job_ids if self.holds.pop(j, None) is not None]
        self.released += done
        return self._bump(tenant) if done else None

    async def book(self, tenant: str) -> BookRows:
        return BookRows(self.versions.get(tenant, 0),
                        [(j, a, self.jobs[j].state, False) for j, a in self.holds.items()
                         if self.jobs[j].tenant == tenant],
                        [r for r in self.jobs.values()
                         if r.tenant == tenant and r.state is JobState.HELD])

    async def find_by_keys(self, tenant: str, keys: Sequence[str]) -> dict[str, JobRow]:
        return {r.idempotency_key: r for r in self.jobs.values()
                if r.tenant == tenant and r.idempotency_key and r.idempotency_key in keys}

    async def get(self, job_id: str) -> JobRow | None:
        return self.jobs.get(job_id)

    async def get_many(self, job_ids: Sequence[str]) -> dict[str, JobRow]:
        return {j: self.jobs[j] for j in job_ids if j in self.jobs}

    async def insert(self, tenant: str, jobs: Sequence[NewJob], now_us: int
                     ) -> dict[str, JobRow]:
        if self.interleave:
            await asyncio.sleep(0)
        stored = {}
        for j in jobs:
            row = self._insert_one(j.ask, j.spec, j.key, j.decision, now_us)
            if row is not None:
                stored[row.job_id] = row
        return stored

    async def insert_many(self, groups: Sequence[tuple[str, Sequence[NewJob]]],
                          now_us: int, expected: Sequence[int]) -> list[Stored]:
        self.insert_calls.append([t for t, _ in groups])
        out = []
        for (t, jobs), version in zip(groups, expected, strict=True):
            if self.interleave:
                await asyncio.sleep(0)
            bumped = self._bump(t, version)  # checked and bumped at once, as one statement
            out.append(Stored(bumped, {} if bumped is None else
                              await self.insert(t, jobs, now_us)))
        return out

    def _insert_one(self, ask: JobAsk, spec: bytes, key: str, d: Decision,
                    now_us: int) -> JobRow | None:
        if ask.job_id in self.jobs or (key and any(
                r.tenant == ask.tenant and r.idempotency_key == key
                for r in self.jobs.values())):
            return None
        state = {Ruling.ADMITTED: JobState.ADMITTED, Ruling.HELD: JobState.HELD,
                 Ruling.REJECTED: JobState.REJECTED}[d.verdict]
        row = JobRow(ask.job_id, ask.tenant, spec, state, d.reason,
                     d.reserved if state is JobState.ADMITTED else Decimal(0),
                     d.priced_flavor, "", "", key, now_us, 0, 0, 0, len(self.jobs) + 1,
                     ask.priority, ask.gpus, ask.max_duration_s)
        self.jobs[ask.job_id] = row
        if state is JobState.ADMITTED:
            self.holds[ask.job_id] = d.reserved
        return row

    async def admit_held(self, ask: JobAsk, d: Decision, now_us: int, expected: int
                         ) -> tuple[int | None, JobRow | None]:
        if self.interleave:
            await asyncio.sleep(0)
        version = self._bump(ask.tenant, expected)
        if version is None:
            return None, None
        row = self.jobs.get(ask.job_id)
        if row is None or row.state is not JobState.HELD:
            return version, None
        admitted = d.verdict is Ruling.ADMITTED
        row = self.jobs[ask.job_id] = replace(
            row, state=JobState.ADMITTED if admitted else JobState.REJECTED, reason=d.reason,
            reserved=d.reserved if admitted else Decimal(0))
        if admitted:
            self.holds[ask.job_id] = d.reserved
        return version, row

    def _move(self, job_id: str, to: JobState, reason: str, *,
              allowed_from: Sequence[JobState], release: bool = False, started_us: int = 0,
              flavor: tuple[str, str] | None = None) -> tuple[JobState, JobRow] | None:
        row = self.jobs.get(job_id)
        if row is None or row.state not in allowed_from:
            return None
        self.jobs[job_id] = replace(row, state=to, reason=reason,
                                    started_us=row.started_us or started_us,
                                    flavor=flavor[0] if flavor else row.flavor)
        if release:
            self._release(row.tenant, [job_id])
        return row.state, self.jobs[job_id]

    async def transition(self, job_id: str, to: JobState, reason: str, now_us: int, *,
                         allowed_from: Sequence[JobState], release: bool = False,
                         started_us: int = 0, flavor: tuple[str, str] | None = None
                         ) -> tuple[tuple[JobState, JobRow] | None, int | None]:
        moved = self._move(job_id, to, reason, allowed_from=allowed_from, release=release,
                           started_us=started_us, flavor=flavor)
        return moved, self._bump(moved[1].tenant) if moved else None

    async def transition_many(self, moves: Sequence[Transition], now_us: int) -> Moved:
        assert len({m.job_id for m in moves}) == len(moves)
        self.statements += 1
        out = {}
        for m in moves:
            moved = self._move(
                m.job_id, m.to, m.reason, allowed_from=m.allowed_from,
                started_us=m.started_us, flavor=(m.flavor, m.flavor_reason) if m.flavor else None)
            if moved is not None:
                out[m.job_id] = moved
        versions = {t: v for t in sorted({r.tenant for _, r in out.values()})
                    if (v := self._bump(t)) is not None}
        return Moved(out, versions)

    async def set_flavor(self, job_id: str, flavor: str, reason: str) -> None:
        self.jobs[job_id] = replace(self.jobs[job_id], flavor=flavor, flavor_reason=reason)

    async def open_holds(self) -> list[tuple[str, str, Decimal, int, bool]]:
        return [(self.jobs[j].tenant, j, a, int(self.jobs[j].state), False)
                for j, a in self.holds.items()]

    async def held_tenants(self) -> list[str]:
        return sorted({r.tenant for r in self.jobs.values() if r.state is JobState.HELD})

    async def held(self, tenant: str) -> list[JobRow]:
        return [r for r in self.jobs.values() if r.tenant == tenant and r.state is JobState.HELD]


def admission(store: Store) -> tuple[Admission, list[tuple[str, JobState | None, JobState]]]:
    told: list[tuple[str, JobState | None, JobState]] = []

    async def publish(row: JobRow, prev: JobState | None) -> None:
        told.append((row.job_id, prev, row.state))

    a = Admission(store, publish, clock=lambda: 1)  # type: ignore[arg-type]
    a.prices = {"gpu-h100": PRICE}
    return a, told


def ask(job_id: str, tenant: str = "acme", priority: int = 0) -> JobAsk:
    return JobAsk(job_id, tenant, 1, "gpu-h100", 100, priority)


async def test_two_submissions_racing_for_the_last_of_a_budget_never_both_get_it() -> None:
    store = Store(credits={"acme": Decimal("0.15")}, interleave=True)
    a, told = admission(store)
    outs = await asyncio.gather(a.admit(ask("j1"), "n", SPEC, ""),
                                a.admit(ask("j2"), "n", SPEC, ""))
    assert sorted(o.decision.verdict.name for o in outs) == ["ADMITTED", "HELD"]
    assert sum(store.holds.values()) == Decimal("0.1")
    assert sorted(state.name for _, _, state in told) == ["ADMITTED", "HELD"]


async def test_a_replayed_key_returns_the_first_job_and_announces_nothing() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    first = await a.admit(ask("j1"), "n", SPEC, "key-1")
    again = await a.admit(ask("j2"), "n", SPEC, "key-1")
    assert again.duplicate and again.job.job_id == "j1" == first.job.job_id
    assert len(told) == 1 and list(store.jobs) == ["j1"]


async def test_an_unknown_tenant_is_not_found_and_nothing_is_stored() -> None:
    a, told = admission(Store())
    with pytest.raises(NotFound):
        await a.admit(ask("j1", tenant="ghost"), "n", SPEC, "")
    assert told == []


def sub(job_id: str, tenant: str = "acme", key: str = "", priority: int = 0) -> Submission:
    return Submission(ask(job_id, tenant, priority), "n", SPEC, key)


# --- several replicas over one store (issue 49) ------------------------------------


async def test_two_replicas_racing_for_the_last_of_a_budget_never_both_get_it() -> None:
    store = Store(credits={"acme": Decimal("0.1")}, interleave=True)
    (a, _), (b, _) = admission(store), admission(store)
    outs = await asyncio.gather(a.admit(ask("j1"), "n", SPEC, ""),
                                b.admit(ask("j2"), "n", SPEC, ""))
    assert sorted(o.decision.verdict.name for o in outs) == ["ADMITTED", "HELD"]
    assert list(store.holds) == [next(o.job.job_id for o in outs
                                      if o.decision.verdict is Ruling.ADMITTED)]
    assert a.stale_rounds + b.stale_rounds == 1  # the one fenced out decided again


async def test_a_replica_whose_book_is_behind_reloads_it_before_deciding() -> None:
    store = Store(credits={"acme": Decimal("0.15")})
    (a, _), (b, _) = admission(store), admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")  # b has not heard of this hold
    out = await b.admit(ask("j2"), "n", SPEC, "")
    assert out.decision.verdict is Ruling.HELD  # 0.05 left: b counted a's hold
    assert b.books["acme"].holds == {"j1": Decimal("0.1")} and b.stale_rounds == 0


async def test_a_job_one_replica_held_is_released_by_another_that_freed_its_room() -> None:
    store = Store(credits={"acme": Decimal("0.1")})
    (a, _), (b, told_b) = admission(store), admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    assert (await a.admit(ask("j2"), "n", SPEC, "")).decision.verdict is Ruling.HELD
    await b.cancel("acme", "j1", "")  # never ran: its hold is freed, j2 fits
    assert store.jobs["j2"].state is JobState.ADMITTED and list(store.holds) == ["j2"]
    assert ("j2", JobState.HELD, JobState.ADMITTED) in told_b
    out = await a.admit(ask("j3"), "n", SPEC, "")  # a's book is behind: reloaded
    assert out.decision.verdict is Ruling.HELD


async def test_three_replicas_admit_exactly_what_one_would_under_concurrency() -> None:
    budgets = {"acme": Decimal("1.0"), "beta": Decimal("0.5"), "gamma": Decimal("0.05")}
    store = Store(credits=dict(budgets), interleave=True)
    replicas = [admission(store)[0] for _ in range(3)]
    subs = [sub(f"{t}-{i}", t) for i in range(20) for t in budgets]
    outs = await asyncio.gather(*(replicas[i % 3].admit_many([s])
                                  for i, s in enumerate(subs)))
    verdicts: dict[str, list[str]] = {t: [] for t in budgets}
    for (o,) in outs:
        assert isinstance(o, Outcome)
        verdicts[o.job.tenant].append(o.decision.verdict.name)
    # Each job reserves 0.1: a budget of 1.0 admits 10 of 20, 0.5 five, 0.05 none.
    assert {t: v.count("ADMITTED") for t, v in verdicts.items()} == {
        "acme": 10, "beta": 5, "gamma": 0}
    for tenant, credits in budgets.items():
        held = sum((a for j, a in store.holds.items() if store.jobs[j].tenant == tenant),
                   Decimal(0))
        assert held <= credits


async def test_a_batch_is_decided_in_order_each_seeing_the_holds_before_it() -> None:
    store = Store(credits={"acme": Decimal("0.25")})
    a, told = admission(store)
    outs = await a.admit_many([sub("j1"), sub("j2"), sub("j3"), sub("j4", priority=9)])
    assert [o.decision.verdict.name for o in outs if isinstance(o, Outcome)] == [
        "ADMITTED", "ADMITTED", "HELD", "HELD"]
    # Budgets after each decision, as single submits would have reported them.
    assert [o.budget.remaining for o in outs if isinstance(o, Outcome)] == [Decimal(x) for x in [
        "0.15", "0.05", "0.05", "0.05"]]
    assert [(j, s.name) for j, _, s in told] == [
        ("j1", "ADMITTED"), ("j2", "ADMITTED"), ("j3", "HELD"), ("j4", "HELD")]
    assert list(store.jobs) == ["j1", "j2", "j3", "j4"]


async def test_a_batch_takes_one_snapshot_and_one_insert_per_tenant() -> None:
    store = Store(credits={"acme": Decimal(1), "beta": Decimal(1)})
    a, _ = admission(store)
    snaps: list[str] = []
    inserts: list[list[str]] = []
    snapshot, insert = store.snapshot, store.insert

    async def counted_snapshot(tenant: str, *args: Any) -> Snapshot:
        snaps.append(tenant)
        return await snapshot(tenant, *args)

    async def counted_insert(tenant: str, jobs: Sequence[NewJob], now_us: int
                             ) -> dict[str, JobRow]:
        inserts.append([j.ask.job_id for j in jobs])
        return await insert(tenant, jobs, now_us)

    store.snapshot, store.insert = counted_snapshot, counted_insert  # type: ignore[method-assign,assignment]
    await a.admit_many([sub("a1"), sub("b1", "beta"), sub("a2"), sub("b2", "beta"), sub("a3")])
    assert sorted(snaps) == ["acme", "beta"]
    assert sorted(inserts) == [["a1", "a2", "a3"], ["b1", "b2"]]


async def test_one_tenants_failure_in_a_batch_is_its_jobs_alone() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    outs = await a.admit_many([sub("g1", "ghost"), sub("j1"), sub("g2", "ghost")])
    assert [type(o).__name__ for o in outs] == ["NotFound", "Outcome", "NotFound"]
    assert told == [("j1", None, JobState.ADMITTED)] and list(store.jobs) == ["j1"]


async def test_a_store_that_fails_fails_that_tenants_jobs_and_announces_nothing() -> None:
    store = Store(credits={"acme": Decimal(1), "beta": Decimal(1)})
    a, told = admission(store)
    insert = store.insert

    async def failing(tenant: str, jobs: Sequence[NewJob], now_us: int) -> dict[str, JobRow]:
        if tenant == "beta":  # a store error, not a lost primary (that one is retried)
            raise RuntimeError("could not extend file: No space left on device")
        return await insert(tenant, jobs, now_us)

    store.insert = failing  # type: ignore[method-assign]
    outs = await a.admit_many([sub("b1", "beta"), sub("a1")])
    assert isinstance(outs[0], RuntimeError) and isinstance(outs[1], Outcome)
    assert told == [("a1", None, JobState.ADMITTED)]
    assert "b1" not in a.book("beta").holds


async def test_a_key_twice_in_a_batch_stores_one_job_and_announces_it_once() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    await a.admit(ask("j0"), "n", SPEC, "earlier")
    outs = await a.admit_many([sub("j1", key="k"), sub("j2", key="k"),
                               sub("j3", key="earlier")])
    assert [(o.job.job_id, o.duplicate) for o in outs if isinstance(o, Outcome)] == [
        ("j1", False), ("j1", True), ("j0", True)]
    assert [j for j, _, _ in told] == ["j0", "j1"] and sorted(store.jobs) == ["j0", "j1"]
    assert sum(store.holds.values()) == Decimal("0.2")


async def test_a_job_id_twice_in_a_batch_is_the_first_job_or_taken_under_a_new_key() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    outs = await a.admit_many([sub("j1"), sub("j1"), sub("j1", key="k")])
    assert isinstance(outs[0], Outcome) and not outs[0].duplicate
    assert isinstance(outs[1], Outcome) and outs[1].duplicate and outs[1].job.job_id == "j1"
    assert isinstance(outs[2], FailedPrecondition)
    assert len(told) == 1 and sum(store.holds.values()) == Decimal("0.1")


async def test_a_job_id_taken_by_another_tenant_fails_only_that_job() -> None:
    store = Store(credits={"acme": Decimal(1), "beta": Decimal(1)})
    a, _ = admission(store)
    await a.admit(ask("j1", "beta"), "n", SPEC, "")
    outs = await a.admit_many([sub("j1"), sub("j2")])
    assert isinstance(outs[0], FailedPrecondition)
    assert isinstance(outs[1], Outcome) and outs[1].job.job_id == "j2"
    assert set(a.book("acme").holds) == {"j2"}  # the failed one holds nothing


async def test_a_failed_lookup_of_a_collided_job_keeps_the_holds_stored_beside_it() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")

    async def away(job_ids: Sequence[str]) -> dict[str, JobRow]:
        raise ConnectionError("postgres away")

    store.get_many = away  # type: ignore[method-assign]
    outs = await a.admit_many([sub("j1"), sub("j2")])
    assert isinstance(outs[0], ConnectionError) and isinstance(outs[1], Outcome)
    assert set(a.book("acme").holds) == {"j1", "j2"}  # j2 is committed: the book holds it
    assert [j for j, _, _ in told] == ["j1", "j2"]


async def test_a_hold_the_meter_closed_is_spent_and_its_final_cost_counts_instead() -> None:
    store = Store(credits={"acme": Decimal("0.15")})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "admitted by Kueue")
    # The job ran 30 s of its 100: the meter closed it at 0.03.
    store.ledger.append(("acme", "j1", Decimal("0.03")))
    store.closed.add("j1")
    out = await a.admit(ask("j2"), "n", SPEC, "")
    assert out.decision.verdict is Ruling.ADMITTED  # 0.15 - 0.03 leaves room for 0.1
    assert store.released == ["j1"] and set(store.holds) == {"j2"}


async def test_a_started_hold_counts_only_what_it_has_not_consumed() -> None:
    store = Store(credits={"acme": Decimal("0.2")})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "")
    store.ledger.append(("acme", "j1", Decimal("0.04")))  # still running
    out = await a.admit(ask("j2"), "n", SPEC, "")
    # charged 0.04 + the hold's unconsumed 0.06 + 0.1 for j2 = 0.2: it just fits.
    assert out.decision.verdict is Ruling.ADMITTED


async def test_cancelling_a_job_that_never_ran_frees_its_hold_for_the_held_one() -> None:
    store = Store(credits={"acme": Decimal("0.15")})
    a, told = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.admit(ask("j2"), "n", SPEC, "")
    told.clear()
    await a.cancel("acme", "j1", "")
    assert told == [("j1", JobState.ADMITTED, JobState.CANCELLED),
                    ("j2", JobState.HELD, JobState.ADMITTED)]
    assert store.released == ["j1"] and set(store.holds) == {"j2"}


async def test_cancelling_a_running_job_keeps_its_hold_until_the_meter_closes_it() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "")
    await a.cancel("acme", "j1", "")
    assert store.released == [] and "j1" in store.holds


async def test_cancel_refuses_another_tenants_job_and_a_finished_one() -> None:
    store = Store(credits={"acme": Decimal(1), "zeta": Decimal(1)})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    with pytest.raises(NotFound):
        await a.cancel("zeta", "j1", "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "")
    await a.workload_event("acme", "j1", EventType.FINISHED, 9, "done")
    with pytest.raises(FailedPrecondition):
        await a.cancel("acme", "j1", "")


@pytest.mark.parametrize(("events", "state"), [
    pytest.param([EventType.QUEUED], JobState.QUEUED, id="queued by the placer"),
    pytest.param([EventType.ADMITTED], JobState.RUNNING, id="admitted by Kueue runs"),
    pytest.param([EventType.QUEUED, EventType.ADMITTED, EventType.FINISHED],
                 JobState.SUCCEEDED, id="finished succeeds"),
    pytest.param([EventType.ADMITTED, EventType.EVICTED], JobState.EVICTED, id="evicted"),
    pytest.param([EventType.FINISHED, EventType.QUEUED], JobState.SUCCEEDED,
                 id="an event after the end changes nothing"),
])
async def test_a_job_follows_kubernetes(events: list[EventType], state: JobState) -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    for i, e in enumerate(events):
        await a.workload_event("acme", "j1", e, 10 + i, "", flavor="gpu-h100")
    assert store.jobs["j1"].state is state


def change(job_id: str, kind: int, t: int = 10, tenant: str = "acme") -> WorkloadChange:
    return WorkloadChange(tenant, job_id, kind, t, "", "gpu-h100")


async def test_a_batch_of_events_moves_each_job_through_its_states_in_stream_order() -> None:
    store = Store(credits={"acme": Decimal(1), "zeta": Decimal(1)})
    a, told = admission(store)
    for j, tenant in (("j1", "acme"), ("j2", "acme"), ("j3", "zeta")):
        await a.admit(ask(j, tenant), "n", SPEC, "")
    told.clear()
    moved = await a.workload_events([
        change("j1", EventType.QUEUED), change("j2", EventType.QUEUED),
        change("j1", EventType.ADMITTED), change("j3", EventType.QUEUED, tenant="zeta"),
        change("j1", EventType.STARTED), change("j1", EventType.FINISHED),
        change("j2", EventType.ADMITTED), change("j3", 999, tenant="zeta"),
    ])
    assert [r.state if r else None for r in moved] == [
        JobState.QUEUED, JobState.QUEUED, JobState.RUNNING, JobState.QUEUED,
        None, JobState.SUCCEEDED, JobState.RUNNING, None]
    # j1 has four events, so four waves; STARTED moves nothing, so three statements
    assert store.statements == 3
    assert [(j, to) for j, _, to in told if j == "j1"] == [
        ("j1", JobState.QUEUED), ("j1", JobState.RUNNING), ("j1", JobState.SUCCEEDED)]
    assert {j: r.state for j, r in store.jobs.items()} == {
        "j1": JobState.SUCCEEDED, "j2": JobState.RUNNING, "j3": JobState.QUEUED}
    assert a.book("acme").started == {"j1", "j2"}


async def test_a_batch_delivered_again_moves_nothing_twice() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    batch = [change("j1", EventType.QUEUED), change("j1", EventType.ADMITTED)]
    await a.workload_events(batch)
    told.clear()
    assert await a.workload_events(batch) == [None, None]
    assert told == [] and store.jobs["j1"].state is JobState.RUNNING


@pytest.mark.parametrize(("job_ids", "expected"), [
    pytest.param([], [], id="no changes, no waves"),
    pytest.param(["a", "b", "c"], [[0, 1, 2]], id="distinct jobs share one wave"),
    pytest.param(["a", "a", "a"], [[0], [1], [2]], id="one job's changes each in a wave"),
    pytest.param(["a", "b", "a", "c", "b", "a"], [[0, 1, 3], [2, 4], [5]],
                 id="a job's n-th change is in wave n, in batch order"),
])
def test_waves(job_ids: list[str], expected: list[list[int]]) -> None:
    assert waves([change(j, EventType.QUEUED) for j in job_ids]) == expected


async def test_an_event_type_from_a_newer_placer_is_ignored() -> None:
    store = Store(credits={"acme": Decimal(1)})
    a, told = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    assert await a.workload_event("acme", "j1", 999, 10, "") is None
    assert store.jobs["j1"].state is JobState.ADMITTED and len(told) == 1


async def test_a_restarted_admission_rebuilds_its_books_from_the_store() -> None:
    store = Store(credits={"acme": Decimal("0.15")})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.admit(ask("j2"), "n", SPEC, "")
    b, _ = admission(store)
    await b.load()
    assert b.books["acme"].holds == {"j1": Decimal("0.1")}
    assert list(b.books["acme"].held) == ["j2"]
    out = await b.admit(ask("j3"), "n", SPEC, "")
    assert out.decision.verdict is Ruling.HELD  # behind j2, and no room either


async def test_the_tenants_of_one_batch_share_one_snapshot_and_one_insert_statement() -> None:
    store = Store(credits={"acme": Decimal(1), "beta": Decimal(1), "gamma": Decimal(1)})
    a, told = admission(store)
    outs = await a.admit_many([sub("a1"), sub("b1", "beta"), sub("c1", "gamma"),
                               sub("a2")])
    assert all(isinstance(o, Outcome) for o in outs)
    assert store.snapshot_calls == [["acme", "beta", "gamma"]]
    assert store.insert_calls == [["acme", "beta", "gamma"]]
    assert sorted(store.holds) == ["a1", "a2", "b1", "c1"]
    assert sorted(j for j, _, _ in told) == ["a1", "a2", "b1", "c1"]
