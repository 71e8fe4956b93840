"""The meter's decisions, as pure functions over frozen data.

An *allocation* is `gpus` GPUs of one flavor held by one workload from Kueue
admission (start) to finish or eviction (end). It is metered into ledger rows:
ticks cut the open part into rows as time passes; the close writes the last
piece. If a tick had already cut beyond the real end (the finish event arrived
late), the close writes a *reversal* row, negative, over exactly the excess.
The rows of one allocation therefore always sum to gpus x (end - start).

Events may arrive twice or out of order: a repeated event id is dropped by the
store before it gets here; a close before the start is remembered (PENDING)
and settled when the start arrives; a second close of a different id is
ignored (the first close wins).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from kestrel.workloads import AllocStatus, EventType
from kestrel_sdk.budget import Budget, budget
from kestrel_sdk.money import ZERO, row_cost

__all__ = ["AllocStatus", "EventType"]


class RowKind(enum.StrEnum):
    USAGE = "usage"
    REVERSAL = "reversal"


@dataclass(frozen=True)
class Event:
    event_id: str
    tenant: str
    workload_id: str
    kind: int
    type: EventType
    time_us: int
    flavor: str
    gpus: int
    max_duration_s: int = 0  # the bound the workload runs under; 0: none


@dataclass(frozen=True)
class Allocation:
    workload_id: str
    tenant: str
    kind: int
    flavor: str
    gpus: int
    price: Decimal
    status: AllocStatus
    start_us: int | None
    metered_until_us: int | None
    end_us: int | None
    # start + the workload's bound: nothing is metered beyond it, so a job cannot
    # cost more than its reservation even when Kubernetes stops it late.
    limit_us: int | None = None

    def clamp(self, t: int) -> int:
        return t if self.limit_us is None else min(t, self.limit_us)


def _limit(start_us: int, max_duration_s: int) -> int | None:
    return start_us + max_duration_s * 1_000_000 if max_duration_s > 0 else None


@dataclass(frozen=True)
class Row:
    tenant: str
    workload_id: str
    flavor: str
    gpus: int
    start_us: int
    end_us: int
    price: Decimal
    cause_id: str
    kind: RowKind

    @property
    def gpu_us(self) -> int:
        span = self.gpus * (self.end_us - self.start_us)
        return -span if self.kind is RowKind.REVERSAL else span

    @property
    def cost(self) -> Decimal:
        return row_cost(self.gpu_us, self.price)


@dataclass(frozen=True)
class Outcome:
    """What applying events or a tick decided: new allocation states and rows."""

    allocations: dict[str, Allocation]
    rows: list[Row]
    opened: frozenset[str]
    closed: frozenset[str]


def _close_rows(a: Allocation, end_us: int, cause_id: str) -> list[Row]:
    """Rows that settle an open allocation whose rows reach metered_until at end_us."""
    assert a.metered_until_us is not None
    done = a.metered_until_us
    if end_us > done:
        return [Row(a.tenant, a.workload_id, a.flavor, a.gpus, done, end_us, a.price,
                    cause_id, RowKind.USAGE)]
    if end_us < done:
        return [Row(a.tenant, a.workload_id, a.flavor, a.gpus, end_us, done, a.price,
                    cause_id, RowKind.REVERSAL)]
    return []


def apply_events(current: Mapping[str, Allocation], events: Iterable[Event],
                 prices: Mapping[str, Decimal]) -> Outcome:
    """Apply new (already de-duplicated) events in arrival order.

    `current` holds the stored state of the workloads the events name (absent
    means never seen). Prices are looked up once, when an allocation is first
    seen, and then fixed for its life (the reservation was priced the same way).
    """
    state: dict[str, Allocation] = {}
    rows: list[Row] = []
    opened: set[str] = set()
    closed: set[str] = set()

    def price_of(flavor: str) -> Decimal:
        return prices.get(flavor, ZERO)

    for ev in events:
        a = state.get(ev.workload_id) or current.get(ev.workload_id)
        if ev.type is EventType.ADMITTED:
            if a is None:
                state[ev.workload_id] = Allocation(
                    ev.workload_id, ev.tenant, ev.kind, ev.flavor, ev.gpus, price_of(ev.flavor),
                    AllocStatus.OPEN, ev.time_us, ev.time_us, None,
                    _limit(ev.time_us, ev.max_duration_s))
                opened.add(ev.workload_id)
            elif a.status is AllocStatus.PENDING:
                assert a.end_us is not None
                settled = replace(a, start_us=ev.time_us, metered_until_us=ev.time_us,
                                  flavor=ev.flavor or a.flavor, gpus=ev.gpus or a.gpus,
                                  price=price_of(ev.flavor or a.flavor),
                                  limit_us=_limit(ev.time_us, ev.max_duration_s))
                end = settled.clamp(max(a.end_us, ev.time_us))
                rows += _close_rows(settled, end, ev.event_id)
                state[ev.workload_id] = replace(settled, status=AllocStatus.CLOSED,
                                                metered_until_us=end, end_us=end)
                closed.add(ev.workload_id)
            # OPEN or CLOSED already: a second admission under another id changes nothing.
        elif ev.type.closes:
            if a is None:
                state[ev.workload_id] = Allocation(
                    ev.workload_id, ev.tenant, ev.kind, ev.flavor, ev.gpus, price_of(ev.flavor),
                    AllocStatus.PENDING, None, None, ev.time_us)
            elif a.status is AllocStatus.OPEN:
                assert a.start_us is not None
                end = a.clamp(max(ev.time_us, a.start_us))
                rows += _close_rows(a, end, ev.event_id)
                state[ev.workload_id] = replace(a, status=AllocStatus.CLOSED,
                                                metered_until_us=end, end_us=end)
                closed.add(ev.workload_id)
            # PENDING or CLOSED: the first close wins.
        # STARTED and QUEUED are informational: metering runs from Kueue admission.
    return Outcome(state, rows, frozenset(opened - closed), frozenset(closed))


def tick(open_allocations: Iterable[Allocation], cut_to_us: int, tick_id: str) -> Outcome:
    """Cut every open allocation's unmetered time up to cut_to_us into one row each."""
    state: dict[str, Allocation] = {}
    rows: list[Row] = []
    for a in open_allocations:
        if a.status is not AllocStatus.OPEN or a.metered_until_us is None:
            continue
        cut = a.clamp(cut_to_us)
        if cut <= a.metered_until_us:
            continue
        rows.append(Row(a.tenant, a.workload_id, a.flavor, a.gpus, a.metered_until_us,
                        cut, a.price, f"{tick_id}/{a.workload_id}", RowKind.USAGE))
        state[a.workload_id] = replace(a, metered_until_us=cut)
    return Outcome(state, rows, frozenset(), frozenset())


