"""From what the live loop read to `core.ScaleInputs`: pure, no I/O.

The loop reads, per endpoint: the gateway's view (spec, live replicas, ready ones),
Redis (each priority stream's length, its pending entries, the count of entries ever
added, the replicas' heartbeats), the tenant's last runway message from the meter,
and the prices. This module turns those readings into one decision's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from kestrel.endpoints import Priority, horizon_of, units_of
from kestrel.workloads import CPU_FLAVOR
from kestrel_sdk import budget
from kestrel_sdk.money import parse_amount
from kestrel_sdk.v1 import common_pb2, worker_pb2
from services.autoscaler.domain import ScaleInputs, ScalePolicy
from services.autoscaler.mix import Flavor, MixInputs, MixPolicy


@dataclass(frozen=True)
class StreamReading:
    """One priority stream of an endpoint at one instant."""

    length: int  # entries in the stream: queued plus those a replica holds
    pending: int  # entries a replica has read and not yet acknowledged (in flight)
    added: int  # entries ever added (XINFO STREAM entries-added): arrivals


@dataclass(frozen=True)
class Windows:
    """The autoscaler's own settings, the same for every endpoint."""

    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    scale_up_cooldown_s: float = 5.0
    scale_down_cooldown_s: float = 30.0
    replica_rps: float = 45.0
    # What one replica of each flavor does, for endpoints on several flavors (the CPU
    # pool's default from replica_rps; GPU flavors' from FlavorRate's defaults).
    flavor_rates: Mapping[str, FlavorRate] = field(default_factory=dict)

    def rate_of(self, flavor: str) -> FlavorRate:
        if flavor in self.flavor_rates:
            return self.flavor_rates[flavor]
        if flavor == CPU_FLAVOR:
            return FlavorRate(self.replica_rps, CPU_P95_MS, CPU_COLD_START_S)
        return DEFAULT_GPU_RATES.get(flavor, FlavorRate(self.replica_rps * 10, 20.0, 15.0,
                                                        simulated=True))


@dataclass(frozen=True)
class FlavorRate:
    """Requests a second one replica takes at target utilisation, its p95 in ms, its
    cold start in s, and whether those are assumed (a simulated GPU) or measured."""

    replica_rps: float
    p95_ms: float
    cold_start_s: float
    simulated: bool = False


# The CPU pool's as measured on the 2-core dev machine (make bench-infer: p99 146.8 ms
# at half rate); a pod's start with the model's load is about 4 s there.
CPU_P95_MS = 147.0
CPU_COLD_START_S = 4.0
# Simulated GPU replicas: assumed rates (docs/autoscaling.md), not measured.
DEFAULT_GPU_RATES = {
    "gpu-a10": FlavorRate(600.0, 20.0, 15.0, simulated=True),
    "gpu-h100": FlavorRate(2700.0, 10.0, 20.0, simulated=True),
}


def parse_flavor_rates(text: str) -> dict[str, FlavorRate]:
    """`flavor=rps:p95_ms:cold_start_s[,...]` (KESTREL_AUTOSCALER_FLAVOR_RATES); a GPU
    flavor's figures count as simulated, the CPU pool's as measured."""
    out: dict[str, FlavorRate] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, _, figures = item.partition("=")
        parts = figures.split(":")
        try:
            rps, p95, cold = (float(x) for x in parts)
        except ValueError:
            raise ValueError(f"flavor rate {item.strip()!r}: want flavor=rps:p95_ms:"
                             "cold_start_s") from None
        if rps <= 0 or p95 <= 0 or cold < 0:
            raise ValueError(f"flavor rate {item.strip()!r}: rps and p95 must be positive")
        out[name.strip()] = FlavorRate(rps, p95, cold, simulated=name.strip() != CPU_FLAVOR)
    return out


