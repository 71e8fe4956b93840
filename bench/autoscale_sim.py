"""A deterministic simulation of the autoscaler: `python -m bench.autoscale_sim`.

Everything here is SIMULATED: a virtual clock in 1 s steps, seeded Poisson
arrivals, a queue model of replicas that serve ~60 requests of 8 texts a second,
a cold start of a few seconds, and billing per replica-second from admission, as
the meter bills. Each step the scenario's trace is replayed through the very
function the live loop calls (`domain.decide`), with budgets from the one budget
formula (`kestrel_sdk.budget.budget`).

Every scenario runs twice on the same arrivals: budget-aware, and load-only (the
same core with an unlimited budget, i.e. what an autoscaler that scales on load
alone would do). The difference in cost is what budget awareness saved; the SLA
seconds missed (p95 over target, or requests dropped) say what it cost in service.

Writes report.json (byte-identical for the same seed), report.md and one PNG per
scenario under --out; prints a line per scenario and a table at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import textwrap
from collections import deque
from collections.abc import Callable, Sequence
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

# The model (simulated): what one replica of the embedding worker does.
SERVICE_RPS = 60.0  # requests of 8 texts one replica serves per second
SERVICE_MS = 50.0  # a request's own time in a replica (batching wait + inference)
COLD_START_S = 4  # from admission to serving
DEADLINE_S = 10  # a request waiting longer than this is dropped
PRICE = Decimal("0.0005")  # per replica-second of a CPU replica
UNLIMITED = Decimal(10) ** 9  # the load-only baseline's budget
MONEY = Decimal("0.000001")
SHARES = ((Priority.HIGH, 0.2), (Priority.LOW, 0.2))  # the rest is NORMAL

Load = Callable[[int], float]  # arrival rate (requests/s) at second t


@dataclass(frozen=True)
class EndpointPlan:
    name: str
    tenant: str
    load: Load
    policy: ScalePolicy = field(default_factory=lambda: ScalePolicy(warm_pool=1))
    price: Decimal = PRICE


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
    """The endpoint's requests per second and priority: the trace both runs replay."""
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
    requested: int = 0
    admitted: list[int] = field(default_factory=list)  # per replica: second it is ready
    queues: dict[Priority, deque[list[int]]] = field(default_factory=dict)
    state: ScaleState = field(default_factory=ScaleState)
    last_up: float | None = None
    last_down: float | None = None
    cost: Decimal = Decimal(0)
    served: int = 0
    dropped: int = 0
    series: dict[str, list[Any]] = field(default_factory=dict)

    def ready(self, t: int) -> int:
        return sum(1 for at in self.admitted if at <= t)

    def queued(self) -> dict[Priority, int]:
        return {p: sum(n for _, n in self.queues.get(p, ())) for p in Priority}


def _serve(ep: _Endpoint, t: int) -> tuple[int, float | None, int, int]:
    """One second of queue and service: (arrived, p95 ms or None, in flight, dropped)."""
    dropped_before = ep.dropped
    arrived = ep.trace[t]
    for p, n in arrived.items():
        if n:
            ep.queues.setdefault(p, deque()).append([t, n])
    ready = ep.ready(t)
    capacity = int(ready * SERVICE_RPS)
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
    if served:
        rho = min(0.98, total / (ready * SERVICE_RPS))
        queueing = 3 * rho ** math.sqrt(2 * (ready + 1)) / (ready * (1 - rho))
        waits.sort()
        rank, wait95 = 0.95 * served, 0
        for w, n in waits:
            rank -= n
            wait95 = w
            if rank <= 0:
                break
        p95 = SERVICE_MS * (1 + queueing) + 1000.0 * wait95
    if waiting:
        p95 = max(p95 or 0.0, 1000.0 * (t - min(waiting)) + SERVICE_MS)
    in_flight = round(served * SERVICE_MS / 1000)
    return total, p95, in_flight, ep.dropped - dropped_before


