"""The cost-aware decision: how many replicas of each flavor an endpoint runs.

`decide_mix(inputs, state, now) -> (MixDecision, MixState)`. Pure, like `domain.decide`:
frozen data in and out, the clock a number the caller passes.

An endpoint may run on several flavors (say cpu, gpu-a10, gpu-h100), each with a price
per replica-second, a service rate (requests a second one replica takes at its target
utilisation) and a p95 of its own. Load comes from the same windows and panic mode as
`domain.decide` (`domain.load_of`), turned into requests per second: up on the panic
window, down on the stable one, a backlog drained in target_queue_depth / replica_rps
seconds. Then, in order:

1. SLO: only flavors whose own p95 is within the endpoint's target may serve; if none
   is, the fastest does.
2. The mix: the replica count per eligible flavor whose capacity covers the demand at
   the least cost per second (an exact search: for every count of all flavors but the
   slowest, the fewest of the slowest that cover the rest). In the manner of Mélange,
   the mix is chosen by cost per request, so a few cheap replicas serve a light load
   and a fast flavor a heavy one.
3. The warm pool, from cost: with no load, one replica of the cheapest eligible flavor
   stays warm only while the endpoint has been idle for less than the break-even time,
   cold_start_s x the value of a missed SLO second / price per second (ski rental:
   keep paying the idle price until it would have bought one cold start). Without a
   stated value the policy's configured warm pool holds, as in `domain.decide`.
4. Scale-down delay, from cost: a flavor's surplus replicas go after
   min(scale_down_cooldown_s, that flavor's break-even), so an idle GPU replica goes
   sooner than an idle CPU one. Changing flavor is make-before-break: the old
   replicas stay until the new plan's ready replicas cover the demand.
5. Money, above every rule: the target's cost per second x horizon never exceeds
   remaining; a runway below the horizon shrinks spend in proportion. When money
   cannot buy the plan, the most capacity money buys.

One reason per decision, as in `domain.Reason`, plus: `cheaper_flavor` (the mix
changes which flavors serve, to the cheaper one for the load), `slo_needs_faster_flavor`
(a flavor that would be cheaper is too slow for the SLO, so a faster one serves),
`warm_pool_sized` (the cost-sized warm pool set the target).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType

from kestrel.endpoints import Priority
from services.autoscaler.domain import QueueCounts, Reason, ScalePolicy, ScaleState, load_of

__all__ = [
    "Flavor",
    "MixDecision",
    "MixInputs",
    "MixPolicy",
    "MixState",
    "cheapest_mix",
    "decide_mix",
    "most_capacity",
]

Mix = Mapping[str, int]
_EPS = 1e-9


@dataclass(frozen=True)
class Flavor:
    """One flavor an endpoint may run on, and what a replica of it does."""

    name: str
    price_per_replica_s: Decimal
    # Requests a second one replica takes at its target utilisation.
    replica_rps: float
    # A request's p95 in one replica at that utilisation, with no queue.
    p95_ms: float
    cold_start_s: float
    # True where the rate is assumed, not measured on this machine.
    simulated: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a flavor needs a name")
        if self.price_per_replica_s < 0:
            raise ValueError(f"{self.name}: price must not be negative")
        if not (self.replica_rps > 0 and self.p95_ms > 0 and self.cold_start_s >= 0):
            raise ValueError(f"{self.name}: replica_rps and p95_ms must be positive, "
                             "cold_start_s not negative")

    def break_even_s(self, missed_slo_value_per_s: Decimal) -> float:
        """Idle seconds whose price equals one cold start's missed SLO seconds."""
        if self.price_per_replica_s == 0:
            return math.inf
        return float(Decimal(str(self.cold_start_s)) * missed_slo_value_per_s
                     / self.price_per_replica_s)


@dataclass(frozen=True)
class MixPolicy:
    # Windows, cooldowns, min/max replicas (over all flavors), target p95, horizon.
    # Its replica_rps is the unit the windows count load in (requests a second), and
    # target_queue_depth / replica_rps the seconds a backlog should take to drain.
    scale: ScalePolicy
    flavors: tuple[Flavor, ...]
    # The endpoint's stated value of one second of missed SLO; None: the warm pool
    # and scale-down cooldown are the scale policy's as configured.
    missed_slo_value_per_s: Decimal | None = None

    def __post_init__(self) -> None:
        if not self.flavors:
            raise ValueError("an endpoint needs at least one flavor")
        names = [f.name for f in self.flavors]
        if len(set(names)) != len(names):
            raise ValueError(f"flavors named twice: {names}")
        if self.missed_slo_value_per_s is not None and self.missed_slo_value_per_s < 0:
            raise ValueError("missed_slo_value_per_s must not be negative")

    def flavor(self, name: str) -> Flavor:
        for f in self.flavors:
            if f.name == name:
                return f
        raise KeyError(name)