def policy_of(spec: common_pb2.EndpointSpec, w: Windows) -> ScalePolicy:
    """The endpoint's rules: its spec where it sets them, the autoscaler's otherwise."""
    return ScalePolicy(
        min_replicas=spec.min_replicas, max_replicas=max(spec.max_replicas, spec.min_replicas),
        warm_pool=spec.warm_pool,
        target_queue_depth=spec.target_queue_depth or ScalePolicy.target_queue_depth,
        replica_rps=w.replica_rps,
        target_p95_ms=float(spec.target_p95_ms or ScalePolicy.target_p95_ms),
        horizon_s=horizon_of(spec),
        stable_window_s=w.stable_window_s, panic_window_s=min(w.panic_window_s,
                                                              w.stable_window_s),
        panic_threshold=w.panic_threshold, scale_up_cooldown_s=w.scale_up_cooldown_s,
        scale_down_cooldown_s=float(spec.cooldown_s or w.scale_down_cooldown_s))


def replica_price(spec: common_pb2.EndpointSpec, prices: Mapping[str, Decimal]) -> Decimal:
    """Credits per replica-second: units x the flavor's price. With no flavor (one
    chosen by runway) the dearest GPU flavor's, so the target never outgrows the
    budget whichever flavor admission picks."""
    if spec.flavor:
        return units_of(spec) * prices.get(spec.flavor, Decimal(0))
    gpu = [p for f, p in prices.items() if f != CPU_FLAVOR]
    return units_of(spec) * max(gpu, default=Decimal(0))


def budget_for(runway: common_pb2.Runway | None, own_replicas: int, price: Decimal,
               horizon_s: int) -> tuple[Decimal, float]:
    """(remaining net of what other work reserved, runway in seconds) for the decision.

    The meter's free_to_reserve already takes every hold out, this endpoint's rolling
    holds (one per live replica: price x horizon) among them, so they are added back:
    the endpoint may keep what it holds. The runway is how long the unspent money
    lasts at the current burn (inf when nothing burns). No runway message yet: no
    budget known, so nothing may grow (remaining 0 would scale to zero; instead the
    caller skips the endpoint)."""
    if runway is None:
        return Decimal(0), 0.0
    free = Decimal(runway.free_to_reserve or runway.remaining or "0")
    remaining = free + own_replicas * price * horizon_s
    unspent = budget.unspent(Decimal(runway.credits or "0"), Decimal(runway.charged or "0"))
    if unspent <= 0:
        return Decimal(0), 0.0
    burn = Decimal(runway.burn_per_s or "0")
    if runway.unlimited or burn <= 0:
        return remaining, math.inf
    return remaining, float(unspent / burn)


def arrival_rps(before: Mapping[Priority, StreamReading] | None,
                now: Mapping[Priority, StreamReading], dt_s: float) -> float:
    """Requests per second added to the endpoint's streams since the last reading."""
    if before is None or dt_s <= 0:
        return 0.0
    added = sum(max(0, now[p].added - before[p].added) for p in now if p in before)
    return added / dt_s


def inputs_for(endpoint: common_pb2.Endpoint, streams: Mapping[Priority, StreamReading],
               rps: float, p95_ms: float | None, runway: common_pb2.Runway | None,
               prices: Mapping[str, Decimal], w: Windows,
               last_up: float | None, last_down: float | None) -> ScaleInputs:
    policy = policy_of(endpoint.spec, w)
    price = replica_price(endpoint.spec, prices)
    current = max(0, endpoint.replicas)
    ready = min(max(0, endpoint.ready_replicas), current)
    remaining, runway_s = budget_for(runway, current, price, policy.horizon_s)
    queued = {p: max(0, r.length - r.pending) for p, r in streams.items()}
    in_flight = sum(r.pending for r in streams.values())
    return ScaleInputs(
        policy=policy, price_per_replica_s=price, remaining=remaining, runway_s=runway_s,
        current=current, ready=ready, pending=current - ready, queue_depth=queued,
        arrival_rps=rps, in_flight=in_flight, p95_ms=p95_ms, last_scale_up_at=last_up,
        last_scale_down_at=last_down)


# The share of a replica's measured rate the autoscaler plans to use.
TARGET_UTILISATION = 0.75
# Model seconds the CPU pool's replicas must have spent before their rate is trusted.
MEASURED_AFTER_BUSY_S = 2.0


def worst_p95(beats: Sequence[worker_pb2.WorkerHeartbeat]) -> float | None:
    """The worst p95 among replicas that served (None: none has)."""
    served = [hb.p95_ms for hb in beats if hb.served]
    return max(served) if served else None


