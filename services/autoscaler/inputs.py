"""From what the live loop read to `core.ScaleInputs`: pure, no I/O.

The loop reads, per endpoint: the gateway's view (spec, live replicas, ready ones),
Redis (each priority stream's length, its pending entries, the count of entries ever
added, the replicas' heartbeats), the tenant's last runway message from the meter,
and the prices. This module turns those readings into one decision's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from kestrel.endpoints import Priority, horizon_of, units_of
from kestrel.workloads import CPU_FLAVOR
from kestrel_sdk import budget
from kestrel_sdk.v1 import common_pb2
from services.autoscaler.domain import ScaleInputs, ScalePolicy


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
