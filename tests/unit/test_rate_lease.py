"""services.gateway.ratelimit.Lease: what a gateway replica asks Redis for and what it
spends locally (no I/O; the Redis side is in tests/integration/test_rate_limit.py)."""

from __future__ import annotations

import pytest

from services.gateway.ratelimit import LEASE_S, Lease


def demand(n: int, at: float = 10.0) -> Lease:
    """A lease that saw `n` calls within the last LEASE_S, the last at `at`."""
    lease = Lease()
    for i in range(n):
        lease.called(at - LEASE_S / 2 + i * (LEASE_S / 2) / max(n, 1))
    return lease


@pytest.mark.parametrize(("calls", "rate", "burst", "want"), [
    # A tenant's first call asks for itself alone: no history, nothing leased ahead.
    (1, 1000.0, 1000, 1),
    # A busy tenant's call asks ahead for as many as arrived in the last LEASE_S...
    (6, 1000.0, 1000, 6),
    # ...at most LEASE_S of its rate...
    (50, 100.0, 1000, 11),
    # ...and at most an eighth of its burst.
    (50, 1000.0, 40, 6),
    # A slow tenant (under 10/s) never leases ahead: each call is one Redis call.
    (50, 5.0, 100, 1),
])
def test_a_call_asks_for_itself_and_the_demand_of_the_last_lease_period(
        calls: int, rate: float, burst: int, want: int) -> None:
    assert demand(calls).want(1, rate, burst) == want


def test_calls_older_than_the_lease_period_are_not_demand() -> None:
    lease = Lease()
    for t in (1.0, 1.01, 1.02):
        lease.called(t)
    lease.called(1.0 + LEASE_S + 0.05)  # the first three are out of the window
    assert lease.want(1, 1000.0, 1000) == 1


def test_leased_tokens_are_spent_here_until_they_run_out() -> None:
    lease = Lease()
    lease.leased(taken=4, cost=1, now=5.0)  # the asking call spent one
    assert [lease.spend(1, 5.01) for _ in range(4)] == [True, True, True, False]


def test_leased_tokens_expire_after_the_lease_period() -> None:
    lease = Lease()
    lease.leased(taken=4, cost=1, now=5.0)
    assert lease.spend(1, 5.0 + LEASE_S / 2)
    assert not lease.spend(1, 5.0 + LEASE_S)
    assert lease.tokens == 0  # dropped, not kept for later


def test_a_call_costing_more_than_is_held_spends_nothing() -> None:
    lease = Lease()
    lease.leased(taken=3, cost=1, now=5.0)
    assert not lease.spend(3, 5.01)
    assert lease.spend(2, 5.01)
