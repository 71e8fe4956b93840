"""The autoscaler's pure decision: every reason, each boundary, and the budget invariant."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel.endpoints import Priority
from services.autoscaler.domain import (
    MIX_REASONS,
    Reason,
    ScaleInputs,
    ScalePolicy,
    ScaleState,
    affordable_replicas,
    decide,
)

NOW = 1000.0
# $0.001 a replica-second over a 100 s horizon: each replica needs $0.10 of budget.
POLICY = ScalePolicy(max_replicas=8, horizon_s=100, replica_rps=45.0,
                     scale_up_cooldown_s=5, scale_down_cooldown_s=30)
PRICE = Decimal("0.001")


def rps(replicas: float) -> float:
    """An arrival rate that asks for this many replicas."""
    return 45.0 * replicas


def inputs(current: int = 2, *, ready: int | None = None, policy: ScalePolicy = POLICY,
           **kw: Any) -> ScaleInputs:
    base: dict[str, Any] = {"price_per_replica_s": PRICE, "remaining": Decimal(100),
                            "runway_s": math.inf}
    base.update(kw)
    return ScaleInputs(policy=policy, current=current,
                       ready=current if ready is None else ready, **base)


@dataclass(frozen=True)
class Case:
    inputs: ScaleInputs
    want_target: int
    want_reason: Reason
    state: ScaleState = field(default_factory=ScaleState)
    now: float = NOW


def case(id: str, *args: Any, **kw: Any) -> Any:
    return pytest.param(Case(*args, **kw), id=id)


CASES = [
    # load
    case("load asking for one replica more than runs scales up by one",
         inputs(2, arrival_rps=rps(3)), 3, Reason.SCALE_UP),
    case("load matching the replicas that run holds",
         inputs(2, arrival_rps=rps(2)), 2, Reason.HOLD),
    case("load for fewer replicas scales down",
         inputs(4, arrival_rps=rps(2)), 2, Reason.SCALE_DOWN),
    case("a p95 over its target while requests queue asks for one more than are ready",
         inputs(2, arrival_rps=rps(1), p95_ms=400.0, queue_depth={Priority.NORMAL: 10}),
         3, Reason.SCALE_UP),
    case("a p95 over its target with nothing queued asks for nothing more",
         inputs(2, arrival_rps=rps(2), p95_ms=400.0), 2, Reason.HOLD),
    case("queued requests count toward demand per target queue depth",
         inputs(2, queue_depth={Priority.HIGH: 60, Priority.LOW: 30}), 3, Reason.SCALE_UP),
    # scale from zero
    case("one request waiting at zero replicas starts one",
         inputs(0, queue_depth={Priority.NORMAL: 1}), 1, Reason.SCALE_FROM_ZERO),
    case("a request at zero replicas ignores the scale-up cooldown",
         inputs(0, queue_depth={Priority.NORMAL: 1}, last_scale_up_at=NOW - 1),
         1, Reason.SCALE_FROM_ZERO),
    case("a burst at zero replicas starts as many as it asks for",
         inputs(0, arrival_rps=rps(4)), 4, Reason.SCALE_FROM_ZERO),
    case("nothing waiting at zero replicas and no warm pool stays at zero",
         inputs(0), 0, Reason.HOLD),
    # max replicas
    case("load for ten against a maximum of eight stops at eight",
         inputs(8, arrival_rps=rps(10)), 8, Reason.MAX_REPLICAS_BLOCK),
    case("a spike from two is stopped at the maximum of eight",
         inputs(2, arrival_rps=rps(12)), 8, Reason.MAX_REPLICAS_BLOCK),
    case("load for exactly the maximum is no block",
         inputs(8, arrival_rps=rps(8)), 8, Reason.HOLD),
    # cooldowns
    case("a scale-up one second inside its cooldown is blocked",
         inputs(2, arrival_rps=rps(3), last_scale_up_at=NOW - 4), 2, Reason.COOLDOWN_BLOCK),
    case("a scale-up exactly at the end of its cooldown goes ahead",
         inputs(2, arrival_rps=rps(3), last_scale_up_at=NOW - 5), 3, Reason.SCALE_UP),
    case("a scale-down one second inside its cooldown is blocked",
         inputs(4, arrival_rps=rps(2), last_scale_up_at=NOW - 29), 4, Reason.COOLDOWN_BLOCK),
    case("a scale-down exactly at the end of its cooldown goes ahead",
         inputs(4, arrival_rps=rps(2), last_scale_up_at=NOW - 30), 2, Reason.SCALE_DOWN),
    case("the scale-down cooldown counts from the last scale-down too",
         inputs(4, arrival_rps=rps(2), last_scale_down_at=NOW - 10), 4, Reason.COOLDOWN_BLOCK),
    case("a panic (twice the ready replicas) ignores the scale-up cooldown",
         inputs(2, arrival_rps=rps(5), last_scale_up_at=NOW - 1), 5, Reason.SCALE_UP),
    case("within a panic the target never drops below the panic's peak",
         inputs(6, arrival_rps=rps(1)), 6, Reason.HOLD,
         state=ScaleState(panic_since=NOW - 10, panic_target=6)),
    case("a panic ends a stable window after it last crossed the threshold",
         inputs(6, arrival_rps=rps(1)), 1, Reason.SCALE_DOWN,
         state=ScaleState(panic_since=NOW - 60, panic_target=6)),
    # warm pool
    case("no load holds the warm pool of two",
         inputs(2, policy=replace(POLICY, warm_pool=2)), 2, Reason.WARM_POOL_FLOOR),
    case("a scale-down stops at the warm pool floor",
         inputs(5, arrival_rps=rps(1), policy=replace(POLICY, warm_pool=2)),
         2, Reason.WARM_POOL_FLOOR),
    case("the warm pool comes back at zero replicas with nothing waiting",
         inputs(0, policy=replace(POLICY, warm_pool=2)), 2, Reason.WARM_POOL_FLOOR),
    case("min_replicas is part of the floor",
         inputs(3, policy=replace(POLICY, min_replicas=3, warm_pool=1)),
         3, Reason.WARM_POOL_FLOOR),
    case("load above the warm pool is plain load",
         inputs(3, arrival_rps=rps(3), policy=replace(POLICY, warm_pool=2)), 3, Reason.HOLD),
    case("a warm pool the budget cannot pay for is cut to what it can",
         inputs(0, policy=replace(POLICY, warm_pool=3), remaining=Decimal("0.25")),
         2, Reason.COST_BUDGET_BLOCK),
    # cost budget
    case("a budget that covers two replicas over the horizon caps a spike at two",
         inputs(1, arrival_rps=rps(6), remaining=Decimal("0.20")), 2, Reason.COST_BUDGET_BLOCK),
    case("a budget exactly covering three replicas over the horizon lets three run",
         inputs(2, arrival_rps=rps(3), remaining=Decimal("0.30")), 3, Reason.SCALE_UP),
    case("a budget one cent short of three replicas holds at two",
         inputs(2, arrival_rps=rps(3), remaining=Decimal("0.29")), 2, Reason.COST_BUDGET_BLOCK),
    case("a request at zero replicas that cannot pay for one over the horizon waits",
         inputs(0, queue_depth={Priority.NORMAL: 5}, remaining=Decimal("0.09")),
         0, Reason.COST_BUDGET_BLOCK),
    case("money caps growth even when the maximum would have blocked it first",
         inputs(2, arrival_rps=rps(20), remaining=Decimal("0.50")), 5, Reason.COST_BUDGET_BLOCK),
    case("replicas that cost nothing are never capped by money",
         inputs(2, arrival_rps=rps(3), price_per_replica_s=Decimal(0), remaining=Decimal("0.01")),
         3, Reason.SCALE_UP),
    # runway
    case("a budget that pays for three of four replicas shrinks the endpoint to three",
         inputs(4, arrival_rps=rps(4), remaining=Decimal("0.30"), runway_s=75.0),
         3, Reason.RUNWAY_SHORT),
    case("a runway exactly at the horizon is not short",
         inputs(4, arrival_rps=rps(4), remaining=Decimal("0.40"), runway_s=100.0),
         4, Reason.HOLD),
    case("a runway half the horizon (other work burns too) halves the endpoint",
         inputs(4, arrival_rps=rps(4), runway_s=50.0), 2, Reason.RUNWAY_SHORT),
    case("a runway short of the horizon stops a scale-up from zero",
         inputs(0, queue_depth={Priority.NORMAL: 5}, runway_s=50.0),
         0, Reason.COST_BUDGET_BLOCK),
    case("money shrinks the endpoint inside a scale-down cooldown",
         inputs(4, arrival_rps=rps(4), remaining=Decimal("0.20"), runway_s=50.0,
                last_scale_up_at=NOW - 1), 2, Reason.RUNWAY_SHORT),
    case("less than one replica over the horizon takes the last replica away",
         inputs(1, arrival_rps=rps(1), remaining=Decimal("0.09"), runway_s=90.0),
         0, Reason.RUNWAY_SHORT),
    case("a warm pool above what the budget pays for shrinks too",
         inputs(3, policy=replace(POLICY, warm_pool=3), remaining=Decimal("0.15"),
                runway_s=50.0), 1, Reason.RUNWAY_SHORT),
    # exhaustion
    case("a zero budget takes every replica away",
         inputs(5, arrival_rps=rps(5), remaining=Decimal(0), runway_s=0.0),
         0, Reason.RUNWAY_EXHAUSTED),
    case("a budget overrun by other work (negative remaining) takes every replica away",
         inputs(5, arrival_rps=rps(5), remaining=Decimal("-0.01"), runway_s=0.0),
         0, Reason.RUNWAY_EXHAUSTED),
    case("a zero budget overrides the warm pool and min_replicas",
         inputs(2, policy=replace(POLICY, min_replicas=2, warm_pool=2), remaining=Decimal(0)),
         0, Reason.RUNWAY_EXHAUSTED),
    case("a zero budget keeps an idle endpoint at zero",
         inputs(0, queue_depth={Priority.HIGH: 3}, remaining=Decimal(0), runway_s=0.0),
         0, Reason.RUNWAY_EXHAUSTED),
]


@pytest.mark.parametrize("c", CASES)
def test_decide(c: Case) -> None:
    decision, _ = decide(c.inputs, c.state, c.now)
    assert (decision.target, decision.reason) == (c.want_target, c.want_reason)
    assert decision.current == c.inputs.current
    if c.inputs.remaining > 0 and decision.target > 0:
        assert decision.projected_cost <= c.inputs.remaining


def test_every_reason_has_a_case() -> None:
    covered = {p.values[0].want_reason for p in CASES}
    assert covered == set(Reason) - MIX_REASONS


def test_the_stable_window_averages_a_single_burst_away() -> None:
    """A minute of demand for 1.5 replicas, then one second of 3: no panic, no scale-up."""
    state = ScaleState()
    for t in range(60):
        _, state = decide(inputs(2, arrival_rps=rps(1.5)), state, float(t))
    decision, state = decide(inputs(2, arrival_rps=rps(3)), state, 60.0)
    assert (decision.target, decision.reason, decision.panic) == (2, Reason.HOLD, False)
    assert len(state.observations) == 60  # the window keeps 60 s of observations


def test_panic_enters_and_its_target_survives_the_burst() -> None:
    state = ScaleState()
    decision, state = decide(inputs(2, arrival_rps=rps(6)), state, 0.0)
    assert decision.panic and decision.target == 6 and state.panic_target == 6
    decision, state = decide(inputs(6, arrival_rps=rps(0)), state, 1.0)
    assert decision.panic and (decision.target, decision.reason) == (6, Reason.HOLD)


def test_the_clock_may_not_go_backwards() -> None:
    _, state = decide(inputs(), ScaleState(), 10.0)
    with pytest.raises(ValueError, match="backwards"):
        decide(inputs(), state, 9.0)


def test_same_inputs_same_decision() -> None:
    a = decide(inputs(3, arrival_rps=rps(5)), ScaleState(), NOW)
    b = decide(inputs(3, arrival_rps=rps(5)), ScaleState(), NOW)
    assert a == b


@pytest.mark.parametrize("bad", [
    pytest.param({"max_replicas": 1, "min_replicas": 2}, id="min above max"),
    pytest.param({"horizon_s": 0}, id="a zero horizon"),
    pytest.param({"panic_window_s": 90}, id="a panic window longer than the stable one"),
    pytest.param({"panic_threshold": 1.0}, id="a panic threshold of 100%"),
    pytest.param({"warm_pool": -1}, id="a negative warm pool"),
])
def test_policies_that_make_no_sense_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**bad)


def test_inputs_that_make_no_sense_are_refused() -> None:
    with pytest.raises(ValueError, match="ready"):
        inputs(1, ready=2)
    with pytest.raises(ValueError):
        inputs(1, queue_depth={Priority.LOW: -1})


@pytest.mark.parametrize(("remaining", "want"), [
    pytest.param("0.30", 3, id="exactly three replicas over the horizon"),
    pytest.param("0.299999999", 2, id="a billionth short of three"),
    pytest.param("1000", 8, id="far more than the maximum needs: the maximum"),
    pytest.param("0", 0, id="nothing left"),
])
def test_affordable_replicas(remaining: str, want: int) -> None:
    assert affordable_replicas(Decimal(remaining), PRICE, 100, 8) == want


money = st.decimals(min_value=Decimal("-5"), max_value=Decimal("50"), places=2,
                    allow_nan=False, allow_infinity=False)
prices = st.decimals(min_value=Decimal("0.000001"), max_value=Decimal("0.05"), places=6,
                     allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(remaining=money, price=prices, horizon=st.integers(1, 3600),
       current=st.integers(0, 30), ready_frac=st.floats(0, 1), max_r=st.integers(1, 30),
       warm=st.integers(0, 10), load=st.floats(0, 3000), queued=st.integers(0, 5000),
       runway=st.one_of(st.just(math.inf), st.floats(0, 10_000)),
       panic=st.booleans(), last_up=st.one_of(st.none(), st.floats(0, 100)))
def test_the_target_never_costs_more_over_the_horizon_than_remains(
        remaining: Decimal, price: Decimal, horizon: int, current: int, ready_frac: float,
        max_r: int, warm: int, load: float, queued: int, runway: float, panic: bool,
        last_up: float | None) -> None:
    policy = ScalePolicy(max_replicas=max_r, warm_pool=warm, horizon_s=horizon)
    state = ScaleState(panic_since=95.0, panic_target=max_r) if panic else ScaleState()
    ins = ScaleInputs(policy=policy, price_per_replica_s=price, remaining=remaining,
                      runway_s=runway, current=current, ready=int(current * ready_frac),
                      arrival_rps=load, queue_depth={Priority.NORMAL: queued},
                      last_scale_up_at=last_up)
    decision, _ = decide(ins, state, 100.0)
    if remaining <= 0:
        assert (decision.target, decision.reason) == (0, Reason.RUNWAY_EXHAUSTED)
    elif decision.target > 0:
        assert decision.target * price * horizon <= remaining
    assert decision.target >= 0
    assert decision.reason in set(Reason)