def _empty() -> Mix:
    return MappingProxyType({})


def _no_queue() -> Mapping[Priority, int]:
    return MappingProxyType({})


@dataclass(frozen=True)
class MixInputs(QueueCounts):
    policy: MixPolicy
    remaining: Decimal
    runway_s: float
    # Replicas per flavor (ready + pending), and of those the ready ones.
    current: Mix = field(default_factory=_empty)
    ready: Mix = field(default_factory=_empty)
    queue_depth: Mapping[Priority, int] = field(default_factory=_no_queue)
    arrival_rps: float = 0.0
    in_flight: int = 0
    p95_ms: float | None = None
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None

    def __post_init__(self) -> None:
        names = {f.name for f in self.policy.flavors}
        for label, m in (("current", self.current), ("ready", self.ready)):
            unknown = set(m) - names
            if unknown:
                raise ValueError(f"{label}: flavors the endpoint may not run on: "
                                 f"{sorted(unknown)}")
            if any(n < 0 for n in m.values()):
                raise ValueError(f"{label}: replica counts must not be negative")
        for name, n in self.ready.items():
            if n > self.current.get(name, 0):
                raise ValueError(f"{name}: ready {n} > current {self.current.get(name, 0)}")
        if self.in_flight < 0 or any(v < 0 for v in self.queue_depth.values()):
            raise ValueError("queue depths and in_flight must not be negative")
        if self.arrival_rps < 0 or math.isnan(self.arrival_rps) or math.isnan(self.runway_s):
            raise ValueError("arrival_rps and runway_s must be numbers, arrival_rps >= 0")


@dataclass(frozen=True)
class MixState:
    scale: ScaleState = field(default_factory=ScaleState)
    # The last instant a request arrived, queued or was in flight; None: never.
    busy_at: float | None = None


@dataclass(frozen=True)
class MixDecision:
    target: Mix
    reason: Reason
    current: Mix
    # Requests a second load asks capacity for.
    demand_rps: float
    # The cheapest mix covering the demand under the SLO, before floors, cooldowns, money.
    plan: Mix
    cost_per_s: Decimal
    # cost_per_s x horizon: what the target would cost over the horizon.
    projected_cost: Decimal
    # The most the budget pays per second over the horizon; None: no limit.
    affordable_per_s: Decimal | None
    warm_floor: int
    panic: bool

    @property
    def total(self) -> int:
        return sum(self.target.values())


def cost_of(mix: Mix, flavors: Iterable[Flavor]) -> Decimal:
    by = {f.name: f for f in flavors}
    return sum((by[n].price_per_replica_s * c for n, c in mix.items()), Decimal(0))


def capacity_of(mix: Mix, flavors: Iterable[Flavor]) -> float:
    by = {f.name: f for f in flavors}
    return sum(by[n].replica_rps * c for n, c in mix.items())


def _key(mix: dict[str, int], flavors: Sequence[Flavor]) -> tuple[Decimal, int, tuple[int, ...]]:
    """Least cost, then fewest replicas, then a fixed order: a total order on mixes."""
    return (cost_of(mix, flavors), sum(mix.values()),
            tuple(-mix.get(f.name, 0) for f in flavors))


def _counts(flavors: Sequence[Flavor], bounds: Sequence[int]) -> Iterable[tuple[int, ...]]:
    if not flavors:
        yield ()
        return
    for n in range(bounds[0] + 1):
        for rest in _counts(flavors[1:], bounds[1:]):
            yield (n, *rest)


def cheapest_mix(demand_rps: float, flavors: Sequence[Flavor], at_most: int) -> Mix | None:
    """The least-cost replica counts (at most `at_most` in all) whose capacity covers
    `demand_rps`; None when no mix of that size covers it. Exact: no optimum holds
    more than ceil(demand / rate) of a flavor, and for every count of the others the
    fewest of the slowest that cover the rest is best."""
    if demand_rps <= _EPS:
        return MappingProxyType({})
    order = sorted(flavors, key=lambda f: (-f.replica_rps, f.name))
    *fast, slow = order
    bounds = [min(at_most, math.ceil(demand_rps / f.replica_rps - _EPS)) for f in fast]
    best: dict[str, int] | None = None
    for counts in _counts(fast, bounds):
        used = sum(counts)
        if used > at_most:
            continue
        left = demand_rps - sum(c * f.replica_rps for c, f in zip(counts, fast, strict=True))
        need = max(0, math.ceil(left / slow.replica_rps - _EPS))
        if used + need > at_most:
            continue
        mix = {f.name: c for f, c in zip(fast, counts, strict=True) if c}
        if need:
            mix[slow.name] = need
        if best is None or _key(mix, order) < _key(best, order):
            best = mix
    return None if best is None else MappingProxyType(best)


