"""The Kueue AdmissionCheck `kestrel.dev/runway`, decided as pure functions.

Kueue reserves quota for a Workload, then asks its admission checks. This one
answers from admission's own books:

- Ready    — the job holds a reservation (admitted by Kestrel) and its tenant's
             money is not spent: it may start.
- Pending  — the job is HELD for budget, or its tenant's money is spent: it
             waits, with the reason in `kubectl describe workload`.
- Rejected — the job was cancelled or rejected: Kueue deactivates it.

Workloads of jobs this admission does not know are left alone.

Most Workloads need no decision most of the time: a finished or deactivated one,
or one already Ready whose tenant still has money, cannot change verdict, so it
is `settled` and neither its job row nor a patch is fetched for it. What is left
is small: new Workloads, held ones, and the running ones of a spent tenant.

Running work of a tenant whose money is spent (credits - charged <= 0, possible
for open-ended work or when an operator lowers the budget) is deactivated
(Workload spec.active=false) and metered to that instant.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from kestrel.checkfeed import WorkloadView
from kestrel.jobs import JobRow, JobState
from kestrel_sdk import budget
from kestrel_sdk.money import fmt
from kestrel_sdk.v1 import common_pb2


class CheckState(enum.StrEnum):
    READY = "Ready"
    PENDING = "Pending"
    RETRY = "Retry"
    REJECTED = "Rejected"


@dataclass(frozen=True)
class Funds:
    """A tenant's figures as admission sees them (from one ledger snapshot)."""

    credits: Decimal
    charged: Decimal

    @property
    def spent(self) -> bool:
        return budget.spent(self.credits, self.charged)


def money_of(runway: common_pb2.Runway) -> Funds:
    """A tenant's money as the meter published it."""
    return Funds(Decimal(runway.credits or "0"), Decimal(runway.charged or "0"))


def decides_alike(old: Funds, new: Funds) -> bool:
    """Whether every verdict, settlement and deactivation made with `old` stays the same
    with `new`: they read money only through `spent`, and a spent tenant's message its
    credits. Most runways change neither (they move charged and reserved), so a tenant's
    Workloads need no new pass for them."""
    return old.spent == new.spent and (not new.spent or old.credits == new.credits)


@dataclass(frozen=True)
class CheckAnswer:
    state: CheckState
    message: str


LIVE = frozenset({JobState.ADMITTED, JobState.QUEUED, JobState.RUNNING})


def verdict(job: JobRow, money: Funds | None) -> CheckAnswer:
    if job.state.terminal:
        return CheckAnswer(CheckState.REJECTED, f"the Kestrel job is {job.state.name.lower()}")
    # Messages carry only figures that change with a decision (credits move on a
    # top-up, not on every tick): a Workload write is dear (Kueue's CEL rules, every
    # watcher), so a message that drifted with spending would be patched again and
    # again for nothing.
    if money is not None and money.spent:
        return CheckAnswer(CheckState.PENDING,
                       f"tenant {job.tenant}'s budget is spent (credits {fmt(money.credits)}, "
                       "all charged); waits for a top-up")
    if job.state is JobState.HELD:
        return CheckAnswer(CheckState.PENDING, f"held by Kestrel for budget: {job.reason}")
    if job.state in LIVE:
        return CheckAnswer(CheckState.READY,
                       f"reservation of {fmt(job.reserved)} credits held for this job")
    return CheckAnswer(CheckState.PENDING, f"job is {job.state.name.lower()}")


def settled(w: WorkloadView, money: Funds | None) -> bool:
    """Nothing about it can change now: it finished, was deactivated, or is Ready while
    its tenant's money is not spent (only a spent budget turns Ready back)."""
    if w.finished or not w.active:
        return True
    return w.check_state == CheckState.READY.value and not (money is not None and money.spent)


def unsettled(workloads: Iterable[WorkloadView],
              money: Mapping[str, Funds]) -> list[WorkloadView]:
    return [w for w in workloads if not settled(w, money.get(w.tenant))]


def changes(workloads: Iterable[WorkloadView], jobs: Mapping[str, JobRow],
            money: Mapping[str, Funds]) -> list[tuple[WorkloadView, CheckAnswer]]:
    """Workloads whose check entry must change, with the new verdict."""
    out = []
    for w in workloads:
        if w.finished or not w.active:
            continue
        job = jobs.get(w.job_id)
        if job is None:
            continue
        v = verdict(job, money.get(job.tenant))
        if (v.state.value, v.message) != (w.check_state, w.check_message):
            out.append((w, v))
    return out


def to_deactivate(workloads: Iterable[WorkloadView], jobs: Mapping[str, JobRow],
                  money: Mapping[str, Funds]) -> list[WorkloadView]:
    """Admitted, active Workloads of tenants whose money is spent."""
    out = []
    for w in workloads:
        job = jobs.get(w.job_id)
        if job is None or not w.admitted or not w.active or w.finished:
            continue
        m = money.get(job.tenant)
        if m is not None and m.spent:
            out.append(w)
    return out