def _admit(eps: list[_Endpoint], t: int, cohort: int | None) -> None:
    """Kueue: requested replicas are admitted while the cohort has quota, one each in turn."""
    free = math.inf if cohort is None else cohort - sum(len(e.admitted) for e in eps)
    want = [e for e in eps if len(e.admitted) < e.requested]
    while free > 0 and want:
        for e in list(want):
            if free <= 0:
                break
            e.admitted.append(t + COLD_START_S)
            free -= 1
            if len(e.admitted) >= e.requested:
                want.remove(e)


def _money(d: Decimal) -> str:
    return str(d.quantize(MONEY))


def run(scenario: Scenario, seed: int, *, budget_aware: bool = True) -> dict[str, Any]:
    """One run of a scenario; the per-second series and totals of each endpoint."""
    eps = [_Endpoint(plan=e, trace=arrivals(scenario, e, seed)) for e in scenario.endpoints]
    tenants = {tp.name: tp for tp in scenario.tenants}
    charged = {name: Decimal(0) for name in tenants}
    credits = {name: tp.credits for name, tp in tenants.items()}
    for e in eps:  # start warm: the replicas the first second's load asks for, if affordable
        pol, tp = e.plan.policy, tenants[e.plan.tenant]
        wanted = min(pol.max_replicas, max(pol.floor, math.ceil(e.plan.load(0) / pol.replica_rps)))
        free = (budgets.remaining(tp.credits, Decimal(0), tp.other_reserved) if budget_aware
                else UNLIMITED)
        affordable = affordable_replicas(free, e.plan.price, pol.horizon_s, wanted)
        e.requested = wanted if affordable is None else affordable
    _admit(eps, -COLD_START_S, scenario.cohort_replicas)  # the warm pool is up at t=0
    for t in range(scenario.duration_s):
        for name, tp in tenants.items():
            credits[name] += sum((a for at, a in tp.credit_changes if at == t), Decimal(0))
        observed = [_serve(e, t) for e in eps]
        burn = {name: _step_of(tp.other_burn, t) for name, tp in tenants.items()}
        for name in tenants:
            charged[name] += burn[name]
        for e in eps:
            step_cost = len(e.admitted) * e.plan.price
            e.cost += step_cost
            charged[e.plan.tenant] += step_cost
            burn[e.plan.tenant] += step_cost
        for e, (arrived, p95, in_flight, dropped) in zip(eps, observed, strict=True):
            tp = tenants[e.plan.tenant]
            b = budget(credits[tp.name], charged[tp.name], tp.other_reserved, burn[tp.name])
            remaining, runway_s = (b.remaining, b.runway_s) if budget_aware \
                else (UNLIMITED, math.inf)
            ready = e.ready(t)
            inputs = ScaleInputs(
                policy=e.plan.policy, price_per_replica_s=e.plan.price, remaining=remaining,
                runway_s=runway_s, current=e.requested, ready=ready,
                pending=e.requested - ready, queue_depth=e.queued(),
                arrival_rps=float(arrived), in_flight=in_flight, p95_ms=p95,
                last_scale_up_at=e.last_up, last_scale_down_at=e.last_down)
            decision, e.state = decide(inputs, e.state, float(t))
            if decision.target > e.requested:
                e.last_up = float(t)
            elif decision.target < e.requested:
                e.last_down = float(t)
                e.admitted = sorted(e.admitted)[:decision.target]
            e.requested = decision.target
            queued = sum(inputs.queue_depth.values())
            missed = (p95 is not None and p95 > e.plan.policy.target_p95_ms) or (
                queued > 0 and ready == 0) or dropped > 0
            s = e.series
            for key, value in (("target", decision.target), ("ready", ready),
                               ("billed", len(e.admitted)), ("queue", queued),
                               ("p95_ms", None if p95 is None else round(p95, 1)),
                               ("runway_s", None if math.isinf(b.runway_s)
                                else round(b.runway_s, 1)),
                               ("remaining", _money(b.remaining)),
                               ("reason", str(decision.reason)), ("missed", missed),
                               ("cost", _money(e.cost))):
                s.setdefault(key, []).append(value)
        _admit(eps, t + 1, scenario.cohort_replicas)
    out = {}
    for e in eps:
        reasons = {str(r): e.series["reason"].count(str(r)) for r in Reason}
        drops = e.dropped
        out[e.plan.name] = {
            "cost": e.cost, "served": e.served, "dropped": drops,
            "sla_missed_s": sum(1 for m in e.series["missed"] if m),
            "reasons": reasons, "peak_replicas": max(e.series["target"]),
            "final_replicas": e.series["target"][-1], "final_reason": e.series["reason"][-1],
            "series": e.series,
        }
    return out