def most_capacity(flavors: Sequence[Flavor], at_most: int,
                  per_s: Decimal | None = None) -> Mix:
    """The mix of the most capacity within `at_most` replicas and, when given, a price
    per second; ties go to the cheaper. Exact in the same way as `cheapest_mix`."""
    order = sorted(flavors, key=lambda f: (f.price_per_replica_s, -f.replica_rps, f.name))
    *dear, cheap = order[::-1]

    def bound(f: Flavor) -> int:
        if per_s is None or f.price_per_replica_s == 0:
            return at_most
        return min(at_most, int(per_s // f.price_per_replica_s))

    best: dict[str, int] = {}
    best_key: tuple[float, Decimal] = (0.0, Decimal(0))
    for counts in _counts(dear, [bound(f) for f in dear]):
        used = sum(counts)
        spent = sum((c * f.price_per_replica_s for c, f in zip(counts, dear, strict=True)),
                    Decimal(0))
        if used > at_most or (per_s is not None and spent > per_s):
            continue
        fill = at_most - used
        if per_s is not None and cheap.price_per_replica_s > 0:
            fill = min(fill, int((per_s - spent) // cheap.price_per_replica_s))
        mix = {f.name: c for f, c in zip(dear, counts, strict=True) if c}
        if fill:
            mix[cheap.name] = fill
        key = (capacity_of(mix, order), -cost_of(mix, order))
        if key > best_key:
            best, best_key = mix, key
    return MappingProxyType(best)


def _total(m: Mix) -> int:
    return sum(m.values())


def _freeze(m: Mapping[str, int]) -> Mix:
    return MappingProxyType({k: v for k, v in sorted(m.items()) if v})


def decide_mix(inputs: MixInputs, state: MixState, now: float
               ) -> tuple[MixDecision, MixState]:
    """Replicas per flavor, the one reason, and the state for the next decision."""
    mp, p = inputs.policy, inputs.policy.scale
    flavors = mp.flavors
    current = _freeze(inputs.current)
    ready = _freeze(inputs.ready)
    ready_rps = capacity_of(ready, flavors)
    load = load_of(p, state.scale, now, queued=inputs.queued,
                   queued_urgent=inputs.queued_urgent, in_flight=inputs.in_flight,
                   arrival_rps=inputs.arrival_rps, ready_units=ready_rps / p.replica_rps)
    busy = inputs.queued + inputs.in_flight > 0 or inputs.arrival_rps > 0
    new_state = MixState(load.state, now if busy else state.busy_at)

    # Demand in requests a second: up on the short window, down on the long one (a mix
    # planned near its target utilisation must not lag a rising load); in a panic, the
    # panic's own target too. A p95 over target on flavors that meet it alone (so the
    # cause is queueing), or while requests queue, asks for one more of the smallest
    # replica; a request waiting at zero replicas asks for one.
    units = max(load.stable, load.panic_avg)
    if load.panic:
        units = max(units, load.state.panic_target)
    demand = units * p.replica_rps
    smallest = min(f.replica_rps for f in flavors)
    fast_enough = all(mp.flavor(n).p95_ms <= p.target_p95_ms for n in ready)
    if (inputs.p95_ms is not None and inputs.p95_ms > p.target_p95_ms and ready_rps > 0
            and (inputs.queued > 0 or fast_enough)):
        demand = max(demand, ready_rps + smallest)
    waiting_at_zero = _total(current) == 0 and inputs.queued + inputs.in_flight > 0
    if waiting_at_zero:
        demand = max(demand, smallest)

    # 1. SLO. 2. The mix.
    eligible = tuple(f for f in flavors if f.p95_ms <= p.target_p95_ms) or (
        min(flavors, key=lambda f: (f.p95_ms, f.price_per_replica_s)),)
    plan = cheapest_mix(demand, eligible, p.max_replicas)
    capped = plan is None
    if plan is None:
        plan = most_capacity(eligible, p.max_replicas)
    slo_bound = False
    if not capped and len(eligible) < len(flavors):
        unconstrained = cheapest_mix(demand, flavors, p.max_replicas)
        slo_bound = unconstrained is not None and \
            cost_of(unconstrained, flavors) < cost_of(plan, flavors)

    # 3. The floor: min replicas, and the warm pool (cost-sized or configured).
    cheapest = min(eligible, key=lambda f: (f.price_per_replica_s, -f.replica_rps, f.name))
    if mp.missed_slo_value_per_s is None:
        warm, sized = p.warm_pool, False
    else:
        idle_s = math.inf if new_state.busy_at is None else now - new_state.busy_at
        warm = int(idle_s < cheapest.break_even_s(mp.missed_slo_value_per_s))
        sized = True
    floor = min(p.max_replicas, max(p.min_replicas, warm))
    target = dict(plan)
    floored = _total(target) < floor
    if floored:
        target[cheapest.name] = target.get(cheapest.name, 0) + floor - _total(target)

    # 4. Cooldowns and scale-down delays, per flavor; make-before-break; a panic
    # never scales down.
    blocked = False
    grows = any(c > current.get(n, 0) for n, c in target.items())
    from_zero = _total(current) == 0 and _total(target) > 0
    up_cool = inputs.last_scale_up_at is not None and \
        now - inputs.last_scale_up_at < p.scale_up_cooldown_s
    if grows and up_cool and not (load.panic or from_zero):
        for n in list(target):
            if target[n] > current.get(n, 0):
                target[n] = current.get(n, 0)
        blocked = True
    changes = [t for t in (inputs.last_scale_up_at, inputs.last_scale_down_at) if t is not None]
    since_change = now - max(changes) if changes else math.inf
    for n, c in current.items():
        if target.get(n, 0) >= c:
            continue
        f = mp.flavor(n)
        delay = p.scale_down_cooldown_s
        if mp.missed_slo_value_per_s is not None:
            delay = min(delay, f.break_even_s(mp.missed_slo_value_per_s))
        if load.panic:
            target[n] = c
        elif since_change < delay:
            target[n], blocked = c, True
    # Make-before-break: while the rest's ready replicas cannot carry the demand (or,
    # with none, the floor's one replica), keep what would go.
    shrinking = [n for n, c in current.items() if target.get(n, 0) < c]
    if shrinking:
        kept_ready = {n: min(ready.get(n, 0), target.get(n, 0)) for n in target}
        need = demand if demand > _EPS else (smallest if _total(target) and ready else 0.0)
        if capacity_of(kept_ready, flavors) + _EPS < need:
            for n in shrinking:
                target[n] = current[n]

    # 5. Money: never more than the budget pays for over the horizon; a runway shorter
    # than the horizon shrinks spend in proportion to the gap.
    affordable: Decimal | None = None
    if inputs.remaining > 0:
        affordable = inputs.remaining / p.horizon_s
    if inputs.runway_s < p.horizon_s:
        shrink = cost_of(current, flavors) * Decimal(
            str(max(0.0, inputs.runway_s))) / p.horizon_s
        affordable = shrink if affordable is None else min(affordable, shrink)

    def done(mix: Mapping[str, int], reason: Reason) -> tuple[MixDecision, MixState]:
        m = _freeze(mix)
        cost = cost_of(m, flavors)
        return MixDecision(m, reason, current, demand, _freeze(plan), cost,
                           cost * p.horizon_s, affordable, floor, load.panic), new_state

    if inputs.remaining <= 0 or inputs.runway_s <= 0:
        return done({}, Reason.RUNWAY_EXHAUSTED)
    if affordable is not None and cost_of(target, flavors) > affordable:
        bought = most_capacity(eligible, max(p.max_replicas, _total(current)), affordable)
        short = cost_of(bought, flavors) < cost_of(current, flavors)
        return done(bought, Reason.RUNWAY_SHORT if short else Reason.COST_BUDGET_BLOCK)

    target = dict(_freeze(target))
    if blocked and target == dict(current):
        return done(target, Reason.COOLDOWN_BLOCK)
    if target == dict(current):
        return done(target, Reason.HOLD)
    if capped:
        return done(target, Reason.MAX_REPLICAS_BLOCK)
    if floored:
        return done(target, Reason.WARM_POOL_SIZED if sized else Reason.WARM_POOL_FLOOR)
    if from_zero:
        return done(target, Reason.SCALE_FROM_ZERO)
    if slo_bound:
        return done(target, Reason.SLO_NEEDS_FASTER_FLAVOR)
    before = {n for n, c in current.items() if c}
    if before and target and set(target) != before:
        return done(target, Reason.CHEAPER_FLAVOR)
    if capacity_of(target, flavors) > capacity_of(current, flavors):
        return done(target, Reason.SCALE_UP)
    if capacity_of(target, flavors) < capacity_of(current, flavors):
        return done(target, Reason.SCALE_DOWN)
    return done(target, Reason.CHEAPER_FLAVOR)
