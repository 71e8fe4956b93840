"""Admission's held-job metrics: a bounded reason for every HELD decision, zeros for
tenants with nothing held, the age of the oldest."""

from __future__ import annotations

import time
from decimal import Decimal

from services.admission.domain import QUEUED_BEHIND, Budget, JobAsk, Policy, Ruling, decide
from services.admission.metrics import HELD_REASONS, HeldCollector, HeldCount

PRICES = {"gpu-h100": Decimal("0.01")}
POLICY = Policy("acme", {"gpu-h100": 8}, suspended=False)
ASK = JobAsk("job-1", "acme", gpus=1, flavor="gpu-h100", max_duration_s=100, priority=0)


def test_each_held_decision_maps_to_its_kind() -> None:
    short = decide(ASK, POLICY, Budget(Decimal(1), Decimal("0.5")), PRICES, 8, False)
    behind = decide(ASK, POLICY, Budget(Decimal(10), Decimal(0)), PRICES, 8, True)
    assert (short.verdict, behind.verdict) == (Ruling.HELD, Ruling.HELD)
    # Postgres tells the kinds apart by these words (store.HELD_FOR_METRICS).
    assert (QUEUED_BEHIND in short.reason, QUEUED_BEHIND in behind.reason) == (False, True)
    assert set(HELD_REASONS) == {"budget", "queue"}


def test_collector_counts_by_reason_with_zeros_and_the_oldest_age() -> None:
    c = HeldCollector()
    now = time.time()
    c.update([HeldCount("acme", "budget", 1, now - 100), HeldCount("acme", "queue", 2, now - 5)],
             tenants=["acme", "idle"])
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for m in c.collect() for s in m.samples}
    assert got[("kestrel_admission_held_jobs", (("reason", "budget"), ("tenant", "acme")))] == 1
    assert got[("kestrel_admission_held_jobs", (("reason", "queue"), ("tenant", "acme")))] == 2
    assert got[("kestrel_admission_held_jobs", (("reason", "queue"), ("tenant", "idle")))] == 0
    age = got[("kestrel_admission_oldest_held_job_age_seconds", (("tenant", "acme"),))]
    assert 99 <= age < 110
    assert got[("kestrel_admission_oldest_held_job_age_seconds", (("tenant", "idle"),))] == 0
