"""kestrel_sdk.budget: one computation for every runway figure."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel_sdk.budget import Hold, budget, remaining, spent, unspent

D = Decimal


def test_a_fully_reserved_budget_has_nothing_free_but_its_money_still_lasts() -> None:
    # Issue 10 item 8: 10 credits, all reserved by one covered job burning 0.05/s.
    b = budget(D("10"), D("0"), D("10"), D("0.05"))
    assert (b.remaining, b.free_to_reserve, b.runway_s) == (D(0), D(0), 0.0)
    assert b.unspent == D("10") and b.money_runway_s == 200.0  # 3m20s, not "0.0s"
    assert not b.unlimited


def test_holds_count_only_what_they_have_not_consumed() -> None:
    holds = [Hold(D("1")),                                    # not started: all of it
             Hold(D("1"), consumed=D("0.1")),                 # 0.9 left
             Hold(D("0.05"), consumed=D("0.1")),              # overran: nothing
             Hold(D("1"), consumed=D("0.3"), closed=True)]    # closed: charged instead
    b = budget(D("100"), D("0.5"), holds, D("0.002"))
    assert b.reserved == D("1.9") and b.remaining == D("97.6")
    assert b.money_runway_s == float(D("99.5") / D("0.002"))


def test_nothing_burning_is_unlimited_either_way() -> None:
    b = budget(D("10"), D("2"), D("3"), D("0"))
    assert b.unlimited and math.isinf(b.runway_s) and math.isinf(b.money_runway_s)
    assert b.free_to_reserve == D("5")


def test_spent_money_lasts_zero_and_nothing_is_free() -> None:
    b = budget(D("10"), D("12.5"), D("1"), D("0.25"))
    assert (b.unspent, b.remaining, b.free_to_reserve) == (D("-2.5"), D("-3.5"), D(0))
    assert (b.runway_s, b.money_runway_s, b.remaining_bp) == (0.0, 0.0, 0)


def test_money_stays_decimal() -> None:
    b = budget(D("0.1"), D("0.000000001"), D("0.02"), D("0.003"))
    for value in (b.unspent, b.remaining, b.free_to_reserve, b.reserved):
        assert isinstance(value, Decimal)
    assert b.remaining == D("0.079999999")


money = st.decimals(min_value=0, max_value=10_000, places=9, allow_nan=False,
                    allow_infinity=False)


@given(credits=money, charged=money, reserved=money, burn=money)
def test_money_lasts_at_least_as_long_as_the_unreserved_part(
        credits: Decimal, charged: Decimal, reserved: Decimal, burn: Decimal) -> None:
    b = budget(credits, charged, reserved, burn)
    assert b.remaining == credits - charged - reserved == b.unspent - b.reserved
    assert b.free_to_reserve == max(D(0), b.remaining)
    assert b.money_runway_s >= b.runway_s
    assert 0 <= b.remaining_bp <= 10_000
    if burn > 0 and b.remaining > 0:
        assert b.runway_s == pytest.approx(float(b.remaining / burn))


money = st.decimals(min_value=-10**6, max_value=10**6, places=9, allow_nan=False,
                    allow_infinity=False)


@given(money, money, money)
def test_the_single_figures_other_services_read_are_the_budgets_own(
        credits: Decimal, charged: Decimal, reserved: Decimal) -> None:
    """The runway check's `spent`, the gateway's and the autoscaler's `unspent`, and
    admission's `remaining` are the same figures budget() reports."""
    b = budget(credits, charged, reserved, Decimal(1))
    assert unspent(credits, charged) == b.unspent
    assert remaining(credits, charged, reserved) == b.remaining
    assert spent(credits, charged) is (b.unspent <= 0)
    assert spent(credits, charged) is (b.money_runway_s == 0)
