"""A deterministic simulation of the autoscaler: `python -m bench.autoscale_sim`.

Everything here is SIMULATED except one figure: a virtual clock in 1 s steps, seeded
Poisson arrivals, a queue model of replicas, cold starts, and billing per
replica-second from admission, as the meter bills. The CPU pool's service rate is the
measured one (`make bench-infer`, 246 embeddings/s end to end on the 2-core dev
machine: 30 requests of 8 texts a second); the GPU flavors' rates are assumed and
labelled so. Each step the scenario's trace is replayed through the very functions the
autoscaler decides with, with budgets from the one budget formula
(`kestrel_sdk.budget.budget`).

Every scenario runs three times on the same arrivals:

- load-only: `domain.decide` with an unlimited budget on the endpoint's declared
  flavor (what an autoscaler that scales on load alone does);
- budget-aware: `domain.decide` with the tenant's real budget, on the declared flavor
  (today's live loop);
- cost-aware: `mix.decide_mix` with the real budget over every flavor the endpoint
  allows: the flavor mix by cost per request under the SLO, the warm pool and the
  scale-down delay sized from the cost of a cold start.

The SLA seconds missed (p95 over target, requests waiting with no replica ready, or
requests dropped) say what each cost in service. Writes report.json (byte-identical for
the same seed), report.md and one PNG per scenario under --out; prints a line per
scenario, a table, and last a `sim:` line.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import textwrap
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from kestrel.endpoints import Priority
from kestrel_sdk import budget as budgets
from kestrel_sdk.budget import budget
from services.autoscaler.domain import (
    Reason,
    ScaleInputs,
    ScalePolicy,
    ScaleState,
    affordable_replicas,
    decide,
)
from services.autoscaler.mix import Flavor, MixInputs, MixPolicy, MixState, decide_mix


@dataclass(frozen=True)
class FlavorModel:
    """What one replica of the embedding worker does on a flavor (in the model)."""

    name: str
    price: Decimal  # per replica-second
    service_rps: float  # requests of 8 texts one replica serves a second, saturated
    service_ms: float  # a request's own time in a replica (batching wait + inference)
    cold_start_s: int  # from admission to serving
    p95_ms: float  # the p95 the core is told a replica of this flavor gives
    source: str

    @property
    def simulated(self) -> bool:
        return not self.source.startswith("measured")

    def core(self) -> Flavor:
        return Flavor(self.name, self.price, TARGET_UTILISATION * self.service_rps,
                      self.p95_ms, float(self.cold_start_s), simulated=self.simulated)


TARGET_UTILISATION = 0.75  # the share of a replica's rate the autoscaler plans to use
# Prices keep the meter's default ratios (cpu 1 : gpu-a10 15 : gpu-h100 50).
FLAVORS: Mapping[str, FlavorModel] = {
    "cpu": FlavorModel("cpu", Decimal("0.0005"), 30.0, 50.0, 4, 147.0,
                       "measured: make bench-infer e2e_emb_per_s=246 (30 req/s of 8 texts), "
                       "p99_ms=146.8 at half rate; 2-core dev machine"),
    "gpu-a10": FlavorModel("gpu-a10", Decimal("0.0075"), 800.0, 10.0, 15, 20.0,
                           "simulated: assumed 6,400 embeddings/s"),
    "gpu-h100": FlavorModel("gpu-h100", Decimal("0.025"), 3600.0, 5.0, 20, 10.0,
                            "simulated: assumed 28,800 embeddings/s"),
}
DEADLINE_S = 10  # a request waiting longer than this is dropped
UNLIMITED = Decimal(10) ** 9  # the load-only baseline's budget
MONEY = Decimal("0.000001")
SHARES = ((Priority.HIGH, 0.2), (Priority.LOW, 0.2))  # the rest is NORMAL
# The endpoint owner's stated value of one second of missed SLO (cost-aware only).
MISSED_SLO_VALUE = Decimal("0.01")
POLICIES = ("load_only", "budget_aware", "cost_aware")
MONEY_REASONS = frozenset({Reason.RUNWAY_EXHAUSTED, Reason.RUNWAY_SHORT,
                           Reason.COST_BUDGET_BLOCK})

Load = Callable[[int], float]  # arrival rate (requests/s) at second t


@dataclass(frozen=True)
class EndpointPlan:
    name: str
    tenant: str
    load: Load
    policy: ScalePolicy = field(default_factory=lambda: ScalePolicy(warm_pool=1))
    # The flavor the endpoint was declared on, and every flavor it may run on.
    flavor: str = "cpu"
    flavors: tuple[str, ...] = ("cpu",)
    missed_slo_value_per_s: Decimal = MISSED_SLO_VALUE

    def __post_init__(self) -> None:
        if self.flavor not in self.flavors or not set(self.flavors) <= set(FLAVORS):
            raise ValueError(f"{self.name}: flavor {self.flavor} among {self.flavors}")

    @property
    def declared(self) -> FlavorModel:
        return FLAVORS[self.flavor]

    def scale_policy(self) -> ScalePolicy:
        """The policy with the declared flavor's rate as the replica unit."""
        return replace(self.policy,
                       replica_rps=TARGET_UTILISATION * self.declared.service_rps)

    def mix_policy(self) -> MixPolicy:
        """The cost-aware policy: load counted in replicas of the smallest allowed flavor,
        so a backlog drains in the same time whatever the endpoint was declared on."""
        unit = min(FLAVORS[f].service_rps for f in self.flavors)
        return MixPolicy(replace(self.policy, replica_rps=TARGET_UTILISATION * unit),
                         tuple(FLAVORS[f].core() for f in self.flavors),
                         self.missed_slo_value_per_s)


