"""The autoscaler's replica decision: `decide(inputs, state, now) -> (Decision, ScaleState)`.

Pure: frozen data in, frozen data out, the clock a number the caller passes. What
must survive from one decision to the next (the window of observed load, the panic
mode) is the explicit `ScaleState` the caller carries; the same inputs, state and
clock always give the same decision.

Load, in the manner of Knative's autoscaler: every decision adds one observation of
demand in replica units, max((queued + in flight) / target queue depth,
arrival rate / replica rate). The stable window (60 s) averages all of them; the
panic window (6 s) averages the urgent part (low-priority backlog left out). When
the panic average reaches `panic_threshold` x the ready replicas the endpoint
panics: it follows the panic window, never scales down, and ignores the scale-up
cooldown, until a whole stable window has passed without crossing the threshold.
A p95 above the target while requests queue asks for one replica more than are
ready; a request waiting at zero replicas asks for one.

Money, after load and cooldowns, and above every other rule:

- remaining <= 0 (or no runway left): zero replicas, `runway_exhausted`.
- affordable = floor(remaining / (price x horizon)): the target never exceeds it,
  so target x price x horizon <= remaining always holds.
- runway below the horizon (other work burns too): at most
  floor(current x runway / horizon) replicas, a shrink proportional to the gap.

The reason names the rule that set the target; exactly one per decision:
`runway_exhausted`; `runway_short` (money shrinks the endpoint);
`cost_budget_block` (money stops growth); `cooldown_block`; `hold` (also: a panic
never scales down); `max_replicas_block` (load wants more than the maximum);
`warm_pool_floor` (load wants fewer than the floor, max(min_replicas, warm_pool),
or the floor restores replicas); `scale_from_zero`; `scale_up`; `scale_down`.

Cooldowns: no scale-up within `scale_up_cooldown_s` of the last scale-up (a panic
or a request waiting at zero replicas is exempt); no scale-down within
`scale_down_cooldown_s` of the last change either way. Money ignores both.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType

from kestrel.endpoints import Priority

__all__ = [
    "MIX_REASONS",
    "Decision",
    "Observation",
    "Reason",
    "ScaleInputs",
    "ScalePolicy",
    "ScaleState",
    "affordable_replicas",
    "decide",
]

# Tolerance for the float averages: 3.0000000001 replicas of demand is three.
_EPS = 1e-9


class Reason(enum.StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"
    COOLDOWN_BLOCK = "cooldown_block"
    COST_BUDGET_BLOCK = "cost_budget_block"
    MAX_REPLICAS_BLOCK = "max_replicas_block"
    WARM_POOL_FLOOR = "warm_pool_floor"
    RUNWAY_SHORT = "runway_short"
    RUNWAY_EXHAUSTED = "runway_exhausted"
    SCALE_FROM_ZERO = "scale_from_zero"
    # The cost-aware decision's own (services.autoscaler.mix).
    CHEAPER_FLAVOR = "cheaper_flavor"
    SLO_NEEDS_FASTER_FLAVOR = "slo_needs_faster_flavor"
    WARM_POOL_SIZED = "warm_pool_sized"


# Reasons only the cost-aware decision gives (services.autoscaler.mix).
MIX_REASONS = frozenset({Reason.CHEAPER_FLAVOR, Reason.SLO_NEEDS_FASTER_FLAVOR,
                         Reason.WARM_POOL_SIZED})


@dataclass(frozen=True)
class ScalePolicy:
    """One endpoint's rules (EndpointSpec plus the autoscaler's windows)."""

    min_replicas: int = 0
    max_replicas: int = 8
    # Replicas kept ready while the budget allows: the floor is max(min, warm_pool).
    warm_pool: int = 0
    # Queued plus in-flight requests per replica the autoscaler aims for.
    target_queue_depth: int = 30
    # Requests per second one replica should take at its target utilisation.
    replica_rps: float = 45.0
    target_p95_ms: float = 250.0
    # Seconds of spend the target must be able to pay for.
    horizon_s: int = 300
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    scale_up_cooldown_s: float = 5.0
    scale_down_cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.warm_pool < 0:
            raise ValueError("min_replicas and warm_pool must not be negative")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} < min_replicas "
                             f"{self.min_replicas}")
        if self.target_queue_depth <= 0 or self.replica_rps <= 0 or self.target_p95_ms <= 0:
            raise ValueError("target_queue_depth, replica_rps, target_p95_ms must be positive")
        if self.horizon_s <= 0:
            raise ValueError("horizon_s must be positive")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if self.panic_threshold <= 1:
            raise ValueError("panic_threshold must exceed 1 (2.0 is Knative's 200%)")
        if self.scale_up_cooldown_s < 0 or self.scale_down_cooldown_s < 0:
            raise ValueError("cooldowns must not be negative")

    @property
    def floor(self) -> int:
        return min(self.max_replicas, max(self.min_replicas, self.warm_pool))


def _no_queue() -> Mapping[Priority, int]:
    return MappingProxyType({})


class QueueCounts:
    """Queued requests of an inputs type with a `queue_depth` per priority."""

    queue_depth: Mapping[Priority, int]

    @property
    def queued(self) -> int:
        return sum(self.queue_depth.values())

    @property
    def queued_urgent(self) -> int:
        return sum(n for p, n in self.queue_depth.items() if p != Priority.LOW)


@dataclass(frozen=True)
class ScaleInputs(QueueCounts):
    """What the loop observed for one endpoint at one instant, and its tenant's budget."""

    policy: ScalePolicy
    # Price of one replica-second of the endpoint's flavor.
    price_per_replica_s: Decimal
    # The tenant's remaining budget net of what *other* work has reserved
    # (kestrel_sdk.budget: credits - charged - reserved, the endpoint's own hold added back).
    remaining: Decimal
    # The tenant's runway (kestrel_sdk.budget.Budget.runway_s); inf when nothing burns.
    runway_s: float
    # Replicas the endpoint has (ready + pending), of which ready serve and pending start.
    current: int
    ready: int = 0
    pending: int = 0
    queue_depth: Mapping[Priority, int] = field(default_factory=_no_queue)
    arrival_rps: float = 0.0
    in_flight: int = 0
    # p95 latency over the last interval; None when nothing was served.
    p95_ms: float | None = None
    # When a decision the loop applied last grew / shrank the endpoint.
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None

    def __post_init__(self) -> None:
        if min(self.current, self.ready, self.pending, self.in_flight) < 0:
            raise ValueError("replica and request counts must not be negative")
        if self.ready > self.current:
            raise ValueError(f"ready {self.ready} > current {self.current}")
        if any(v < 0 for v in self.queue_depth.values()):
            raise ValueError("queue depths must not be negative")
        if self.price_per_replica_s < 0:
            raise ValueError("price_per_replica_s must not be negative")
        if self.arrival_rps < 0 or math.isnan(self.arrival_rps) or math.isnan(self.runway_s):
            raise ValueError("arrival_rps and runway_s must be numbers, arrival_rps >= 0")