def measured_rps(beats: Sequence[worker_pb2.WorkerHeartbeat]) -> float | None:
    """Requests a second one replica of the CPU pool takes at target utilisation,
    measured: the pool's real replicas (not simulated stand-ins) served so many requests
    in so many model seconds. None until they have spent MEASURED_AFTER_BUSY_S in the
    model. Small batches at light load make it conservative."""
    real = [hb for hb in beats if not hb.simulated and hb.busy_s > 0]
    busy = sum(hb.busy_s for hb in real)
    if busy < MEASURED_AFTER_BUSY_S:
        return None
    return TARGET_UTILISATION * sum(hb.served for hb in real) / busy


def flavors_of(spec: common_pb2.EndpointSpec) -> tuple[str, ...]:
    """Every flavor the endpoint's replicas may run on, its own first."""
    own = spec.flavor or CPU_FLAVOR
    return (own, *(f for f in spec.flavors if f != own))


def several_flavors(spec: common_pb2.EndpointSpec) -> bool:
    return len(flavors_of(spec)) > 1


def mix_policy_of(spec: common_pb2.EndpointSpec, prices: Mapping[str, Decimal],
                  w: Windows, measured_cpu_rps: float | None = None) -> MixPolicy:
    """The cost-aware policy: each allowed flavor's price per replica-second (units x
    price) and rate (the CPU pool's measured one when there is one and no configured
    figure overrides it); the windows count load in replicas of the smallest flavor, so
    a backlog drains in target_queue_depth / that rate seconds on any mix."""
    flavors = []
    for name in flavors_of(spec):
        r = w.rate_of(name)
        if name == CPU_FLAVOR and measured_cpu_rps and name not in w.flavor_rates:
            r = FlavorRate(measured_cpu_rps, r.p95_ms, r.cold_start_s)
        units = 1 if name == CPU_FLAVOR else max(1, spec.gpus_per_replica)
        flavors.append(Flavor(name, units * prices.get(name, Decimal(0)), r.replica_rps,
                              r.p95_ms, r.cold_start_s, simulated=r.simulated))
    base = policy_of(spec, w)
    unit = min(f.replica_rps for f in flavors)
    value = (parse_amount(spec.missed_slo_value_per_s, positive=False)
             if spec.missed_slo_value_per_s else None)
    return MixPolicy(replace(base, replica_rps=unit), tuple(flavors), value)


def mix_inputs_for(endpoint: common_pb2.Endpoint, streams: Mapping[Priority, StreamReading],
                   rps: float, p95_ms: float | None, runway: common_pb2.Runway | None,
                   prices: Mapping[str, Decimal], w: Windows,
                   last_up: float | None, last_down: float | None,
                   measured_cpu_rps: float | None = None) -> MixInputs:
    """The cost-aware decision's inputs. The endpoint's own holds (each replica's
    flavor price x horizon) are added back to what the meter says is free."""
    policy = mix_policy_of(endpoint.spec, prices, w, measured_cpu_rps)
    allowed = {f.name: f for f in policy.flavors}
    current = {f: n for f, n in endpoint.flavor_replicas.items() if f in allowed and n > 0}
    if not current and endpoint.replicas:  # a gateway that does not count per flavor
        current = {flavors_of(endpoint.spec)[0]: endpoint.replicas}
    ready = {f: min(n, current.get(f, 0)) for f, n in endpoint.flavor_ready.items()
             if f in current and n > 0}
    own_per_s = sum((allowed[f].price_per_replica_s * n for f, n in current.items()),
                    Decimal(0))
    # one "replica" priced at the whole endpoint's spend a second: its holds added back
    remaining, runway_s = budget_for(runway, 1, own_per_s, policy.scale.horizon_s)
    queued = {p: max(0, r.length - r.pending) for p, r in streams.items()}
    in_flight = sum(r.pending for r in streams.values())
    return MixInputs(policy=policy, remaining=remaining, runway_s=runway_s, current=current,
                     ready=ready, queue_depth=queued, arrival_rps=rps, in_flight=in_flight,
                     p95_ms=p95_ms, last_scale_up_at=last_up, last_scale_down_at=last_down)