# --- runway -----------------------------------------------------------------


@dataclass(frozen=True)
class RunwayFigures:
    tenant: str
    credits: Decimal
    charged: Decimal
    reserved: Decimal
    burn_per_s: Decimal
    running_gpus: int
    as_of_us: int
    ledger_seq: int
    meter_version: int = 0  # the meter_head version included (store.Mark)

    @property
    def budget(self) -> Budget:
        """Every derived figure, from the one budget computation (kestrel_sdk.budget)."""
        return budget(self.credits, self.charged, self.reserved, self.burn_per_s)

    @property
    def remaining(self) -> Decimal:
        return self.budget.remaining

    @property
    def unlimited(self) -> bool:
        return self.budget.unlimited

    @property
    def runway_s(self) -> float:
        return self.budget.runway_s

    @property
    def money_runway_s(self) -> float:
        return self.budget.money_runway_s

    @property
    def free_to_reserve(self) -> Decimal:
        return self.budget.free_to_reserve

    @property
    def remaining_bp(self) -> int:
        """remaining / credits in basis points, clamped to [0, 10000]."""
        return self.budget.remaining_bp


def burn_per_s(open_allocations: Iterable[Allocation]) -> tuple[Decimal, int]:
    """What the open allocations cost per second (one past its bound costs nothing)."""
    burn = ZERO
    gpus = 0
    for a in open_allocations:
        if a.status is AllocStatus.OPEN and (a.limit_us is None
                                             or a.metered_until_us != a.limit_us):
            burn += a.price * a.gpus
            gpus += a.gpus
    return burn, gpus


class Band(enum.IntEnum):
    """Budget bands; crossing into a worse band always publishes."""

    ABOVE_50 = 0
    BELOW_50 = 1
    BELOW_10 = 2
    EXHAUSTED = 3


def band(f: RunwayFigures) -> Band:
    if f.remaining <= 0:
        return Band.EXHAUSTED
    bp = f.remaining_bp
    if bp < 1_000:
        return Band.BELOW_10
    if bp < 5_000:
        return Band.BELOW_50
    return Band.ABOVE_50


class Reason(enum.IntEnum):
    # Values match kestrel.v1.RunwayChangeReason.
    TOP_UP = 1
    ALLOCATION_OPENED = 2
    ALLOCATION_CLOSED = 3
    TICK = 4
    THRESHOLD_50 = 5
    THRESHOLD_10 = 6
    EXHAUSTED = 7
    RESERVATION = 8
    STARTUP = 9
    ADJUSTMENT = 10


_BAND_REASON = {Band.BELOW_50: Reason.THRESHOLD_50, Band.BELOW_10: Reason.THRESHOLD_10,
                Band.EXHAUSTED: Reason.EXHAUSTED}


@dataclass(frozen=True)
class OpenHold:
    """One open budget hold of admission's (its `open_holds`) whose allocation has not
    closed, as the meter reads it. A hold whose allocation closed holds nothing: its
    final cost is in `charged`, committed in the same transaction as the close."""

    tenant: str
    workload_id: str
    amount: Decimal
    rolling: bool = False  # an endpoint replica's: holds its whole amount while it runs


