"""The cost-aware decision (services.autoscaler.mix): pure, no I/O."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel.endpoints import Priority
from services.autoscaler.domain import Reason, ScalePolicy
from services.autoscaler.mix import (
    Flavor,
    MixInputs,
    MixPolicy,
    MixState,
    capacity_of,
    cheapest_mix,
    cost_of,
    decide_mix,
    most_capacity,
)

CPU = Flavor("cpu", Decimal("0.0005"), 23.0, 150.0, 4.0)
A10 = Flavor("gpu-a10", Decimal("0.0075"), 600.0, 20.0, 15.0, simulated=True)
H100 = Flavor("gpu-h100", Decimal("0.025"), 2700.0, 10.0, 20.0, simulated=True)
ALL = (CPU, A10, H100)
AMPLE = Decimal(1000)
VALUE = Decimal("0.01")  # one missed SLO second is worth a cent


def policy(*flavors: Flavor, value: Decimal | None = VALUE, **scale: object) -> MixPolicy:
    base = ScalePolicy(max_replicas=int(str(scale.pop("max_replicas", 40))),
                       replica_rps=23.0)
    return MixPolicy(replace(base, **scale), flavors or ALL, value)  # type: ignore[arg-type]


def inputs(pol: MixPolicy, *, current: dict[str, int] | None = None,
           ready: dict[str, int] | None = None, rps: float = 0.0,
           remaining: Decimal = AMPLE, runway_s: float = math.inf, **kw: object) -> MixInputs:
    cur = current or {}
    return MixInputs(pol, remaining, runway_s, cur, cur if ready is None else ready,
                     arrival_rps=rps, **kw)  # type: ignore[arg-type]


def steady(inp: MixInputs, seconds: int = 61) -> tuple[object, MixState]:
    """Decide once a second for `seconds` on the same inputs (the windows fill)."""
    state = MixState()
    d = None
    for t in range(seconds):
        d, state = decide_mix(inp, state, float(t))
    return d, state


# --- the mix ---------------------------------------------------------------------

@pytest.mark.parametrize("demand, want", [
    (0.0, {}),
    (20.0, {"cpu": 1}),
    (100.0, {"cpu": 5}),
    # 15 CPU replicas (0.0075/s) cost the same as one A10: fewer replicas win the tie.
    (345.0, {"gpu-a10": 1}),
    (600.0, {"gpu-a10": 1}),
    (620.0, {"gpu-a10": 1, "cpu": 1}),
    (1300.0, {"gpu-a10": 2, "cpu": 5}),
    (2700.0, {"gpu-h100": 1}),
])
def test_the_cheapest_mix_covers_the_demand_at_the_least_cost(
        demand: float, want: dict[str, int]) -> None:
    assert dict(cheapest_mix(demand, ALL, 40) or {}) == want


def test_no_mix_covers_a_demand_beyond_the_maximum_replicas() -> None:
    assert cheapest_mix(500.0, (CPU,), 8) is None
    assert dict(most_capacity((CPU,), 8)) == {"cpu": 8}


def test_the_most_capacity_money_buys_prefers_the_cheaper_per_request() -> None:
    # $0.01/s buys one A10 (600 rps) and 5 CPUs (115), or 20 CPUs (460).
    got = most_capacity(ALL, 40, Decimal("0.01"))
    assert cost_of(got, ALL) <= Decimal("0.01")
    assert dict(got) == {"gpu-a10": 1, "cpu": 5}


@settings(max_examples=150, deadline=None)
@given(demand=st.floats(0, 4000), at_most=st.integers(1, 12))
def test_the_cheapest_mix_is_the_optimum_of_a_brute_force_search(
        demand: float, at_most: int) -> None:
    best = None
    for counts in itertools.product(range(at_most + 1), repeat=3):
        if sum(counts) > at_most:
            continue
        mix = {f.name: c for f, c in zip(ALL, counts, strict=True) if c}
        if capacity_of(mix, ALL) + 1e-9 >= demand:
            cost = cost_of(mix, ALL)
            best = cost if best is None else min(best, cost)
    got = cheapest_mix(demand, ALL, at_most)
    if best is None:
        assert got is None
    else:
        assert got is not None and cost_of(got, ALL) == best
        assert capacity_of(got, ALL) + 1e-9 >= demand and sum(got.values()) <= at_most


@settings(max_examples=150, deadline=None)
@given(per_s=st.decimals(0, "0.08", places=4), at_most=st.integers(1, 10))
def test_the_most_capacity_within_a_price_is_the_optimum_of_a_brute_force_search(
        per_s: Decimal, at_most: int) -> None:
    best = 0.0
    for counts in itertools.product(range(at_most + 1), repeat=3):
        mix = {f.name: c for f, c in zip(ALL, counts, strict=True) if c}
        if sum(counts) <= at_most and cost_of(mix, ALL) <= per_s:
            best = max(best, capacity_of(mix, ALL))
    got = most_capacity(ALL, at_most, per_s)
    assert cost_of(got, ALL) <= per_s and sum(got.values()) <= at_most
    assert capacity_of(got, ALL) == pytest.approx(best)


# --- decisions -------------------------------------------------------------------

def test_a_light_load_runs_on_the_cpu_pool() -> None:
    d, _ = steady(inputs(policy(), current={"cpu": 3}, rps=60.0))
    assert dict(d.target) == {"cpu": 3}  # type: ignore[attr-defined]


def test_a_rising_load_moves_the_endpoint_to_a_gpu_because_it_is_cheaper() -> None:
    d, _ = steady(inputs(policy(), current={"cpu": 20}, rps=460.0))
    assert dict(d.target) == {"cpu": 20, "gpu-a10": 1}  # type: ignore[attr-defined]
    assert d.reason == Reason.CHEAPER_FLAVOR  # type: ignore[attr-defined]


def test_the_old_flavor_goes_once_the_new_one_is_ready_make_before_break() -> None:
    pol = policy()
    starting = inputs(pol, current={"cpu": 20, "gpu-a10": 1}, ready={"cpu": 20}, rps=460.0)
    d, _ = steady(starting)
    assert dict(d.target) == {"cpu": 20, "gpu-a10": 1}  # type: ignore[attr-defined]
    up = inputs(pol, current={"cpu": 20, "gpu-a10": 1}, rps=460.0)
    d, _ = steady(up)
    assert dict(d.target) == {"gpu-a10": 1}  # type: ignore[attr-defined]
    assert d.reason == Reason.CHEAPER_FLAVOR  # type: ignore[attr-defined]


def test_a_falling_load_moves_the_endpoint_back_to_the_cpu_pool() -> None:
    d, _ = steady(inputs(policy(), current={"gpu-a10": 1}, rps=40.0))
    assert dict(d.target) == {"cpu": 2, "gpu-a10": 1}  # type: ignore[attr-defined]
    d, _ = steady(inputs(policy(), current={"gpu-a10": 1, "cpu": 2}, rps=40.0))
    assert dict(d.target) == {"cpu": 2}  # type: ignore[attr-defined]


def test_an_slo_the_cpu_cannot_meet_needs_a_faster_flavor() -> None:
    pol = policy(target_p95_ms=50.0)
    d, _ = steady(inputs(pol, current={"cpu": 2}, rps=40.0))
    assert dict(d.target) == {"cpu": 2, "gpu-a10": 1}  # type: ignore[attr-defined]
    assert d.reason == Reason.SLO_NEEDS_FASTER_FLAVOR  # type: ignore[attr-defined]
    d, _ = steady(inputs(pol, current={"cpu": 2, "gpu-a10": 1}, rps=40.0))
    assert dict(d.target) == {"gpu-a10": 1}  # type: ignore[attr-defined]


def test_with_no_flavor_fast_enough_the_fastest_serves() -> None:
    pol = policy(CPU, A10, target_p95_ms=5.0)
    d, _ = steady(inputs(pol, current={}, rps=40.0))
    assert dict(d.target) == {"gpu-a10": 1}  # type: ignore[attr-defined]


def test_an_idle_endpoint_keeps_a_warm_cpu_replica_until_the_break_even_time() -> None:
    # cpu: 4 s cold start x $0.01 / $0.0005 per s = 80 s of idle price.
    pol = policy()
    state = MixState()
    busy = inputs(pol, current={"cpu": 1}, rps=5.0)
    idle = inputs(pol, current={"cpu": 1})
    for t in range(70):
        d, state = decide_mix(busy, state, float(t))
    seen = []
    for t in range(70, 240):
        d, state = decide_mix(idle, state, float(t))
        seen.append((t, d.total, d.reason))
    kept = [t for t, n, _ in seen if n == 1]
    assert max(kept) < 69 + 80 + 1 and max(kept) >= 69 + 79
    gone = next((t, r) for t, n, r in seen if n == 0)
    assert gone[1] == Reason.SCALE_DOWN


def test_a_warm_replica_is_sized_from_cost_not_configuration() -> None:
    # Right after load stops the floor is the cost-sized warm replica.
    pol = policy(warm_pool=0)
    state = MixState()
    for t in range(70):
        d, state = decide_mix(inputs(pol, current={"cpu": 3}, rps=60.0), state, float(t))
    for t in range(70, 140):
        d, state = decide_mix(inputs(pol, current={"cpu": 3}), state, float(t))
    assert d.total == 1 and d.reason == Reason.WARM_POOL_SIZED


def test_without_a_stated_value_the_configured_warm_pool_holds() -> None:
    pol = policy(value=None, warm_pool=2)
    d, _ = steady(inputs(pol, current={"cpu": 2}), 400)
    assert dict(d.target) == {"cpu": 2}  # type: ignore[attr-defined]


def test_an_idle_gpu_replica_goes_sooner_than_the_cooldown() -> None:
    # a10: 15 s x $0.01 / $0.0075 = 20 s break-even, under the 30 s cooldown.
    pol = policy(A10, scale_down_cooldown_s=30.0)
    inp = inputs(pol, current={"gpu-a10": 2}, rps=100.0, last_scale_up_at=100.0)
    state = MixState()
    for t in range(40, 100):
        _, state = decide_mix(inp, state, float(t))
    d, _ = decide_mix(inp, state, 115.0)
    assert dict(d.target) == {"gpu-a10": 2} and d.reason == Reason.COOLDOWN_BLOCK
    d, _ = decide_mix(inp, state, 121.0)
    assert dict(d.target) == {"gpu-a10": 1}


def test_money_never_plans_past_the_budget_over_the_horizon() -> None:
    pol = policy()
    remaining = Decimal("1.5")  # $0.005/s over 300 s: not one A10
    d, _ = steady(inputs(pol, current={"cpu": 10}, rps=460.0, remaining=remaining))
    assert d.projected_cost <= remaining  # type: ignore[attr-defined]
    assert dict(d.target) == {"cpu": 10}  # type: ignore[attr-defined]
    assert d.reason == Reason.COST_BUDGET_BLOCK  # type: ignore[attr-defined]


def test_a_short_runway_shrinks_spend_in_proportion() -> None:
    d, _ = steady(inputs(policy(), current={"cpu": 10}, rps=200.0, runway_s=150.0))
    assert d.cost_per_s <= Decimal("0.0025")  # type: ignore[attr-defined]
    assert d.reason == Reason.RUNWAY_SHORT  # type: ignore[attr-defined]


def test_nothing_left_means_zero_replicas_of_every_flavor() -> None:
    d, _ = steady(inputs(policy(), current={"gpu-a10": 1, "cpu": 2}, rps=200.0,
                         remaining=Decimal(0)), 3)
    assert dict(d.target) == {} and d.reason == Reason.RUNWAY_EXHAUSTED  # type: ignore


def test_a_request_waiting_at_zero_replicas_starts_the_cheapest_that_meets_the_slo() -> None:
    pol = policy(warm_pool=0)
    d, _ = decide_mix(inputs(pol, queue_depth={Priority.NORMAL: 1}), MixState(), 0.0)
    assert dict(d.target) == {"cpu": 1} and d.reason == Reason.SCALE_FROM_ZERO


@pytest.mark.parametrize("bad, match", [
    (dict(current={"gpu-t4": 1}), "may not run on"),
    (dict(current={"cpu": 1}, ready={"cpu": 2}), "ready 2 > current 1"),
    (dict(current={"cpu": -1}), "must not be negative"),
])
def test_inputs_that_cannot_be_are_refused(bad: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        inputs(policy(), **bad)  # type: ignore[arg-type]


def test_a_policy_needs_distinct_flavors() -> None:
    with pytest.raises(ValueError, match="at least one flavor"):
        MixPolicy(ScalePolicy(), ())
    with pytest.raises(ValueError, match="named twice"):
        MixPolicy(ScalePolicy(), (CPU, CPU))


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.floats(0, 3000), min_size=5, max_size=40),
       remaining=st.decimals("0", "50", places=3),
       runway=st.one_of(st.just(math.inf), st.floats(1, 2000)))
def test_no_decision_plans_past_the_budget(rates: list[float], remaining: Decimal,
                                           runway: float) -> None:
    pol = policy()
    state, current = MixState(), {"cpu": 1}
    for t, rps in enumerate(rates):
        d, state = decide_mix(inputs(pol, current=current, rps=rps, remaining=remaining,
                                     runway_s=runway), state, float(t))
        assert d.projected_cost <= max(Decimal(0), remaining)
        assert d.total <= max(pol.scale.max_replicas, sum(current.values())) * 2
        current = dict(d.target)


def test_an_idle_endpoint_moving_to_its_cheaper_floor_keeps_its_ready_replica_meanwhile() -> None:
    pol = policy(CPU, A10, value=None, min_replicas=1)
    d, _ = steady(inputs(pol, current={"gpu-a10": 1, "cpu": 1}, ready={"gpu-a10": 1}))
    assert dict(d.target) == {"gpu-a10": 1, "cpu": 1}  # type: ignore[attr-defined]
    d, _ = steady(inputs(pol, current={"gpu-a10": 1, "cpu": 1}))
    assert dict(d.target) == {"cpu": 1}  # type: ignore[attr-defined]