@dataclass(frozen=True)
class TenantPlan:
    name: str
    credits: Decimal
    # (second, amount): top-ups, or adjustments when negative.
    credit_changes: tuple[tuple[int, Decimal], ...] = ()
    # (from second, per second): the tenant's other, unreserved work that burns money.
    other_burn: tuple[tuple[int, Decimal], ...] = ()
    # What the tenant's other work holds reserved.
    other_reserved: Decimal = Decimal(0)


@dataclass(frozen=True)
class Scenario:
    name: str
    story: str
    duration_s: int
    tenants: tuple[TenantPlan, ...]
    endpoints: tuple[EndpointPlan, ...]
    # Replicas the cohort's quota admits across all endpoints (Kueue); None: no limit.
    cohort_replicas: int | None = None


def _step_of(changes: Sequence[tuple[int, Decimal]], t: int) -> Decimal:
    value = Decimal(0)
    for since, v in changes:
        if t >= since:
            value = v
    return value


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def arrivals(scenario: Scenario, ep: EndpointPlan, seed: int) -> list[dict[Priority, int]]:
    """The endpoint's requests per second and priority: the trace every run replays."""
    rng = random.Random(f"{seed}/{scenario.name}/{ep.name}")
    out = []
    for t in range(scenario.duration_s):
        n = _poisson(rng, ep.load(t))
        split = {p: int(n * share) for p, share in SHARES}
        split[Priority.NORMAL] = n - sum(split.values())
        out.append(split)
    return out


@dataclass
class _Endpoint:
    """One endpoint's simulated world during a run (mutable: this is the simulator)."""

    plan: EndpointPlan
    trace: list[dict[Priority, int]]
    # Per flavor: replicas asked for, and the second each admitted one is ready.
    requested: dict[str, int] = field(default_factory=dict)
    admitted: dict[str, list[int]] = field(default_factory=dict)
    queues: dict[Priority, deque[list[int]]] = field(default_factory=dict)
    state: ScaleState = field(default_factory=ScaleState)
    mix_state: MixState = field(default_factory=MixState)
    last_up: float | None = None
    last_down: float | None = None
    cost: Decimal = Decimal(0)
    served: int = 0
    dropped: int = 0
    over_budget: int = 0  # decisions whose plan cost more over the horizon than remained
    series: dict[str, Any] = field(default_factory=dict)

    def ready(self, t: int) -> dict[str, int]:
        return {f: n for f, ats in self.admitted.items()
                if (n := sum(1 for at in ats if at <= t))}

    def billed(self) -> int:
        return sum(len(a) for a in self.admitted.values())

    def queued(self) -> dict[Priority, int]:
        return {p: sum(n for _, n in self.queues.get(p, ())) for p in Priority}


def _latency_ms(ready: Mapping[str, int]) -> float:
    """A request's own time on the mix: the slowest flavor serving over 5 % of it."""
    cap = sum(FLAVORS[f].service_rps * n for f, n in ready.items())
    serving = [FLAVORS[f] for f, n in ready.items() if FLAVORS[f].service_rps * n > 0.05 * cap]
    return max(f.service_ms for f in serving)


def _serve(ep: _Endpoint, t: int) -> tuple[int, float | None, int, int]:
    """One second of queue and service: (arrived, p95 ms or None, in flight, dropped).
    The gateway's one queue feeds every ready replica, of whichever flavor."""
    dropped_before = ep.dropped
    arrived = ep.trace[t]
    for p, n in arrived.items():
        if n:
            ep.queues.setdefault(p, deque()).append([t, n])
    ready = ep.ready(t)
    replicas = sum(ready.values())
    full = sum(FLAVORS[f].service_rps * n for f, n in ready.items())
    capacity = int(full)
    waits: list[tuple[int, int]] = []  # (seconds waited, requests)
    for p in sorted(Priority, reverse=True):
        q = ep.queues.get(p, deque())
        while q and capacity > 0:
            take = min(capacity, q[0][1])
            waits.append((t - q[0][0], take))
            q[0][1] -= take
            capacity -= take
            if q[0][1] == 0:
                q.popleft()
        while q and t - q[0][0] >= DEADLINE_S:
            ep.dropped += q.popleft()[1]
    served = sum(n for _, n in waits)
    ep.served += served
    total = sum(arrived.values())
    waiting = [at for q in ep.queues.values() for at, _ in q]
    p95: float | None = None
    service_ms = _latency_ms(ready) if replicas else 0.0
    if served:
        rho = min(0.98, total / full)
        queueing = 3 * rho ** math.sqrt(2 * (replicas + 1)) / (replicas * (1 - rho))
        waits.sort()
        rank, wait95 = 0.95 * served, 0
        for w, n in waits:
            rank -= n
            wait95 = w
            if rank <= 0:
                break
        p95 = service_ms * (1 + queueing) + 1000.0 * wait95
    if waiting:
        p95 = max(p95 or 0.0, 1000.0 * (t - min(waiting)) + service_ms)
    in_flight = round(served * service_ms / 1000)
    return total, p95, in_flight, ep.dropped - dropped_before