class HoldBook:
    """Every tenant's open holds, kept in memory so that a runway figure costs no query.

    What it holds comes from Postgres: a tenant's whole set (at start-up, on an explicit
    re-read and at each resync), or the holds of a few workloads (when admission says
    their jobs moved); and the meter's own commits say which allocations closed. Before
    this, each figure re-read and summed every open hold of its tenant: 0.7 ms of
    Postgres a job in bench-jobs, and a cost that grew with the queue.

    `reserved` is what that query said: a rolling hold holds its whole amount, any other
    its amount less what its allocation has consumed, never less than nothing. Per
    tenant the sum of all amounts is kept as holds come and go, so a figure costs
    O(the tenant's open allocations), not O(its holds)."""

    def __init__(self) -> None:
        self._by_workload: dict[str, tuple[OpenHold, ...]] = {}
        self._workloads_of: dict[str, set[str]] = {}  # tenant -> workload ids
        self._total: dict[str, Decimal] = {}  # tenant -> sum of its holds' amounts
        self._count: dict[str, int] = {}  # tenant -> how many holds it has

    def _add(self, holds: Sequence[OpenHold]) -> None:
        wid = holds[0].workload_id
        self._by_workload[wid] = self._by_workload.get(wid, ()) + tuple(holds)
        for h in holds:
            self._workloads_of.setdefault(h.tenant, set()).add(wid)
            self._total[h.tenant] = self._total.get(h.tenant, ZERO) + h.amount
            self._count[h.tenant] = self._count.get(h.tenant, 0) + 1

    def _drop(self, wid: str, keep: Callable[[OpenHold], bool] = lambda h: False) -> set[str]:
        """Drop the holds of `wid` (those `keep` does not keep); the tenants touched."""
        holds = self._by_workload.pop(wid, ())
        kept = tuple(h for h in holds if keep(h))
        if kept:
            self._by_workload[wid] = kept
        touched = set()
        for h in holds:
            if h in kept:
                continue
            touched.add(h.tenant)
            self._total[h.tenant] -= h.amount
            self._count[h.tenant] -= 1
        for t in touched:
            if not any(h.tenant == t for h in kept):
                self._workloads_of[t].discard(wid)
        return touched

    @staticmethod
    def _grouped(holds: Iterable[OpenHold]) -> dict[str, list[OpenHold]]:
        out: dict[str, list[OpenHold]] = {}
        for h in holds:
            out.setdefault(h.workload_id, []).append(h)
        return out

    def replace_tenants(self, tenants: Iterable[str], holds: Iterable[OpenHold]) -> None:
        """`holds` is all the open holds of `tenants` now."""
        tenants = set(tenants)
        for t in tenants:
            for wid in list(self._workloads_of.get(t, ())):
                self._drop(wid, keep=lambda h: h.tenant not in tenants)
            self._total[t] = ZERO
            self._count[t] = 0
        for group in self._grouped(h for h in holds if h.tenant in tenants).values():
            self._add(group)

    def replace_workloads(self, workload_ids: Iterable[str], holds: Iterable[OpenHold]
                          ) -> set[str]:
        """`holds` is all the open holds of `workload_ids` now; the tenants touched."""
        wanted = set(workload_ids)
        touched: set[str] = set()
        for wid in wanted:
            touched |= self._drop(wid)
        for group in self._grouped(h for h in holds if h.workload_id in wanted).values():
            self._add(group)
            touched |= {h.tenant for h in group}
        return touched

    def closed(self, workload_id: str) -> set[str]:
        """Its allocation closed: its holds hold nothing from now on. The tenants touched."""
        return self._drop(workload_id)

    def tenants(self) -> set[str]:
        return {t for t, wids in self._workloads_of.items() if wids}

    def summary(self, tenant: str) -> tuple[int, Decimal]:
        """How many holds `tenant` has and the sum of their amounts: what the meter's
        resync compares with the same two figures in Postgres (MeterStore.hold_sums)."""
        return self._count.get(tenant, 0), self._total.get(tenant, ZERO)

    def reserved(self, tenant: str, consumed: Mapping[str, Decimal]) -> Decimal:
        """The unconsumed part of `tenant`'s holds; `consumed`: the ledger cost so far of
        each of its open allocations."""
        total = self._total.get(tenant, ZERO)
        for wid, cost in consumed.items():
            for h in self._by_workload.get(wid, ()):
                if h.tenant == tenant and not h.rolling:
                    total -= min(h.amount, cost)
        return total


def publish_reason(previous: RunwayFigures | None, new: RunwayFigures,
                   hint: Reason | None, material_bp: int = 100) -> Reason | None:
    """Whether a new figure is worth publishing, and why.

    Always: the first figure, a threshold crossed downwards (50%, 10%, 0),
    a top-up, an allocation opened/closed, a reservation change. Otherwise
    (ticks) only when remaining moved by at least `material_bp` of credits.
    """
    if previous is None:
        return hint or Reason.STARTUP
    old_band, new_band = band(previous), band(new)
    if new_band > old_band:
        return _BAND_REASON[new_band]
    if hint is not None and hint is not Reason.TICK:
        return hint
    if new.credits > 0:
        moved = abs(new.remaining - previous.remaining) * 10_000 / new.credits
        if moved >= material_bp:
            return Reason.TICK
    elif new.remaining != previous.remaining:
        return Reason.TICK
    return None


def sum_gpu_us(rows: Sequence[Row]) -> int:
    return sum(r.gpu_us for r in rows)
