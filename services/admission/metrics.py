"""Prometheus figures of admission: its decisions, and the jobs it holds read from
the job rows (their reason and how long the oldest has waited).

Labels are bounded: tenant, decision, and the held reason's kind, never a job id
or the reason's words (they carry amounts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import asyncpg
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from services.admission.store import HELD_FOR_METRICS

log = logging.getLogger("kestrel.admission")

# Why a job is held, in a word: its reservation does not fit what the budget has left
# ("budget"), or a held job of equal or higher priority of the tenant waits before it
# ("queue"; services.admission.domain.decide).
HELD_REASONS = ("budget", "queue")


@dataclass(frozen=True)
class HeldCount:
    """How many of a tenant's jobs are held for one kind of reason, and since when the
    oldest of them (unix time: its submission, since only a submission holds)."""

    tenant: str
    reason: str  # one of HELD_REASONS
    jobs: int
    since_s: float


class HeldCollector(Collector):
    """kestrel_admission_held_jobs{tenant,reason} and the age of each tenant's oldest,
    from the last read of the job rows; every tenant admission knows gets a series (0
    when nothing is held), so a dashboard never shows a gap for "none"."""

    def __init__(self) -> None:
        self.held: list[HeldCount] = []
        self.tenants: set[str] = set()

    def update(self, held: Iterable[HeldCount], tenants: Iterable[str]) -> None:
        self.held = list(held)
        self.tenants = set(tenants) | {h.tenant for h in self.held}

    def collect(self) -> Iterator[Metric]:
        count = GaugeMetricFamily("kestrel_admission_held_jobs",
                                  "Jobs held by admission, by tenant and kind of reason",
                                  labels=["tenant", "reason"])
        age = GaugeMetricFamily("kestrel_admission_oldest_held_job_age_seconds",
                                "How long the tenant's oldest held job has waited (0: none)",
                                labels=["tenant"])
        now = time.time()
        held, tenants = self.held, sorted(self.tenants)
        for tenant in tenants:
            mine = [h for h in held if h.tenant == tenant]
            for reason in HELD_REASONS:
                count.add_metric([tenant, reason],
                                 sum(h.jobs for h in mine if h.reason == reason))
            age.add_metric([tenant], max((now - h.since_s for h in mine), default=0.0))
        yield from (count, age)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "kestrel_admission_decisions_total",
            "Admission's decisions on submitted jobs (admitted, held, rejected) and the "
            "release of held jobs (released)", ["tenant", "decision"], registry=registry)
        self.held = HeldCollector()
        registry.register(self.held)

    async def read_held(self, pool: asyncpg.Pool, tenants: Iterable[str]) -> None:
        """One row per tenant and kind of reason, counted in Postgres: every held job's
        row and reason read every 2 s cost admission a share of its CPU that grew with
        the queue."""
        rows = await pool.fetch(HELD_FOR_METRICS)
        self.held.update((HeldCount(r["tenant"], "queue" if r["behind"] else "budget",
                                    r["n"], r["since_us"] / 1e6) for r in rows), tenants)

    async def follow_held(self, pool: asyncpg.Pool, tenants: Iterable[str],
                          stop: asyncio.Event, every_s: float = 2.0) -> None:
        """Re-read the held jobs every few seconds until stop."""
        while not stop.is_set():
            try:
                await self.read_held(pool, list(tenants))
            except Exception as exc:  # Postgres away: the next round
                log.debug("reading held jobs for metrics: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s)
