"""Prometheus figures of the meter, every one read from the ledger projection."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from kestrel.clock import now_us
from services.meter.core import Meter


class LedgerCollector(Collector):
    """Figures per tenant and flavor from the committed rows (never seeded)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpu_s = GaugeMetricFamily("kestrel_ledger_gpu_seconds",
                                  "GPU-seconds in the ledger (reserved time, not compute)",
                                  labels=["tenant", "flavor"])
        spend = GaugeMetricFamily("kestrel_ledger_spend_credits", "Spend in the ledger",
                                  labels=["tenant", "flavor"])
        remaining = GaugeMetricFamily("kestrel_remaining_credits",
                                      "credits - charged - reserved", labels=["tenant"])
        runway = GaugeMetricFamily("kestrel_runway_seconds",
                                   "remaining / burn (+Inf when nothing burns)",
                                   labels=["tenant"])
        running = GaugeMetricFamily("kestrel_running_gpus", "GPUs in open allocations",
                                    labels=["tenant"])
        now = now_us()
        for tenant, acc in list(self.meter.projection.accounts.items()):
            for flavor, t in acc.flavors.items():
                gpu_s.add_metric([tenant, flavor], t.gpu_us / 1e6)
                spend.add_metric([tenant, flavor], float(t.cost))
            f = self.meter.projection.figures(tenant, now)
            remaining.add_metric([tenant], float(f.remaining))
            runway.add_metric([tenant], math.inf if f.unlimited else f.runway_s)
            running.add_metric([tenant], f.running_gpus)
        yield from (gpu_s, spend, remaining, runway, running)


class MeterMetrics:
    def __init__(self, meter: Meter, registry: CollectorRegistry) -> None:
        registry.register(LedgerCollector(meter))
        self.write_latency = Histogram(
            "kestrel_ledger_write_seconds", "Ledger transaction latency",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry)
        self.consumer_lag = Gauge("kestrel_meter_consumer_lag_messages",
                                  "Workload events not yet acknowledged by the meter",
                                  registry=registry)
        self.bad_events = Counter("kestrel_meter_bad_events",
                                  "Workload events terminated as invalid", registry=registry)
