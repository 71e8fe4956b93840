"""In-memory figures of every tenant, derived only from committed ledger rows.

Loaded from table sums at start-up, then advanced by exactly the rows and
top-ups the meter has just committed, so a published runway always equals
what the SQL sums of the same rows say (a test checks this equality).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from kestrel_sdk.money import ZERO
from services.meter.domain import Allocation, AllocStatus, RunwayFigures, burn_per_s
from services.meter.store import CommittedRow, Totals


@dataclass
class FlavorTotal:
    gpu_us: int = 0
    cost: Decimal = ZERO
    rows: int = 0


@dataclass
class Account:
    tenant: str
    credits: Decimal = ZERO
    top_ups: int = 0
    reserved: Decimal = ZERO
    flavors: dict[str, FlavorTotal] = field(default_factory=dict)
    open: dict[str, Allocation] = field(default_factory=dict)
    # Ledger cost so far of each open allocation: what its budget hold has consumed.
    consumed: dict[str, Decimal] = field(default_factory=dict)
    published: RunwayFigures | None = None

    @property
    def charged(self) -> Decimal:
        return sum((f.cost for f in self.flavors.values()), ZERO)


class Projection:
    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}
        self.ledger_seq = 0
        self.version = 0  # the meter_head version the figures include (Meter sets it)

    @classmethod
    def load(cls, totals: Totals, open_allocations: Iterable[Allocation],
             open_costs: Mapping[str, Decimal] | None = None) -> Projection:
        p = cls()
        for t in totals.tenants:
            p.account(t)
        for t, amount in totals.credits.items():
            p.account(t).credits = amount
            p.account(t).top_ups = totals.top_ups.get(t, 0)
        for (t, flavor), (gpu_us, cost, rows) in totals.usage.items():
            p.account(t).flavors[flavor] = FlavorTotal(gpu_us, cost, rows)
        for a in open_allocations:
            acc = p.account(a.tenant)
            acc.open[a.workload_id] = a
            acc.consumed[a.workload_id] = (open_costs or {}).get(a.workload_id, ZERO)
        p.ledger_seq = totals.ledger_seq
        return p

    def account(self, tenant: str) -> Account:
        acc = self.accounts.get(tenant)
        if acc is None:
            acc = self.accounts[tenant] = Account(tenant)
        return acc

    def add_rows(self, rows: Iterable[CommittedRow]) -> None:
        """Committed rows; give it the batch's allocations first (set_allocations), so
        a row of a still open allocation counts towards what its hold consumed."""
        for c in rows:
            r = c.row
            acc = self.account(r.tenant)
            if r.workload_id in acc.open:
                acc.consumed[r.workload_id] = acc.consumed.get(r.workload_id, ZERO) + r.cost
            f = acc.flavors.setdefault(r.flavor, FlavorTotal())
            f.gpu_us += r.gpu_us
            f.cost += r.cost
            f.rows += 1
            self.ledger_seq = max(self.ledger_seq, c.row_id)

    def set_allocations(self, allocations: Iterable[Allocation]) -> None:
        for a in allocations:
            acc = self.account(a.tenant)
            if a.status is AllocStatus.OPEN:
                acc.open[a.workload_id] = a
                acc.consumed.setdefault(a.workload_id, ZERO)
            else:
                acc.open.pop(a.workload_id, None)
                acc.consumed.pop(a.workload_id, None)

    def add_credits(self, tenant: str, amount: Decimal) -> None:
        acc = self.account(tenant)
        acc.credits += amount
        acc.top_ups += 1

    def consumed(self, tenant: str) -> Mapping[str, Decimal]:
        return self.account(tenant).consumed

    def open_allocations(self) -> list[Allocation]:
        return [a for acc in self.accounts.values() for a in acc.open.values()]

    def figures(self, tenant: str, now_us: int) -> RunwayFigures:
        acc = self.account(tenant)
        burn, gpus = burn_per_s(acc.open.values())
        return RunwayFigures(tenant, acc.credits, acc.charged, acc.reserved, burn, gpus,
                             now_us, self.ledger_seq, self.version)