def _admit(eps: list[_Endpoint], t: int, cohort: int | None) -> None:
    """Kueue: requested replicas are admitted while the cohort has quota, one each in
    turn; a replica of a flavor is ready after that flavor's cold start."""
    free = math.inf if cohort is None else cohort - sum(e.billed() for e in eps)
    want = [(e, f) for e in eps for f in sorted(e.requested)
            if len(e.admitted.get(f, ())) < e.requested[f]]
    while free > 0 and want:
        for e, f in list(want):
            if free <= 0:
                break
            e.admitted.setdefault(f, []).append(t + FLAVORS[f].cold_start_s)
            free -= 1
            if len(e.admitted[f]) >= e.requested[f]:
                want.remove((e, f))


def _money(d: Decimal) -> str:
    return str(d.quantize(MONEY))


def _resize(e: _Endpoint, target: Mapping[str, int], t: int) -> None:
    """Apply a decision: more replicas are requested; fewer are removed, those not yet
    ready first."""
    grew = shrank = False
    for f in set(e.requested) | set(target):
        want, had = target.get(f, 0), e.requested.get(f, 0)
        if want > had:
            grew = True
        elif want < had:
            shrank = True
            e.admitted[f] = sorted(e.admitted.get(f, []))[:want]
        e.requested[f] = want
    if grew:
        e.last_up = float(t)
    if shrank:
        e.last_down = float(t)