@dataclass(frozen=True)
class Observation:
    """Demand in replica units seen at one instant: all of it, and the urgent part."""

    at: float
    demand: float
    urgent: float


@dataclass(frozen=True)
class ScaleState:
    """What the next decision needs from this one; start with `ScaleState()`."""

    observations: tuple[Observation, ...] = ()
    # Last instant the panic window crossed the threshold; None: not panicking.
    panic_since: float | None = None
    # The most replicas asked for during this panic (a panic never asks for fewer).
    panic_target: int = 0


@dataclass(frozen=True)
class Decision:
    target: int
    reason: Reason
    current: int
    # What load alone asks for (windows, panic, latency, a request at zero).
    load_target: int
    # Most replicas the budget pays for over the horizon; None: no limit (price 0).
    affordable: int | None
    panic: bool
    # target x price x horizon: what the target would cost over the horizon.
    projected_cost: Decimal
    stable_demand: float
    panic_demand: float

    @property
    def delta(self) -> int:
        return self.target - self.current


def affordable_replicas(remaining: Decimal, price: Decimal, horizon_s: int,
                        at_most: int) -> int | None:
    """The most replicas (up to at_most) whose cost over the horizon fits remaining;
    None when replicas cost nothing."""
    if remaining <= 0:
        return 0
    per_replica = price * horizon_s
    if per_replica <= 0:
        return None
    if per_replica * at_most <= remaining:
        return at_most
    # remaining / per_replica < at_most here, so the quotient is small and exact.
    return int(remaining // per_replica)


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _observe(policy: ScalePolicy, queued: int, queued_urgent: int, in_flight: int,
             arrival_rps: float, now: float) -> Observation:
    rate = arrival_rps / policy.replica_rps
    demand = max((queued + in_flight) / policy.target_queue_depth, rate)
    urgent = max((queued_urgent + in_flight) / policy.target_queue_depth, rate)
    return Observation(now, demand, urgent)


@dataclass(frozen=True)
class Load:
    """What the windows say at one instant, in replica units of `policy.replica_rps`."""

    stable: float
    panic_avg: float
    panic: bool
    # Replicas load asks for: the stable window, or the panic window while panicking.
    target: int
    state: ScaleState


def load_of(policy: ScalePolicy, state: ScaleState, now: float, *, queued: int,
            queued_urgent: int, in_flight: int, arrival_rps: float,
            ready_units: float) -> Load:
    """The windows and panic mode (Knative's rules, state made explicit); `ready_units`
    is the ready capacity in replicas of `policy.replica_rps`."""
    p = policy
    if state.observations and now < state.observations[-1].at:
        raise ValueError(f"clock went backwards: {now} < {state.observations[-1].at}")
    obs = _observe(p, queued, queued_urgent, in_flight, arrival_rps, now)
    kept = (*(o for o in state.observations if o.at > now - p.stable_window_s), obs)
    stable = _mean([o.demand for o in kept])
    panic_avg = _mean([o.urgent for o in kept if o.at > now - p.panic_window_s])
    over = panic_avg / max(1.0, ready_units) >= p.panic_threshold
    panic_since: float | None
    if over:
        panic_since = now
    elif state.panic_since is not None and now - state.panic_since < p.stable_window_s:
        panic_since = state.panic_since
    else:
        panic_since = None
    panic = panic_since is not None
    target = _ceil(stable)
    if panic:
        target = max(target, _ceil(panic_avg),
                     state.panic_target if state.panic_since is not None else 0)
    return Load(stable, panic_avg, panic, target,
                ScaleState(kept, panic_since, target if panic else 0))


def decide(inputs: ScaleInputs, state: ScaleState, now: float) -> tuple[Decision, ScaleState]:
    """The target replica count, its one reason, and the state for the next decision."""
    p = inputs.policy
    load = load_of(p, state, now, queued=inputs.queued, queued_urgent=inputs.queued_urgent,
                   in_flight=inputs.in_flight, arrival_rps=inputs.arrival_rps,
                   ready_units=float(inputs.ready))
    stable, panic_avg, panic, new_state = load.stable, load.panic_avg, load.panic, load.state
    load_target = load.target
    if (inputs.p95_ms is not None and inputs.p95_ms > p.target_p95_ms
            and inputs.queued > 0 and inputs.ready > 0):
        load_target = max(load_target, inputs.ready + 1)
    waiting_at_zero = inputs.current == 0 and inputs.queued + inputs.in_flight > 0
    if waiting_at_zero:
        load_target = max(load_target, 1)

    affordable = affordable_replicas(inputs.remaining, inputs.price_per_replica_s,
                                     p.horizon_s, max(p.max_replicas, inputs.current))

    def done(target: int, reason: Reason) -> tuple[Decision, ScaleState]:
        cost = target * inputs.price_per_replica_s * p.horizon_s
        return Decision(target, reason, inputs.current, load_target, affordable, panic,
                        cost, stable, panic_avg), new_state

    if inputs.remaining <= 0 or inputs.runway_s <= 0:
        return done(0, Reason.RUNWAY_EXHAUSTED)

    # Bounds: the floor (min replicas, warm pool) and the maximum.
    current = inputs.current
    floor = p.floor
    if load_target > p.max_replicas:
        target, bound = p.max_replicas, Reason.MAX_REPLICAS_BLOCK
    elif load_target < floor:
        target, bound = floor, Reason.WARM_POOL_FLOOR
    else:
        target, bound = load_target, Reason.HOLD

    # Cooldowns, and a panic never scales down.
    reason: Reason | None = None
    from_zero = current == 0 and load_target > 0
    if target > current and not (panic or from_zero) and inputs.last_scale_up_at is not None \
            and now - inputs.last_scale_up_at < p.scale_up_cooldown_s:
        target, reason = current, Reason.COOLDOWN_BLOCK
    elif target < current and panic:
        target, reason = current, Reason.HOLD
    elif target < current:
        changes = [t for t in (inputs.last_scale_up_at, inputs.last_scale_down_at)
                   if t is not None]
        if changes and now - max(changes) < p.scale_down_cooldown_s:
            target, reason = current, Reason.COOLDOWN_BLOCK

    # Money: never more than the budget pays for over the horizon, and a runway
    # shorter than the horizon shrinks the endpoint in proportion.
    cap = affordable if affordable is not None else max(target, current)
    if inputs.runway_s < p.horizon_s:
        cap = min(cap, math.floor(current * inputs.runway_s / p.horizon_s))
    if target > cap:
        return done(cap, Reason.RUNWAY_SHORT if cap < current else Reason.COST_BUDGET_BLOCK)
    if reason is not None:
        return done(target, reason)

    if target > current and from_zero:
        return done(target, Reason.SCALE_FROM_ZERO)
    if bound != Reason.HOLD:
        return done(target, bound)
    if target > current:
        return done(target, Reason.SCALE_UP)
    if target < current:
        return done(target, Reason.SCALE_DOWN)
    return done(target, Reason.HOLD)

