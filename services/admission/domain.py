"""Admission's decisions as pure functions over frozen data.

The guarantee is Slurm's "safe" accounting enforcement: a job is admitted only
if it can run to its declared end within the budget, so it can never overrun.
It reserves gpus x max_duration_s x price of the most expensive flavor it may
land on (the flavor it names, otherwise the dearest flavor the tenant has
quota for), and the Kubernetes Job gets activeDeadlineSeconds = max_duration_s.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from kestrel.jobs import TERMINAL, JobState
from kestrel.workloads import CPU_FLAVOR, CPU_POOL_CORES, unit_of
from kestrel_sdk import budget
from kestrel_sdk.money import ZERO, fmt

__all__ = ["TERMINAL", "JobState"]


class Ruling(enum.IntEnum):
    # Values match kestrel.v1.Decision.
    ADMITTED = 1
    HELD = 2
    REJECTED = 3


@dataclass(frozen=True)
class JobAsk:
    job_id: str
    tenant: str
    gpus: int
    flavor: str  # preference; empty lets the placer choose
    max_duration_s: int
    priority: int
    seq: int = 0  # FIFO order among equals
    # An endpoint replica: open-ended, its hold rolls (see Reservation.rolling).
    rolling: bool = False


@dataclass(frozen=True)
class Policy:
    tenant: str
    quota: Mapping[str, int]  # GPUs per flavor
    suspended: bool


@dataclass(frozen=True)
class Reservation:
    """An open reservation and what the ledger says it has consumed so far. A hold
    whose allocation the meter closed is released, not kept as a closed Reservation
    (Admission._snapshot)."""

    job_id: str
    amount: Decimal
    consumed: Decimal = ZERO
    # An endpoint replica's hold: it keeps the whole amount (its horizon) for as long
    # as the replica runs, whatever the ledger has consumed; open-ended work never
    # "uses up" its reservation.
    rolling: bool = False

    @property
    def held(self) -> Decimal:
        """kestrel_sdk.budget's one formula for what a hold still holds."""
        return budget.Hold(self.amount, self.consumed, rolling=self.rolling).held


@dataclass(frozen=True)
class Budget:
    """credits - charged - reserved, where reserved is the untouched holds (`pending`,
    summed, as many as the queue holds) plus what started holds have left."""

    credits: Decimal
    charged: Decimal
    pending: Decimal = ZERO
    started: tuple[Reservation, ...] = ()

    @property
    def reserved(self) -> Decimal:
        return self.pending + sum((h.held for h in self.started), ZERO)

    @property
    def remaining(self) -> Decimal:
        return budget.remaining(self.credits, self.charged, self.reserved)

    def plus(self, amount: Decimal) -> Budget:
        return Budget(self.credits, self.charged, self.pending + amount, self.started)


@dataclass(frozen=True)
class Decision:
    verdict: Ruling
    reason: str
    reserved: Decimal = ZERO
    priced_flavor: str = ""


def price_job(job: JobAsk, policy: Policy, prices: Mapping[str, Decimal],
              max_node_gpus: int) -> tuple[str, Decimal] | str:
    """(flavor priced, reservation) or, when the job can never run, why not."""
    if job.gpus > max_node_gpus:
        return f"asks for {job.gpus} GPUs but the largest node has {max_node_gpus}"
    if job.flavor == CPU_FLAVOR:  # the CPU pool: cores, the same for every tenant
        if job.flavor not in prices:
            return f"flavor {job.flavor} has no price"
        if job.gpus > CPU_POOL_CORES:
            return (f"asks for {job.gpus} cores of the CPU pool but the quota is "
                    f"{CPU_POOL_CORES}")
        return job.flavor, prices[job.flavor] * job.gpus * job.max_duration_s
    if job.flavor:
        if job.flavor not in prices:
            return f"flavor {job.flavor} has no price"
        quota = policy.quota.get(job.flavor, 0)
        if job.gpus > quota:
            return f"asks for {job.gpus} GPUs of {job.flavor} but the quota is {quota}"
        candidates = [job.flavor]
    else:
        candidates = [f for f, q in policy.quota.items() if q >= job.gpus and f in prices]
        if not candidates:
            return f"no flavor has a quota of {job.gpus} GPUs for this tenant"
    flavor = max(candidates, key=lambda f: (prices[f], f))
    return flavor, prices[flavor] * job.gpus * job.max_duration_s


# The words of a HELD reason that say the job waits behind another held job rather than
# for budget (admission's metrics count the two kinds apart: services.admission.metrics).
QUEUED_BEHIND = "waiting behind held jobs"


def decide(job: JobAsk, policy: Policy, budget: Budget, prices: Mapping[str, Decimal],
           max_node_gpus: int, queue_ahead: bool) -> Decision:
    """ADMITTED, HELD or REJECTED, with a reason a person can read.

    `queue_ahead`: a held job of this tenant with priority >= this job's waits
    already; a newcomer never jumps it.
    """
    if policy.suspended:
        return Decision(Ruling.REJECTED, "the tenant is suspended")
    priced = price_job(job, policy, prices, max_node_gpus)
    if isinstance(priced, str):
        return Decision(Ruling.REJECTED, priced)
    flavor, cost = priced
    need = (f"needs {fmt(cost)} credits ({job.gpus} {unit_of(flavor)} x "
            f"{job.max_duration_s} s x {fmt(prices[flavor])} on {flavor})")
    if cost > budget.credits:
        return Decision(Ruling.REJECTED, f"{need}, more than the whole budget of "
                                          f"{fmt(budget.credits)}", cost, flavor)
    if queue_ahead:
        return Decision(Ruling.HELD, f"{need}; {QUEUED_BEHIND} of equal or "
                                      "higher priority", cost, flavor)
    remaining = budget.remaining
    if cost > remaining:
        return Decision(Ruling.HELD, f"{need}, {fmt(max(remaining, ZERO))} remain; held "
                                      "until a top-up or a reservation frees", cost, flavor)
    return Decision(Ruling.ADMITTED, f"{need}; reserved, {fmt(remaining - cost)} remain",
                    cost, flavor)


def release_order(held: Iterable[JobAsk]) -> list[JobAsk]:
    """Held jobs in the order they are released: priority, then first come."""
    return sorted(held, key=lambda j: (-j.priority, j.seq))


def releasable(held: Sequence[JobAsk], policy: Policy, budget: Budget,
               prices: Mapping[str, Decimal], max_node_gpus: int
               ) -> list[tuple[JobAsk, Decision]]:
    """Decisions for held jobs, in release order, until the first that must keep waiting.

    Strict order: a big job at the head is not overtaken by smaller ones behind it.
    """
    out: list[tuple[JobAsk, Decision]] = []
    for job in release_order(held):
        d = decide(job, policy, budget, prices, max_node_gpus, queue_ahead=False)
        if d.verdict is Ruling.HELD:
            break
        out.append((job, d))
        if d.verdict is Ruling.ADMITTED:
            budget = budget.plus(d.reserved)
    return out