def run(scenario: Scenario, seed: int, policy: str = "budget_aware") -> dict[str, Any]:
    """One run of a scenario under one policy; the per-second series and totals."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} not among {POLICIES}")
    aware = policy != "load_only"
    eps = [_Endpoint(plan=e, trace=arrivals(scenario, e, seed)) for e in scenario.endpoints]
    tenants = {tp.name: tp for tp in scenario.tenants}
    charged = {name: Decimal(0) for name in tenants}
    credits = {name: tp.credits for name, tp in tenants.items()}
    for e in eps:  # start warm on the declared flavor: what the first second asks, if affordable
        pol, tp = e.plan.scale_policy(), tenants[e.plan.tenant]
        wanted = min(pol.max_replicas, max(pol.floor, math.ceil(e.plan.load(0) / pol.replica_rps)))
        free = (budgets.remaining(tp.credits, Decimal(0), tp.other_reserved) if aware
                else UNLIMITED)
        affordable = affordable_replicas(free, e.plan.declared.price, pol.horizon_s, wanted)
        e.requested = {e.plan.flavor: wanted if affordable is None else affordable}
    _admit(eps, -max(f.cold_start_s for f in FLAVORS.values()), scenario.cohort_replicas)
    for t in range(scenario.duration_s):
        for name, tp in tenants.items():
            credits[name] += sum((a for at, a in tp.credit_changes if at == t), Decimal(0))
        observed = [_serve(e, t) for e in eps]
        burn = {name: _step_of(tp.other_burn, t) for name, tp in tenants.items()}
        for name in tenants:
            charged[name] += burn[name]
        step_costs = []
        for e in eps:
            step_cost = sum((FLAVORS[f].price * len(a) for f, a in e.admitted.items()),
                            Decimal(0))
            step_costs.append(step_cost)
            e.cost += step_cost
            charged[e.plan.tenant] += step_cost
            burn[e.plan.tenant] += step_cost
        for e, (arrived, p95, in_flight, dropped), spent in zip(eps, observed, step_costs,
                                                                 strict=True):
            tp = tenants[e.plan.tenant]
            b = budget(credits[tp.name], charged[tp.name], tp.other_reserved, burn[tp.name])
            remaining, runway_s = (b.remaining, b.runway_s) if aware else (UNLIMITED, math.inf)
            ready = e.ready(t)
            queue = e.queued()
            if policy == "cost_aware":
                mp = e.plan.mix_policy()
                mixed, e.mix_state = decide_mix(MixInputs(
                    policy=mp, remaining=remaining, runway_s=runway_s,
                    current={f: n for f, n in e.requested.items() if n}, ready=ready,
                    queue_depth=queue, arrival_rps=float(arrived), in_flight=in_flight,
                    p95_ms=p95, last_scale_up_at=e.last_up, last_scale_down_at=e.last_down),
                    e.mix_state, float(t))
                target, reason, projected = dict(mixed.target), mixed.reason, \
                    mixed.projected_cost
            else:
                sp, f = e.plan.scale_policy(), e.plan.flavor
                n_ready = ready.get(f, 0)
                single, e.state = decide(ScaleInputs(
                    policy=sp, price_per_replica_s=e.plan.declared.price, remaining=remaining,
                    runway_s=runway_s, current=e.requested.get(f, 0), ready=n_ready,
                    pending=e.requested.get(f, 0) - n_ready, queue_depth=queue,
                    arrival_rps=float(arrived), in_flight=in_flight, p95_ms=p95,
                    last_scale_up_at=e.last_up, last_scale_down_at=e.last_down),
                    e.state, float(t))
                target = {f: single.target} if single.target else {}
                reason, projected = single.reason, single.projected_cost
            if aware and projected > max(Decimal(0), remaining):
                e.over_budget += 1
            _resize(e, target, t)
            queued = sum(queue.values())
            missed = (p95 is not None and p95 > e.plan.policy.target_p95_ms) or (
                queued > 0 and not ready) or dropped > 0
            s = e.series
            total = sum(target.values())
            for key, value in (("target", total), ("ready", sum(ready.values())),
                               ("billed", e.billed()), ("queue", queued),
                               ("p95_ms", None if p95 is None else round(p95, 1)),
                               ("runway_s", None if math.isinf(b.runway_s)
                                else round(b.runway_s, 1)),
                               ("remaining", _money(b.remaining)),
                               ("reason", str(reason)), ("missed", missed),
                               ("cost", _money(e.cost)),
                               ("spend_per_s", float(spent))):
                s.setdefault(key, []).append(value)
            mix = s.setdefault("mix", {f: [] for f in e.plan.flavors})
            for f in e.plan.flavors:
                mix[f].append(target.get(f, 0))
        _admit(eps, t + 1, scenario.cohort_replicas)
    out = {}
    for e in eps:
        reasons = {str(r): e.series["reason"].count(str(r)) for r in Reason}
        peak = max(range(len(e.series["target"])), key=lambda i: e.series["target"][i])
        out[e.plan.name] = {
            "cost": e.cost, "served": e.served, "dropped": e.dropped,
            "sla_missed_s": sum(1 for m in e.series["missed"] if m),
            "over_budget_decisions": e.over_budget,
            "reasons": reasons, "peak_replicas": e.series["target"][peak],
            "peak_mix": {f: c[peak] for f, c in e.series["mix"].items() if c[peak]},
            "final_replicas": e.series["target"][-1], "final_reason": e.series["reason"][-1],
            "series": e.series,
        }
    return out


def _credits_total(tp: TenantPlan) -> Decimal:
    return tp.credits + sum((a for _, a in tp.credit_changes if a > 0), Decimal(0))


def _pct(saved: Decimal, of: Decimal) -> float:
    return 0.0 if of == 0 else round(float(saved / of * 100), 1)


def simulate(scenario: Scenario, seed: int) -> dict[str, Any]:
    """The three runs of a scenario, as report data."""
    runs = {pol: run(scenario, seed, pol) for pol in POLICIES}
    endpoints = []
    for plan in scenario.endpoints:
        tp = next(t for t in scenario.tenants if t.name == plan.tenant)
        p = plan.policy
        by = {pol: runs[pol][plan.name] for pol in POLICIES}
        lo = by["load_only"]["cost"]
        policies = {}
        for pol, r in by.items():
            policies[pol] = {
                "cost": _money(r["cost"]), "saved": _money(lo - r["cost"]),
                "saved_pct": _pct(lo - r["cost"], lo),
                "sla_missed_s": r["sla_missed_s"], "served": r["served"],
                "dropped": r["dropped"], "over_budget_decisions": r["over_budget_decisions"],
                "peak_replicas": r["peak_replicas"], "peak_mix": r["peak_mix"],
                "final_replicas": r["final_replicas"], "final_reason": r["final_reason"],
                "reasons": r["reasons"],
                "series": r["series"] if pol != "load_only" else
                {k: r["series"][k] for k in ("target", "queue", "p95_ms", "spend_per_s")},
            }
        money_bound = any(by[pol]["reasons"][str(r)] for pol in ("budget_aware", "cost_aware")
                          for r in MONEY_REASONS)
        endpoints.append({
            "endpoint": plan.name, "tenant": plan.tenant, "flavor": plan.flavor,
            "flavors": list(plan.flavors),
            "policy": {"min_replicas": p.min_replicas, "max_replicas": p.max_replicas,
                       "warm_pool": p.warm_pool, "target_queue_depth": p.target_queue_depth,
                       "target_p95_ms": p.target_p95_ms, "horizon_s": p.horizon_s,
                       "stable_window_s": p.stable_window_s, "panic_window_s": p.panic_window_s,
                       "scale_up_cooldown_s": p.scale_up_cooldown_s,
                       "scale_down_cooldown_s": p.scale_down_cooldown_s,
                       "missed_slo_value_per_s": str(plan.missed_slo_value_per_s)},
            "budget": _money(_credits_total(tp)), "budget_ample": not money_bound,
            "policies": policies,
        })
    # A scenario's budget is ample when money set no decision of any of its endpoints
    # (in a shared cohort one tenant's money moves the other's quota).
    ample = all(e["budget_ample"] for e in endpoints)
    for e in endpoints:
        e["budget_ample"] = ample
    return {"scenario": scenario.name, "story": scenario.story,
            "duration_s": scenario.duration_s, "cohort_replicas": scenario.cohort_replicas,
            "budget_ample": ample, "endpoints": endpoints}


# ---- scenarios -------------------------------------------------------------------

def _const(rate: float) -> Load:
    return lambda t: rate


def _one(name: str, story: str, load: Load, *, credits: str = "50", duration_s: int = 600,
         policy: ScalePolicy | None = None, flavor: str = "cpu",
         flavors: tuple[str, ...] = ("cpu",), **tenant: Any) -> Scenario:
    ep = EndpointPlan("embed", "acme", load, policy or ScalePolicy(warm_pool=1), flavor,
                      flavors)
    return Scenario(name, story, duration_s, (TenantPlan("acme", Decimal(credits), **tenant),),
                    (ep,))


ALL_FLAVORS = ("cpu", "gpu-a10", "gpu-h100")


def scenarios() -> list[Scenario]:
    """The scenarios `make sim-autoscale` replays (loads in requests/s of 8 texts)."""
    base = ScalePolicy(warm_pool=1)
    wide = ScalePolicy(warm_pool=1, max_replicas=160)

    def diurnal(t: int) -> float:
        return 90 + 75 * math.sin(2 * math.pi * t / 600 - math.pi / 2)

    def triangle(t: int) -> float:
        return 3000.0 * (1 - abs(t - 600) / 600)

    def light(t: int) -> float:
        return 130 + 70 * math.sin(2 * math.pi * t / 600 - math.pi / 2)

    def bursts(t: int) -> float:
        return 120.0 if t % 300 < 40 else 0.0

    return [
        _one("steady", "75 req/s for ten minutes; an ample budget", _const(75)),
        _one("spike", "30 req/s, a minute of 300 req/s at t=180 (more than 8 replicas serve)",
             lambda t: 300.0 if 180 <= t < 240 else 30.0),
        _one("ramp", "0 to 210 req/s over ten minutes", lambda t: 210 * t / 600),
        _one("diurnal", "two compressed days: 15 to 165 req/s and back, 600 s a day",
             diurnal, duration_s=1200),
        _one("idle_to_zero", "60 req/s, then nothing from t=120, then a trickle at t=420; "
             "no warm pool", lambda t: 60.0 if t < 120 else (1.5 if t >= 420 else 0.0),
             policy=replace(base, warm_pool=0)),
        _one("cooldown_flapping", "load flips between 30 and 150 req/s every 20 s",
             lambda t: 150.0 if (t // 20) % 2 else 30.0),
        _one("budget_nearly_exhausted", "50 rising to 200 req/s; $0.80 of budget, enough "
             "for 5 replicas over the 300 s horizon at the start",
             lambda t: 50 + 150 * t / 600, credits="0.80"),
        _one("topup_mid_run", "75 req/s on $0.25 (one replica over the horizon); "
             "a $2 top-up at t=400", _const(75), credits="0.25",
             credit_changes=((400, Decimal(2)),)),
        _one("exhaustion", "75 req/s on $3; the tenant's other work burns $0.002/s; "
             "at t=240 an adjustment of -$2.60 leaves nothing", _const(75), credits="3",
             credit_changes=((240, Decimal("-2.60")),),
             other_burn=((0, Decimal("0.002")),)),
        Scenario("two_tenants_sharing_a_cohort",
                 "a cohort quota of 10 replicas; acme ($50) 75 req/s with 200 req/s from "
                 "t=200 to 400; bolt ($1) 100 req/s: as bolt's budget shrinks it, acme gets "
                 "the quota (and spends more than it would have beside a load-only bolt)", 600,
                 (TenantPlan("acme", Decimal(50)), TenantPlan("bolt", Decimal(1))),
                 (EndpointPlan("acme-embed", "acme",
                               lambda t: 200.0 if 200 <= t < 400 else 75.0, base),
                  EndpointPlan("bolt-embed", "bolt", _const(100), base)),
                 cohort_replicas=10),
        # Several flavors allowed: where the cost-aware policy chooses the mix.
        _one("mixed_ramp", "0 to 3,000 req/s and back over 20 min, declared on cpu, "
             "cpu, gpu-a10 and gpu-h100 allowed", triangle, credits="500", duration_s=1200,
             policy=wide, flavors=ALL_FLAVORS),
        _one("gpu_endpoint_light_load", "declared on gpu-a10, serving 60 to 200 req/s "
             "(two compressed days); cpu allowed", light, credits="100", duration_s=1200,
             policy=replace(base, max_replicas=16), flavor="gpu-a10",
             flavors=("cpu", "gpu-a10")),
        _one("latency_slo_100ms", "p95 target 100 ms, which the cpu pool (p95 147 ms) cannot "
             "meet; declared on gpu-h100; 400 req/s with 1,500 req/s from t=300 to 420",
             lambda t: 1500.0 if 300 <= t < 420 else 400.0, credits="200",
             policy=replace(base, target_p95_ms=100.0), flavor="gpu-h100",
             flavors=ALL_FLAVORS),
        _one("bursty_with_idle_gaps", "40 s of 120 req/s every 5 min, idle between; cpu, "
             "a warm replica configured", bursts, credits="50", duration_s=1500),
    ]


# ---- report ----------------------------------------------------------------------

def report(seed: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "simulated": True,
        "note": "SIMULATED: virtual clock, seeded arrivals, modelled replicas; not measured "
                "except the cpu flavor's service rate (make bench-infer)",
        "seed": seed,
        "model": {"flavors": {f.name: {"price_per_replica_s": str(f.price),
                                       "service_rps": f.service_rps,
                                       "service_ms": f.service_ms,
                                       "cold_start_s": f.cold_start_s, "p95_ms": f.p95_ms,
                                       "source": f.source} for f in FLAVORS.values()},
                  "target_utilisation": TARGET_UTILISATION, "texts_per_request": 8,
                  "deadline_s": DEADLINE_S, "step_s": 1,
                  "billing": "per replica-second from admission (starting replicas bill)",
                  "load_only": "domain.decide with an unlimited budget, declared flavor",
                  "budget_aware": "domain.decide with the tenant's budget, declared flavor",
                  "cost_aware": "mix.decide_mix with the tenant's budget, allowed flavors"},
        "scenarios": results,
        "summary": summary(results),
    }


def _rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"scenario": r["scenario"], **e} for r in results for e in r["endpoints"]]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    rows = _rows(results)
    ample = [e for e in rows if e["budget_ample"]]

    def total(es: list[dict[str, Any]], pol: str, key: str) -> Any:
        if key == "cost":
            return sum((Decimal(e["policies"][pol]["cost"]) for e in es), Decimal(0))
        return sum(e["policies"][pol][key] for e in es)

    out: dict[str, Any] = {"scenarios": len(results), "endpoint_runs": len(rows),
                           "ample_scenarios": [r["scenario"] for r in results
                                               if r["budget_ample"]]}
    for pol in POLICIES:
        out[pol] = {
            "cost": _money(total(rows, pol, "cost")),
            "sla_missed_s": total(rows, pol, "sla_missed_s"),
            "ample_cost": _money(total(ample, pol, "cost")),
            "ample_sla_missed_s": total(ample, pol, "sla_missed_s"),
            "reasons": {str(r): sum(e["policies"][pol]["reasons"][str(r)] for e in rows)
                        for r in Reason},
        }
    lo = Decimal(out["load_only"]["ample_cost"])
    ca = Decimal(out["cost_aware"]["ample_cost"])
    out["cost_aware_saved_pct"] = _pct(lo - ca, lo)
    out["budget_respected"] = all(
        e["policies"][pol]["over_budget_decisions"] == 0
        and (e["budget_ample"] or Decimal(e["policies"][pol]["cost"]) <= Decimal(e["budget"]))
        for e in rows for pol in ("budget_aware", "cost_aware"))
    return out


def sim_line(s: dict[str, Any]) -> str:
    """The summary's last line; the SLA figures are over the scenarios whose budget is
    ample, like the saving (where money is short, refusing service is the point)."""
    return (f"sim: scenarios={s['scenarios']} cost_aware_saved_pct={s['cost_aware_saved_pct']}"
            f" sla_s_cost_aware={s['cost_aware']['ample_sla_missed_s']}"
            f" sla_s_load_only={s['load_only']['ample_sla_missed_s']}"
            f" budget_respected={str(s['budget_respected']).lower()}")


def _name(e: dict[str, Any]) -> str:
    return e["scenario"] if e["endpoint"] == "embed" else f"{e['scenario']}/{e['endpoint']}"


def _mix(m: Mapping[str, int]) -> str:
    return "+".join(f"{n}x{f}" for f, n in sorted(m.items())) or "0"


def table(results: list[dict[str, Any]]) -> str:
    """The table stdout ends with, before the `sim:` line."""
    head = (f"{'scenario (simulated)':<44} {'budget$':>8} {'LO$':>8} {'BA$':>8} {'CA$':>8} "
            f"{'CA saved':>8} {'SLA LO':>6} {'SLA BA':>6} {'SLA CA':>6}  CA peak mix")
    lines = [head, "-" * len(head)]
    for e in _rows(results):
        p = e["policies"]
        name = _name(e) + ("" if e["budget_ample"] else " *")
        lines.append(
            f"{name:<44} {float(e['budget']):>8.2f} {float(p['load_only']['cost']):>8.4f} "
            f"{float(p['budget_aware']['cost']):>8.4f} {float(p['cost_aware']['cost']):>8.4f} "
            f"{p['cost_aware']['saved_pct']:>7.1f}% {p['load_only']['sla_missed_s']:>6} "
            f"{p['budget_aware']['sla_missed_s']:>6} {p['cost_aware']['sla_missed_s']:>6}  "
            f"{_mix(p['cost_aware']['peak_mix'])}")
    s = summary(results)
    lines.append("-" * len(head))
    for label, key in (("total, ample budget", "ample_"), ("total, all", "")):
        lo, ba, ca = (s[pol][f"{key}cost"] for pol in POLICIES)
        saved = _pct(Decimal(lo) - Decimal(ca), Decimal(lo))
        sla = [s[pol][f"{key}sla_missed_s"] for pol in POLICIES]
        lines.append(f"{label:<44} {'':>8} {float(lo):>8.4f} {float(ba):>8.4f} "
                     f"{float(ca):>8.4f} {saved:>7.1f}% {sla[0]:>6} {sla[1]:>6} {sla[2]:>6}")
    lines.append("LO load-only, BA budget-aware, CA cost-aware; * budget not ample "
                 "(money set some decision)")
    return "\n".join(lines)


def markdown(rep: dict[str, Any]) -> str:
    m = rep["model"]
    out = ["# Autoscaler simulation (simulated, not measured)", "",
           f"Seed {rep['seed']}. Virtual clock in 1 s steps; replicas bill per "
           f"replica-second from admission; a request waiting over {m['deadline_s']} s is "
           "dropped. Three policies on the same arrivals: load-only "
           f"({m['load_only']}), budget-aware ({m['budget_aware']}), cost-aware "
           f"({m['cost_aware']}). An SLA-second is a second whose p95 is over the "
           "endpoint's target, in which requests wait with no replica ready, or in which "
           "requests are dropped.", "",
           "| flavor | price / replica-s | service rate (req/s of 8 texts) | service ms | "
           "cold start s | p95 told to the core | source |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, f in m["flavors"].items():
        out.append(f"| {name} | ${f['price_per_replica_s']} | {f['service_rps']:g} | "
                   f"{f['service_ms']:g} | {f['cold_start_s']} | {f['p95_ms']:g} | "
                   f"{f['source']} |")
    out.append("")
    for r in rep["scenarios"]:
        out += [f"## {r['scenario']} (simulated)", "", r["story"] + ".", "",
                f"![{r['scenario']}]({r['scenario']}.png)", ""]
        for e in r["endpoints"]:
            if len(r["endpoints"]) > 1:
                out += [f"### {e['endpoint']} (tenant {e['tenant']})", ""]
            p = e["policies"]
            out += [f"Declared on {e['flavor']}; allowed: {', '.join(e['flavors'])}; budget "
                    f"${e['budget']} ({'ample' if e['budget_ample'] else 'not ample'}).", "",
                    "| figure | load-only | budget-aware | cost-aware |", "|---|---:|---:|---:|"]
            for label, key in (("simulated cost", "cost"), ("saved vs load-only", "saved"),
                               ("saved %", "saved_pct"), ("SLA-seconds missed", "sla_missed_s"),
                               ("requests dropped", "dropped"),
                               ("peak replicas", "peak_replicas"),
                               ("final replicas", "final_replicas"),
                               ("final reason", "final_reason")):
                vals = [p[pol][key] for pol in POLICIES]
                if key in ("cost", "saved"):
                    vals = [f"${v}" for v in vals]
                out.append(f"| {label} | " + " | ".join(str(v) for v in vals) + " |")
            out.append("| peak mix | " + " | ".join(_mix(p[pol]["peak_mix"])
                                                   for pol in POLICIES) + " |")
            out += ["", "| reason | load-only | budget-aware | cost-aware |",
                    "|---|---:|---:|---:|"]
            for k in p["cost_aware"]["reasons"]:
                vals = [p[pol]["reasons"][k] for pol in POLICIES]
                if any(vals):
                    out.append(f"| {k} | " + " | ".join(map(str, vals)) + " |")
            out.append("")
    s = rep["summary"]
    out += ["## Summary (simulated)", "", "```", table(rep["scenarios"]), sim_line(s), "```",
            "", f"Ample-budget scenarios: {', '.join(s['ample_scenarios'])}.", ""]
    return "\n".join(out) + "\n"


_COLORS = {
    "scale_up": "tab:green", "scale_down": "tab:blue", "hold": "lightgray",
    "cooldown_block": "tab:orange", "cost_budget_block": "tab:red",
    "max_replicas_block": "tab:purple", "warm_pool_floor": "tab:cyan",
    "runway_short": "tab:brown", "runway_exhausted": "black", "scale_from_zero": "tab:olive",
    "cheaper_flavor": "gold", "slo_needs_faster_flavor": "magenta",
    "warm_pool_sized": "teal",
}
_FLAVOR_COLORS = {"cpu": "#9ecae1", "gpu-a10": "#fdae6b", "gpu-h100": "#a1d99b"}


def plot(result: dict[str, Any], path: Path) -> None:
    """The cost-aware flavor mix over time against the other policies' replicas, then
    queue depth, p95 and runway; the cost-aware decisions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(11, 12), sharex=True)
    ax_r, ax_c, ax_q, ax_p, ax_w = axes
    labelled: set[str] = set()
    many = len(result["endpoints"]) > 1
    for i, e in enumerate(result["endpoints"]):
        pol = e["policies"]
        ca, ba, lo = (pol[k]["series"] for k in ("cost_aware", "budget_aware", "load_only"))
        ts = list(range(len(ca["target"])))
        tag = f" {e['endpoint']}" if many else ""
        style = "-" if i == 0 else "-."
        if not many:
            flavors = [f for f in e["flavors"] if any(ca["mix"][f])]
            ax_r.stackplot(ts, *[ca["mix"][f] for f in flavors], step="post",
                           colors=[_FLAVOR_COLORS[f] for f in flavors],
                           labels=[f"cost-aware {f}" for f in flavors])
        else:
            ax_r.step(ts, ca["target"], style, where="post", color="tab:green",
                      label="cost-aware" + tag)
        ax_r.step(ts, ba["target"], style, where="post", color="tab:blue", alpha=0.7,
                  label=f"budget-aware ({e['flavor']})" + tag)
        ax_r.step(ts, lo["target"], style, where="post", color="gray", alpha=0.6,
                  label=f"load-only ({e['flavor']})" + tag)
        marks: dict[str, tuple[list[int], list[int]]] = {}
        for t in ts:
            reason = ca["reason"][t]
            changed = t > 0 and (reason != ca["reason"][t - 1]
                                 or ca["target"][t] != ca["target"][t - 1])
            if reason != "hold" and (t == 0 or changed):
                xs, ys = marks.setdefault(reason, ([], []))
                xs.append(t)
                ys.append(ca["target"][t])
        for reason, (xs, ys) in sorted(marks.items()):
            ax_r.scatter(xs, ys, s=18, color=_COLORS[reason], zorder=3,
                         label=None if reason in labelled else reason)
            labelled.add(reason)
        for series, color, label in ((ca, "tab:green", "cost-aware"),
                                     (ba, "tab:blue", "budget-aware"),
                                     (lo, "gray", "load-only")):
            ax_c.step(ts, series["spend_per_s"], style, where="post", color=color, alpha=0.8,
                      label=f"{label} $/s{tag}")
        ax_q.plot(ts, ca["queue"], style, color="tab:green", label="cost-aware queue" + tag)
        ax_q.plot(ts, lo["queue"], style, color="gray", alpha=0.5,
                  label="load-only queue" + tag)
        for s, color, label in ((ca, "tab:green", "cost-aware"), (lo, "gray", "load-only")):
            p95 = [math.nan if v is None else min(v, 20_000.0) for v in s["p95_ms"]]
            ax_p.plot(ts, p95, style, color=color, alpha=0.8, label=f"{label} p95 ms{tag}")
        ax_p.axhline(e["policy"]["target_p95_ms"], color="tab:red", linestyle=":",
                     linewidth=1)
        horizon = e["policy"]["horizon_s"]
        cap = 4 * horizon
        runway = [cap if v is None else min(v, cap) for v in ca["runway_s"]]
        ax_w.plot(ts, runway, style, color="tab:purple", label="cost-aware runway s" + tag)
        ax_w.axhline(horizon, color="tab:purple", linestyle=":", linewidth=1,
                     label="horizon" if i == 0 else None)
    ax_r.set_ylabel("replicas")
    ax_c.set_ylabel("spend $ per s")
    ax_q.set_ylabel("queue depth")
    ax_p.set_ylabel("p95 ms (log)")
    ax_p.set_yscale("symlog", linthresh=100)
    ax_p.set_ylim(bottom=0)
    ax_w.set_ylabel(f"runway s (cap {4}x horizon)")
    ax_w.set_xlabel("simulated seconds")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=7, ncol=4)
        ax.grid(alpha=0.3)
    title = f"{result['scenario']} (SIMULATED): {result['story']}".replace("$", r"\$")
    fig.suptitle(textwrap.fill(title, 130), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.autoscale_sim",
                                 description="Replay autoscaler scenarios (simulated).")
    ap.add_argument("--out", type=Path, required=True, help="directory for the report")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    chosen = [s for s in scenarios() if not args.only or s.name in args.only.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, sc in enumerate(chosen, 1):
        result = simulate(sc, args.seed)
        results.append(result)
        if not args.no_plots:
            plot(result, args.out / f"{sc.name}.png")
        for e in result["endpoints"]:
            p = e["policies"]
            print(f"sim-autoscale: [{i}/{len(chosen)}] {sc.name}/{e['endpoint']} (simulated): "
                  f"cost load-only ${p['load_only']['cost']} budget-aware "
                  f"${p['budget_aware']['cost']} cost-aware ${p['cost_aware']['cost']} "
                  f"({p['cost_aware']['saved_pct']}% saved); SLA-s missed "
                  f"{p['load_only']['sla_missed_s']} / {p['budget_aware']['sla_missed_s']} / "
                  f"{p['cost_aware']['sla_missed_s']}", flush=True)
    rep = report(args.seed, results)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    (args.out / "report.md").write_text(markdown(rep))
    print(f"sim-autoscale: wrote {args.out}/report.json, report.md"
          + ("" if args.no_plots else f" and {len(chosen)} PNGs"))
    print(table(results))
    print(sim_line(rep["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
