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

import pytest

from kestrel.errors import FailedPrecondition, NotFound
from kestrel.jobs import JobRow
from kestrel.v1 import common_pb2
from kestrel.workloads import EventType
from services.admission.core import Admission
from services.admission.domain import Decision, JobAsk, JobState, Policy, Verdict
from services.admission.store import Snapshot

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

    async def prices(self) -> dict[str, Decimal]:
        return {"gpu-h100": PRICE}

    async def snapshot(self, tenant: str, after_seq: int, started: Sequence[str],
                       costs: bool) -> Snapshot:
        if self.interleave:
            await asyncio.sleep(0)
        if tenant not in self.credits:
            return Snapshot(None, Decimal(0), Decimal(0), after_seq, frozenset(), {})
        rows = [(i + 1, t, j, c) for i, (t, j, c) in enumerate(self.ledger) if t == tenant]
        since = [r for r in rows if r[0] > after_seq]
        consumed = {j: sum((c for _, _, jj, c in rows if jj == j), Decimal(0))
                    for j in started} if costs else {}
        return Snapshot(Policy(tenant, {"gpu-h100": 8}, False), self.credits[tenant],
                        sum((r[3] for r in since), Decimal(0)),
                        max([after_seq, *(r[0] for r in since)]),
                        frozenset(j for j in started if j in self.closed), consumed)

    async def release(self, job_ids: Sequence[str], reason: str, now_us: int) -> None:
        for j in job_ids:
            if self.holds.pop(j, None) is not None:
                self.released.append(j)

    async def find_by_key(self, tenant: str, key: str) -> JobRow | None:
        return next((r for r in self.jobs.values()
                     if r.tenant == tenant and r.idempotency_key == key), None)

    async def get(self, job_id: str) -> JobRow | None:
        return self.jobs.get(job_id)

    async def insert(self, ask: JobAsk, name: str, spec: bytes, key: str, d: Decision,
                     now_us: int) -> JobRow | None:
        if self.interleave:
            await asyncio.sleep(0)
        if ask.job_id in self.jobs or (key and await self.find_by_key(ask.tenant, key)):
            return None
        state = {Verdict.ADMITTED: JobState.ADMITTED, Verdict.HELD: JobState.HELD,
                 Verdict.REJECTED: JobState.REJECTED}[d.verdict]
        row = JobRow(ask.job_id, ask.tenant, spec, state, d.reason,
                     d.reserved if state is JobState.ADMITTED else Decimal(0),
                     d.priced_flavor, "", "", key, now_us, 0, 0, 0, len(self.jobs) + 1,
                     ask.priority, ask.gpus, ask.max_duration_s)
        self.jobs[ask.job_id] = row
        if state is JobState.ADMITTED:
            self.holds[ask.job_id] = d.reserved
        return row

    async def admit_held(self, ask: JobAsk, d: Decision, now_us: int) -> JobRow | None:
        row = self.jobs.get(ask.job_id)
        if row is None or row.state is not JobState.HELD:
            return None
        admitted = d.verdict is Verdict.ADMITTED
        row = self.jobs[ask.job_id] = replace(
            row, state=JobState.ADMITTED if admitted else JobState.REJECTED, reason=d.reason,
            reserved=d.reserved if admitted else Decimal(0))
        if admitted:
            self.holds[ask.job_id] = d.reserved
        return row

    async def transition(self, job_id: str, to: JobState, reason: str, now_us: int, *,
                         allowed_from: Sequence[JobState], release: bool = False,
                         started_us: int = 0, flavor: tuple[str, str] | None = None
                         ) -> tuple[JobState, JobRow] | None:
        row = self.jobs.get(job_id)
        if row is None or row.state not in allowed_from:
            return None
        self.jobs[job_id] = replace(row, state=to, reason=reason,
                                    started_us=row.started_us or started_us,
                                    flavor=flavor[0] if flavor else row.flavor)
        if release:
            await self.release([job_id], reason, now_us)
        return row.state, self.jobs[job_id]

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


async def test_a_hold_the_meter_closed_is_spent_and_its_final_cost_counts_instead() -> None:
    store = Store(credits={"acme": Decimal("0.15")})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "admitted by Kueue")
    # The job ran 30 s of its 100: the meter closed it at 0.03.
    store.ledger.append(("acme", "j1", Decimal("0.03")))
    store.closed.add("j1")
    out = await a.admit(ask("j2"), "n", SPEC, "")
    assert out.decision.verdict is Verdict.ADMITTED  # 0.15 - 0.03 leaves room for 0.1
    assert store.released == ["j1"] and set(store.holds) == {"j2"}


async def test_a_started_hold_counts_only_what_it_has_not_consumed() -> None:
    store = Store(credits={"acme": Decimal("0.2")})
    a, _ = admission(store)
    await a.admit(ask("j1"), "n", SPEC, "")
    await a.workload_event("acme", "j1", EventType.ADMITTED, 5, "")
    store.ledger.append(("acme", "j1", Decimal("0.04")))  # still running
    out = await a.admit(ask("j2"), "n", SPEC, "")
    # charged 0.04 + the hold's unconsumed 0.06 + 0.1 for j2 = 0.2: it just fits.
    assert out.decision.verdict is Verdict.ADMITTED


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
    assert out.decision.verdict is Verdict.HELD  # behind j2, and no room either