def _credits_total(tp: TenantPlan) -> Decimal:
    return tp.credits + sum((a for _, a in tp.credit_changes if a > 0), Decimal(0))


def simulate(scenario: Scenario, seed: int) -> dict[str, Any]:
    """Both runs of a scenario and what budget awareness saved, as report data."""
    aware = run(scenario, seed)
    load_only = run(scenario, seed, budget_aware=False)
    endpoints = []
    for plan in scenario.endpoints:
        a, lo = aware[plan.name], load_only[plan.name]
        tp = next(t for t in scenario.tenants if t.name == plan.tenant)
        p = plan.policy
        endpoints.append({
            "endpoint": plan.name, "tenant": plan.tenant,
            "price_per_replica_s": str(plan.price),
            "policy": {"min_replicas": p.min_replicas, "max_replicas": p.max_replicas,
                       "warm_pool": p.warm_pool, "target_queue_depth": p.target_queue_depth,
                       "target_p95_ms": p.target_p95_ms, "horizon_s": p.horizon_s,
                       "stable_window_s": p.stable_window_s, "panic_window_s": p.panic_window_s,
                       "scale_up_cooldown_s": p.scale_up_cooldown_s,
                       "scale_down_cooldown_s": p.scale_down_cooldown_s},
            "budget": _money(_credits_total(tp)),
            "cost": _money(a["cost"]), "load_only_cost": _money(lo["cost"]),
            "saved": _money(lo["cost"] - a["cost"]),
            "sla_missed_s": a["sla_missed_s"], "load_only_sla_missed_s": lo["sla_missed_s"],
            "served": a["served"], "dropped": a["dropped"],
            "load_only_dropped": lo["dropped"],
            "peak_replicas": a["peak_replicas"], "load_only_peak_replicas": lo["peak_replicas"],
            "final_replicas": a["final_replicas"], "final_reason": a["final_reason"],
            "reasons": a["reasons"], "load_only_reasons": lo["reasons"],
            "series": a["series"],
            "load_only_series": {k: lo["series"][k] for k in ("target", "queue", "p95_ms")},
        })
    return {"scenario": scenario.name, "story": scenario.story,
            "duration_s": scenario.duration_s, "cohort_replicas": scenario.cohort_replicas,
            "endpoints": endpoints}


# ---- scenarios -------------------------------------------------------------------

def _const(rate: float) -> Load:
    return lambda t: rate


def _one(name: str, story: str, load: Load, *, credits: str = "50", duration_s: int = 600,
         policy: ScalePolicy | None = None, **tenant: Any) -> Scenario:
    ep = EndpointPlan("embed", "acme", load, policy or ScalePolicy(warm_pool=1))
    return Scenario(name, story, duration_s, (TenantPlan("acme", Decimal(credits), **tenant),),
                    (ep,))


