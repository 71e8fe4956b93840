"""Admission's decisions without I/O, as sentence-named tables."""

from __future__ import annotations

from decimal import Decimal

import pytest

from services.admission.domain import (
    Budget,
    JobAsk,
    Policy,
    Reservation,
    Ruling,
    decide,
    price_job,
    releasable,
)

PRICES = {"gpu-h100": Decimal("0.01"), "gpu-a10": Decimal("0.001")}
POLICY = Policy("acme", {"gpu-h100": 8, "gpu-a10": 8}, suspended=False)


def job(gpus: int = 1, seconds: int = 100, flavor: str = "gpu-h100", priority: int = 0,
        seq: int = 0, jid: str = "j") -> JobAsk:
    return JobAsk(jid, "acme", gpus, flavor, seconds, priority, seq)


def budget(credits: str, charged: str = "0", pending: str = "0",
           started: tuple[Reservation, ...] = ()) -> Budget:
    return Budget(Decimal(credits), Decimal(charged), Decimal(pending), started)


@pytest.mark.parametrize(("name", "ask", "policy", "b", "queue_ahead", "want", "reserved"), [
    ("a job that fits is admitted with gpus x seconds x price reserved",
     job(2, 100), POLICY, budget("10"), False, Ruling.ADMITTED, "2"),
    ("a job that exactly fits is admitted", job(1, 100), POLICY, budget("1"), False,
     Ruling.ADMITTED, "1"),
    ("a job that fits the budget but not what remains is held", job(1, 100), POLICY,
     budget("10", charged="9.5"), False, Ruling.HELD, "1"),
    ("untouched reservations count in full against what remains", job(1, 100), POLICY,
     budget("10", pending="9.5"), False, Ruling.HELD, "1"),
    ("a started reservation holds only what it has not consumed", job(1, 100), POLICY,
     budget("10", charged="4", started=(Reservation("x", Decimal("8"), Decimal("4")),)), False,
     Ruling.ADMITTED, "1"),
    ("a reservation the ledger has wholly consumed holds nothing", job(1, 100), POLICY,
     budget("10", charged="9", started=(Reservation("x", Decimal("9"), Decimal("9")),)),
     False, Ruling.ADMITTED, "1"),
    ("a job beyond the whole budget is rejected", job(1, 1000), POLICY, budget("5"), False,
     Ruling.REJECTED, "10"),
    ("a job beyond the flavor quota is rejected", job(9, 10), POLICY, budget("100"), False,
     Ruling.REJECTED, "0"),
    ("a job of a suspended tenant is rejected", job(), Policy("acme", {"gpu-h100": 8}, True),
     budget("100"), False, Ruling.REJECTED, "0"),
    ("a newcomer waits behind held jobs of equal or higher priority", job(), POLICY,
     budget("100"), True, Ruling.HELD, "1"),
    ("without a preference the dearest flavor with quota is priced", job(1, 100, flavor=""),
     POLICY, budget("100"), False, Ruling.ADMITTED, "1"),
    ("without a preference only flavors with enough quota are priced",
     job(4, 100, flavor=""), Policy("acme", {"gpu-h100": 2, "gpu-a10": 8}, False),
     budget("100"), False, Ruling.ADMITTED, "0.4"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_decide(name: str, ask: JobAsk, policy: Policy, b: Budget, queue_ahead: bool,
                want: Ruling, reserved: str) -> None:
    d = decide(ask, policy, b, PRICES, 8, queue_ahead)
    assert d.verdict is want, d.reason
    assert d.reserved == Decimal(reserved)
    assert d.reason


def test_a_job_larger_than_any_node_can_never_run() -> None:
    assert isinstance(price_job(job(gpus=16), POLICY, PRICES, 8), str)


def test_held_jobs_are_released_by_priority_then_first_come_and_stop_at_the_first_misfit() -> (
        None):
    held = [job(jid="low-early", seq=1, seconds=300), job(jid="high", priority=5, seq=3),
            job(jid="low-late", seq=2, seconds=100)]
    out = releasable(held, POLICY, budget("4"), PRICES, 8)
    # high (1) fits, low-early (3) fits exactly, low-late (1) does not: 4 credits in all.
    assert [(j.job_id, d.verdict) for j, d in out] == [("high", Ruling.ADMITTED),
                                                      ("low-early", Ruling.ADMITTED)]


def test_a_big_job_at_the_head_is_not_overtaken_by_smaller_ones() -> None:
    held = [job(jid="big", seq=1, seconds=500), job(jid="small", seq=2, seconds=10)]
    assert releasable(held, POLICY, budget("10", pending="6"), PRICES, 8) == []


def test_a_held_job_that_became_impossible_is_rejected_on_release() -> None:
    out = releasable([job(jid="huge", seconds=5000)], POLICY, budget("10"), PRICES, 8)
    assert [(j.job_id, d.verdict) for j, d in out] == [("huge", Ruling.REJECTED)]
