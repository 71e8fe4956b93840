"""Prometheus figures of the meter, every one read from the ledger projection.

Per tenant (and flavor where the ledger has one); never per job. Counters are
the ledger's own sums, so they survive a restart of the meter unchanged (the
projection is rebuilt from the rows)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kestrel.clock import now_us
from services.meter.core import Meter


class LedgerCollector(Collector):
    """Figures per tenant and flavor from the committed rows (never seeded)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[Metric]:
        gpu_s = CounterMetricFamily("kestrel_ledger_gpu_seconds",
                                    "GPU-seconds in the ledger (reserved time, not compute)",
                                    labels=["tenant", "flavor"])
        spend = CounterMetricFamily("kestrel_ledger_spend_credits", "Spend in the ledger",
                                    labels=["tenant", "flavor"])

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["tenant"])

        credits = gauge("kestrel_budget_credits", "Credits granted: top-ups and adjustments")
        charged = gauge("kestrel_charged_credits", "Cost of every ledger row")
        reserved = gauge("kestrel_reserved_credits",
                         "What admission's holds have not consumed yet")
        remaining = gauge("kestrel_remaining_credits", "credits - charged - reserved")
        ratio = gauge("kestrel_runway_remaining_ratio",
                      "remaining / credits, clamped to [0, 1]")
        burn = gauge("kestrel_burn_credits_per_second", "Sum of running GPUs x flavor price")
        runway = gauge("kestrel_runway_seconds", "remaining / burn (+Inf when nothing burns)")
        money = gauge("kestrel_money_runway_seconds",
                      "(credits - charged) / burn: how long the money lasts (+Inf at no burn)")
        running = gauge("kestrel_running_gpus", "GPUs in open allocations")
        now = now_us()
        for tenant, acc in list(self.meter.projection.accounts.items()):
            for flavor, t in acc.flavors.items():
                gpu_s.add_metric([tenant, flavor], t.gpu_us / 1e6)
                spend.add_metric([tenant, flavor], float(t.cost))
            f = self.meter.projection.figures(tenant, now)
            b = f.budget
            credits.add_metric([tenant], float(b.credits))
            charged.add_metric([tenant], float(b.charged))
            reserved.add_metric([tenant], float(b.reserved))
            remaining.add_metric([tenant], float(b.remaining))
            ratio.add_metric([tenant], b.remaining_bp / 10_000)
            burn.add_metric([tenant], float(b.burn_per_s))
            runway.add_metric([tenant], math.inf if b.unlimited else b.runway_s)
            money.add_metric([tenant], math.inf if b.unlimited else b.money_runway_s)
            running.add_metric([tenant], f.running_gpus)
        yield from (gpu_s, spend, credits, charged, reserved, remaining, ratio, burn, runway,
                    money, running)


class MeterMetrics:
    def __init__(self, meter: Meter, registry: CollectorRegistry) -> None:
        registry.register(LedgerCollector(meter))
        self.write_latency = Histogram(
            "kestrel_ledger_write_seconds", "Ledger transaction latency",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry)
        self.bad_events = Counter("kestrel_meter_bad_events_total",
                                  "Workload events terminated as invalid", registry=registry)
        self.last_tick = Gauge("kestrel_meter_last_tick_timestamp_seconds",
                               "Unix time the meter's last tick completed (cutting every "
                               "open allocation into ledger rows up to then)",
                               registry=registry)
        self.ticks = Counter("kestrel_meter_ticks_total", "Ticks completed",
                             registry=registry)
        self.resync_stale = Counter(
            "kestrel_meter_resync_stale_tenants_total",
            "Tenants whose open holds a periodic resync found differing from the meter's "
            "(an announcement of admission's was missed) and read again",
            registry=registry)