def scenarios() -> list[Scenario]:
    """The scenarios `make sim-autoscale` replays (loads in requests/s of 8 texts)."""
    base = ScalePolicy(warm_pool=1)

    def diurnal(t: int) -> float:
        return 180 + 150 * math.sin(2 * math.pi * t / 600 - math.pi / 2)

    return [
        _one("steady", "150 req/s for ten minutes; an ample budget", _const(150)),
        _one("spike", "60 req/s, a minute of 600 req/s at t=180 (more than 8 replicas serve)",
             lambda t: 600.0 if 180 <= t < 240 else 60.0),
        _one("ramp", "0 to 420 req/s over ten minutes", lambda t: 420 * t / 600),
        _one("diurnal", "two compressed days: 30 to 330 req/s and back, 600 s a day",
             diurnal, duration_s=1200),
        _one("idle_to_zero", "120 req/s, then nothing from t=120, then a trickle at t=420; "
             "no warm pool", lambda t: 120.0 if t < 120 else (3.0 if t >= 420 else 0.0),
             policy=replace(base, warm_pool=0)),
        _one("cooldown_flapping", "load flips between 60 and 300 req/s every 20 s",
             lambda t: 300.0 if (t // 20) % 2 else 60.0),
        _one("budget_nearly_exhausted", "100 rising to 400 req/s; $0.80 of budget, enough "
             "for 5 replicas over the 300 s horizon at the start",
             lambda t: 100 + 300 * t / 600, credits="0.80"),
        _one("topup_mid_run", "150 req/s on $0.25 (one replica over the horizon); "
             "a $2 top-up at t=400", _const(150), credits="0.25",
             credit_changes=((400, Decimal(2)),)),
        _one("exhaustion", "150 req/s on $3; the tenant's other work burns $0.002/s; "
             "at t=240 an adjustment of -$2.60 leaves nothing", _const(150), credits="3",
             credit_changes=((240, Decimal("-2.60")),),
             other_burn=((0, Decimal("0.002")),)),
        Scenario("two_tenants_sharing_a_cohort",
                 "a cohort quota of 10 replicas; acme ($50) 150 req/s with 400 req/s from "
                 "t=200 to 400; bolt ($1) 200 req/s: as bolt's budget shrinks it, acme gets "
                 "the quota (and spends more than it would have beside a load-only bolt)", 600,
                 (TenantPlan("acme", Decimal(50)), TenantPlan("bolt", Decimal(1))),
                 (EndpointPlan("acme-embed", "acme",
                               lambda t: 400.0 if 200 <= t < 400 else 150.0, base),
                  EndpointPlan("bolt-embed", "bolt", _const(200), base)),
                 cohort_replicas=10),
    ]


# ---- report ----------------------------------------------------------------------

def report(seed: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "simulated": True,
        "note": "SIMULATED: virtual clock, seeded arrivals, modelled replicas; not measured",
        "seed": seed,
        "model": {"service_rps_per_replica": SERVICE_RPS, "texts_per_request": 8,
                  "service_ms": SERVICE_MS, "cold_start_s": COLD_START_S,
                  "deadline_s": DEADLINE_S, "step_s": 1,
                  "billing": "per replica-second from admission (starting replicas bill)",
                  "load_only": "the same core with an unlimited budget"},
        "scenarios": results,
        "summary": _summary(results),
    }


def _rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"scenario": r["scenario"], **e} for r in results for e in r["endpoints"]]


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    rows = _rows(results)
    reasons = {str(r): sum(e["reasons"][str(r)] for e in rows) for r in Reason}
    cost = sum((Decimal(e["cost"]) for e in rows), Decimal(0))
    load_only = sum((Decimal(e["load_only_cost"]) for e in rows), Decimal(0))
    return {"scenarios": len(results), "endpoint_runs": len(rows),
            "decisions": sum(reasons.values()), "reasons": reasons,
            "cost": _money(cost), "load_only_cost": _money(load_only),
            "saved": _money(load_only - cost),
            "sla_missed_s": sum(e["sla_missed_s"] for e in rows),
            "load_only_sla_missed_s": sum(e["load_only_sla_missed_s"] for e in rows)}


def _name(e: dict[str, Any]) -> str:
    return e["scenario"] if e["endpoint"] == "embed" else f"{e['scenario']}/{e['endpoint']}"


def table(results: list[dict[str, Any]]) -> str:
    """The short table stdout ends with."""
    head = (f"{'scenario (simulated)':<42} {'budget$':>8} {'cost$':>9} {'load-only$':>10} "
            f"{'saved$':>9} {'SLA-s':>6} {'LO SLA-s':>8} {'peak':>4} {'end':>4}  final reason")
    lines = [head, "-" * len(head)]
    for e in _rows(results):
        lines.append(
            f"{_name(e):<42} {float(e['budget']):>8.2f} {float(e['cost']):>9.4f} "
            f"{float(e['load_only_cost']):>10.4f} {float(e['saved']):>9.4f} "
            f"{e['sla_missed_s']:>6} {e['load_only_sla_missed_s']:>8} "
            f"{e['peak_replicas']:>4} {e['final_replicas']:>4}  {e['final_reason']}")
    s = _summary(results)
    lines.append("-" * len(head))
    lines.append(f"{'total':<42} {'':>8} {float(s['cost']):>9.4f} "
                 f"{float(s['load_only_cost']):>10.4f} {float(s['saved']):>9.4f} "
                 f"{s['sla_missed_s']:>6} {s['load_only_sla_missed_s']:>8}")
    return "\n".join(lines)


def markdown(rep: dict[str, Any]) -> str:
    m = rep["model"]
    out = ["# Autoscaler simulation (simulated, not measured)", "",
           f"Seed {rep['seed']}. Virtual clock in 1 s steps; a replica serves "
           f"{m['service_rps_per_replica']:g} requests of 8 texts a second, starts in "
           f"{m['cold_start_s']} s, bills per replica-second from admission; a request "
           f"waiting over {m['deadline_s']} s is dropped. Every decision comes from "
           "`services.autoscaler.domain.decide`; the load-only run is the same core with an "
           "unlimited budget, on the same arrivals. An SLA-second is a second whose p95 is "
           "over the endpoint's target, in which requests wait with no replica ready, or in "
           "which requests are dropped.", ""]
    for r in rep["scenarios"]:
        out += [f"## {r['scenario']} (simulated)", "", r["story"] + ".", "",
                f"![{r['scenario']}]({r['scenario']}.png)", ""]
        for e in r["endpoints"]:
            if len(r["endpoints"]) > 1:
                out += [f"### {e['endpoint']} (tenant {e['tenant']})", ""]
            out += ["| figure | budget-aware | load-only |", "|---|---:|---:|",
                    f"| budget | ${e['budget']} | unlimited |",
                    f"| simulated cost | ${e['cost']} | ${e['load_only_cost']} |",
                    f"| saved by budget awareness | ${e['saved']} | |",
                    f"| SLA-seconds missed | {e['sla_missed_s']} | "
                    f"{e['load_only_sla_missed_s']} |",
                    f"| requests dropped | {e['dropped']} | {e['load_only_dropped']} |",
                    f"| peak replicas | {e['peak_replicas']} | "
                    f"{e['load_only_peak_replicas']} |",
                    f"| final replicas (reason) | {e['final_replicas']} "
                    f"({e['final_reason']}) | |", "",
                    "| reason | decisions | load-only |", "|---|---:|---:|"]
            out += [f"| {k} | {v} | {e['load_only_reasons'][k]} |"
                    for k, v in e["reasons"].items()]
            out.append("")
    s = rep["summary"]
    out += ["## Summary (simulated)", "",
            "| scenario | budget | cost | load-only cost | saved | SLA-s missed | "
            "load-only SLA-s | peak | final |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for e in _rows(rep["scenarios"]):
        out.append(f"| {_name(e)} | ${e['budget']} | ${e['cost']} | ${e['load_only_cost']} | "
                   f"${e['saved']} | {e['sla_missed_s']} | {e['load_only_sla_missed_s']} | "
                   f"{e['peak_replicas']} | {e['final_replicas']} ({e['final_reason']}) |")
    out += [f"| **total** | | ${s['cost']} | ${s['load_only_cost']} | ${s['saved']} | "
            f"{s['sla_missed_s']} | {s['load_only_sla_missed_s']} | | |", "",
            f"{s['decisions']} decisions (one per endpoint per simulated second):", "",
            "| reason | decisions |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in s["reasons"].items()]
    return "\n".join(out) + "\n"


_COLORS = {
    "scale_up": "tab:green", "scale_down": "tab:blue", "hold": "lightgray",
    "cooldown_block": "tab:orange", "cost_budget_block": "tab:red",
    "max_replicas_block": "tab:purple", "warm_pool_floor": "tab:cyan",
    "runway_short": "tab:brown", "runway_exhausted": "black", "scale_from_zero": "tab:olive",
}


def plot(result: dict[str, Any], path: Path) -> None:
    """Replicas, queue depth, p95 and runway over time, decisions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    ax_r, ax_q, ax_p, ax_w = axes
    labelled: set[str] = set()
    for i, e in enumerate(result["endpoints"]):
        s, lo = e["series"], e["load_only_series"]
        ts = list(range(len(s["target"])))
        tag = f" {e['endpoint']}" if len(result["endpoints"]) > 1 else ""
        style = "-" if i == 0 else "-."
        ax_r.step(ts, s["target"], style, where="post", color="tab:blue", label="target" + tag)
        ax_r.step(ts, s["ready"], style, where="post", color="tab:green", alpha=0.6,
                  label="ready" + tag)
        ax_r.step(ts, lo["target"], style, where="post", color="gray", alpha=0.5,
                  label="load-only target" + tag)
        marks: dict[str, tuple[list[int], list[int]]] = {}
        for t in ts:
            reason = s["reason"][t]
            changed = t > 0 and (reason != s["reason"][t - 1]
                                 or s["target"][t] != s["target"][t - 1])
            if reason != "hold" and (t == 0 or changed):
                xs, ys = marks.setdefault(reason, ([], []))
                xs.append(t)
                ys.append(s["target"][t])
        for reason, (xs, ys) in sorted(marks.items()):
            ax_r.scatter(xs, ys, s=22, color=_COLORS[reason], zorder=3,
                         label=None if reason in labelled else reason)
            labelled.add(reason)
        ax_q.plot(ts, s["queue"], style, color="tab:orange", label="queue" + tag)
        ax_q.plot(ts, lo["queue"], style, color="gray", alpha=0.5,
                  label="load-only queue" + tag)
        p95 = [math.nan if v is None else min(v, 20_000.0) for v in s["p95_ms"]]
        ax_p.plot(ts, p95, style, color="tab:red", label="p95 ms" + tag)
        ax_p.axhline(e["policy"]["target_p95_ms"], color="tab:red", linestyle=":",
                     linewidth=1)
        horizon = e["policy"]["horizon_s"]
        cap = 4 * horizon
        runway = [cap if v is None else min(v, cap) for v in s["runway_s"]]
        ax_w.plot(ts, runway, style, color="tab:purple", label="runway s" + tag)
        ax_w.axhline(horizon, color="tab:purple", linestyle=":", linewidth=1,
                     label="horizon" if i == 0 else None)
    ax_r.set_ylabel("replicas")
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
            print(f"sim-autoscale: [{i}/{len(chosen)}] {sc.name}/{e['endpoint']} (simulated): "
                  f"cost ${e['cost']} load-only ${e['load_only_cost']} saved ${e['saved']} "
                  f"SLA-s missed {e['sla_missed_s']} (load-only {e['load_only_sla_missed_s']})",
                  flush=True)
    rep = report(args.seed, results)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    (args.out / "report.md").write_text(markdown(rep))
    print(f"sim-autoscale: wrote {args.out}/report.json, report.md"
          + ("" if args.no_plots else f" and {len(chosen)} PNGs"))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
