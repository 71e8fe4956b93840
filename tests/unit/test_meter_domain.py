"""The meter's decisions without I/O: table tests named as sentences, and properties."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from decimal import Decimal

import pytest

from services.meter.domain import (
    Allocation,
    AllocStatus,
    Band,
    Event,
    EventType,
    HoldBook,
    OpenHold,
    Reason,
    RowKind,
    RunwayFigures,
    apply_events,
    band,
    publish_reason,
    tick,
)

H100 = Decimal("0.001")
PRICES = {"gpu-h100": H100, "gpu-a10": Decimal("0.0003")}
T0 = 1_700_000_000_000_000


def ev(eid: str, typ: EventType, t: int, wid: str = "w1", gpus: int = 2,
       flavor: str = "gpu-h100", bound_s: int = 0) -> Event:
    return Event(eid, "acme", wid, 1, typ, T0 + t, flavor, gpus, bound_s)


def open_alloc(metered: int, start: int = 0, gpus: int = 2) -> Allocation:
    return Allocation("w1", "acme", 1, "gpu-h100", gpus, H100, AllocStatus.OPEN, T0 + start,
                      T0 + metered, None)


@dataclass
class Case:
    name: str
    current: dict[str, Allocation]
    events: list[Event]
    want_status: AllocStatus | None
    want_rows: list[tuple[int, int, RowKind]] = field(default_factory=list)


CASES = [
    Case("an admission opens an allocation and writes no row yet", {},
         [ev("a", EventType.ADMITTED, 0)], AllocStatus.OPEN),
    Case("a finish after admission writes one row from start to end", {},
         [ev("a", EventType.ADMITTED, 0), ev("f", EventType.FINISHED, 5_000_000)],
         AllocStatus.CLOSED, [(0, 5_000_000, RowKind.USAGE)]),
    Case("a finish after two ticks writes only the unmetered rest",
         {"w1": open_alloc(metered=2_000_000)}, [ev("f", EventType.FINISHED, 3_500_000)],
         AllocStatus.CLOSED, [(2_000_000, 3_500_000, RowKind.USAGE)]),
    Case("a finish stamped before the last tick reverses exactly the excess",
         {"w1": open_alloc(metered=3_000_000)}, [ev("f", EventType.FINISHED, 2_250_000)],
         AllocStatus.CLOSED, [(2_250_000, 3_000_000, RowKind.REVERSAL)]),
    Case("a finish before the admission is held until the admission arrives", {},
         [ev("f", EventType.FINISHED, 4_000_000)], AllocStatus.PENDING),
    Case("a finish then its admission settle in one row", {},
         [ev("f", EventType.FINISHED, 4_000_000), ev("a", EventType.ADMITTED, 1_000_000)],
         AllocStatus.CLOSED, [(1_000_000, 4_000_000, RowKind.USAGE)]),
    Case("a second close under another id is ignored: the first close wins", {},
         [ev("a", EventType.ADMITTED, 0), ev("f1", EventType.FINISHED, 1_000_000),
          ev("f2", EventType.EVICTED, 9_000_000)],
         AllocStatus.CLOSED, [(0, 1_000_000, RowKind.USAGE)]),
    Case("an eviction closes like a finish, at the eviction instant", {},
         [ev("a", EventType.ADMITTED, 0), ev("e", EventType.EVICTED, 700_000)],
         AllocStatus.CLOSED, [(0, 700_000, RowKind.USAGE)]),
    Case("a cancel closes like a finish, at the cancel instant", {},
         [ev("a", EventType.ADMITTED, 0), ev("c", EventType.CANCELLED, 1_300_000)],
         AllocStatus.CLOSED, [(0, 1_300_000, RowKind.USAGE)]),
    Case("a queued event is informational and meters nothing", {},
         [ev("q", EventType.QUEUED, 0), ev("a", EventType.ADMITTED, 10)], AllocStatus.OPEN),
    Case("a start event is informational and meters nothing", {},
         [ev("a", EventType.ADMITTED, 0), ev("s", EventType.STARTED, 100)], AllocStatus.OPEN),
    Case("a second admission under another id does not restart the clock",
         {"w1": open_alloc(metered=1_000_000)}, [ev("a2", EventType.ADMITTED, 5_000_000)],
         AllocStatus.OPEN),
    Case("a finish past the workload's bound is metered only up to the bound", {},
         [ev("a", EventType.ADMITTED, 0, bound_s=3), ev("f", EventType.FINISHED, 5_000_000)],
         AllocStatus.CLOSED, [(0, 3_000_000, RowKind.USAGE)]),
    Case("a finish before its start, past the bound, settles at the bound", {},
         [ev("f", EventType.FINISHED, 9_000_000), ev("a", EventType.ADMITTED, 1_000_000,
                                                    bound_s=2)],
         AllocStatus.CLOSED, [(1_000_000, 3_000_000, RowKind.USAGE)]),
    Case("a finish at the admission instant closes with no row", {},
         [ev("a", EventType.ADMITTED, 10), ev("f", EventType.FINISHED, 10)],
         AllocStatus.CLOSED),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_apply_events(case: Case) -> None:
    out = apply_events(case.current, case.events, PRICES)
    state = out.allocations.get("w1") or case.current.get("w1")
    assert (state.status if state else None) == case.want_status
    got = [(r.start_us - T0, r.end_us - T0, r.kind) for r in out.rows]
    assert got == case.want_rows


def test_a_reversal_row_has_negative_gpu_time_and_cost() -> None:
    out = apply_events({"w1": open_alloc(metered=3_000_000)},
                       [ev("f", EventType.FINISHED, 2_000_000)], PRICES)
    (row,) = out.rows
    assert row.gpu_us == -2 * 1_000_000
    assert row.cost == Decimal("-0.002")


def test_the_price_is_fixed_when_the_allocation_opens() -> None:
    opened = apply_events({}, [ev("a", EventType.ADMITTED, 0)], PRICES).allocations["w1"]
    closed = apply_events({"w1": opened}, [ev("f", EventType.FINISHED, 1_000_000)],
                          {"gpu-h100": Decimal("9")})
    assert closed.rows[0].price == H100


def test_a_tick_cuts_each_open_allocation_up_to_the_cut_instant() -> None:
    out = tick([open_alloc(metered=1_000_000)], T0 + 2_000_000, "tick-x")
    (row,) = out.rows
    assert (row.start_us - T0, row.end_us - T0, row.cause_id) == (1_000_000, 2_000_000,
                                                                  "tick-x/w1")
    assert out.allocations["w1"].metered_until_us == T0 + 2_000_000


def test_a_tick_before_the_metered_instant_writes_nothing() -> None:
    assert tick([open_alloc(metered=5_000_000)], T0 + 4_000_000, "t").rows == []


def fig(credits: str, charged: str, reserved: str = "0", burn: str = "0") -> RunwayFigures:
    return RunwayFigures("acme", Decimal(credits), Decimal(charged), Decimal(reserved),
                         Decimal(burn), 0, T0, 0)


@pytest.mark.parametrize(("name", "prev", "new", "hint", "want"), [
    ("the first figure of a tenant is always published", None, fig("100", "0"), None,
     Reason.STARTUP),
    ("a top-up is always published", fig("100", "10"), fig("200", "10"), Reason.TOP_UP,
     Reason.TOP_UP),
    ("a tick moving remaining by less than 1% of credits is not published",
     fig("100", "10"), fig("100", "10.5"), Reason.TICK, None),
    ("a tick moving remaining by 1% of credits is published", fig("100", "10"),
     fig("100", "11"), Reason.TICK, Reason.TICK),
    ("crossing below half the budget is published even if tiny", fig("100", "49.99"),
     fig("100", "50.01"), Reason.TICK, Reason.THRESHOLD_50),
    ("crossing below 10% is published", fig("100", "89.99"), fig("100", "90.01"), None,
     Reason.THRESHOLD_10),
    ("reaching zero is published as exhaustion", fig("100", "99.99"), fig("100", "100"), None,
     Reason.EXHAUSTED),
    ("reservations count against the thresholds", fig("100", "0"), fig("100", "0", "95"),
     Reason.RESERVATION, Reason.THRESHOLD_10),
    ("an opened allocation is published though remaining did not move", fig("100", "1"),
     fig("100", "1", burn="0.01"), Reason.ALLOCATION_OPENED, Reason.ALLOCATION_OPENED),
], ids=lambda x: x if isinstance(x, str) else "")
def test_publish_reason(name: str, prev: RunwayFigures | None, new: RunwayFigures,
                        hint: Reason | None, want: Reason | None) -> None:
    assert publish_reason(prev, new, hint) == want


def test_runway_is_remaining_over_burn_and_unlimited_at_zero_burn() -> None:
    assert fig("100", "40", "10", burn="2").runway_s == 25.0
    assert fig("100", "40").unlimited
    assert fig("100", "120", burn="1").runway_s == 0.0
    assert band(fig("100", "120")) is Band.EXHAUSTED


def test_ticks_stop_at_the_bound_and_it_burns_nothing_past_it() -> None:
    from services.meter.domain import burn_per_s

    opened = apply_events({}, [ev("a", EventType.ADMITTED, 0, bound_s=2)], PRICES)
    a = opened.allocations["w1"]
    first = tick([a], T0 + 5_000_000, "t1")
    assert [(r.start_us - T0, r.end_us - T0) for r in first.rows] == [(0, 2_000_000)]
    done = first.allocations["w1"]
    assert tick([done], T0 + 9_000_000, "t2").rows == []
    assert burn_per_s([a])[1] == 2 and burn_per_s([done])[1] == 0


CONSUMED = {"w2": Decimal("0.1"), "w3": Decimal("0.1"), "w6": Decimal("5")}


def hold(wid: str, amount: str, rolling: bool = False, tenant: str = "acme") -> OpenHold:
    return OpenHold(tenant, wid, Decimal(amount), rolling)


@pytest.mark.parametrize(("holds", "want"), [
    ([hold("w1", "1")], "1"),                               # not metered yet
    ([hold("w2", "1")], "0.9"),                             # 0.1 consumed: holds the rest
    ([hold("w3", "0.05")], "0"),                            # consumed past it: never below 0
    ([hold("w6", "2", rolling=True)], "2"),                 # rolling: all of it while it runs
    ([hold("w1", "1"), hold("w2", "1"), hold("w3", "0.05")], "1.9"),  # summed per tenant
    ([hold("w2", "1"), hold("w2", "0.5")], "1.3"),          # two holds on one workload
    ([hold("w1", "1"), hold("x1", "7", tenant="other")], "1"),  # another tenant's
], ids=["not-metered-holds-it-all", "running-holds-the-rest", "never-below-zero",
        "rolling-holds-it-all", "summed-per-tenant", "each-hold-on-its-own",
        "tenants-apart"])
def test_reserved_is_what_open_holds_have_not_consumed(holds: list[OpenHold], want: str) -> None:
    book = HoldBook()
    book.replace_tenants({"acme", "other"}, holds)
    assert book.reserved("acme", CONSUMED) == Decimal(want)


def test_the_hold_book_follows_holds_read_again_and_allocations_closed() -> None:
    """A tenant read whole, then workloads read again one by one (a new hold, a released
    one), then an allocation closed by the meter: each figure is what reading all of
    the tenant's holds again would give."""
    book = HoldBook()
    book.replace_tenants({"acme", "other"}, [hold("w1", "1"), hold("w2", "1"),
                                             hold("x1", "7", tenant="other")])
    assert book.reserved("acme", CONSUMED) == Decimal("1.9")
    # w4 was admitted (a new hold) and w1 finished (released): both read again.
    assert book.replace_workloads(["w4", "w1"], [hold("w4", "0.25")]) == {"acme"}
    assert book.reserved("acme", CONSUMED) == Decimal("1.15")
    # w2's allocation closed: its cost is charged, the hold holds nothing.
    assert book.closed("w2") == {"acme"}
    assert book.reserved("acme", CONSUMED) == Decimal("0.25")
    assert book.closed("w2") == set()  # twice is once
    # A tenant read whole again replaces what was known of it, and only of it.
    book.replace_tenants({"acme"}, [hold("w5", "3")])
    assert book.reserved("acme", CONSUMED) == Decimal("3")
    assert book.reserved("other", CONSUMED) == Decimal("7")
    assert book.tenants() == {"acme", "other"}
    book.replace_tenants({"other"}, [])
    assert book.reserved("other", CONSUMED) == Decimal("0") and book.tenants() == {"acme"}


def test_the_hold_book_agrees_with_summing_every_hold_after_any_mix_of_changes() -> None:
    """Random holds come, go, and close, over three tenants and shared workloads:
    after each change the kept figure equals the sum over every hold it holds."""
    rng = random.Random(11)
    book = HoldBook()
    truth: dict[str, list[OpenHold]] = {}  # workload -> its open holds
    tenants = ["a", "b", "c"]
    consumed = {f"w{i}": Decimal(rng.randint(0, 300)) / 100 for i in range(0, 30, 3)}
    for _ in range(400):
        wid = f"w{rng.randrange(30)}"
        roll = rng.random()
        if roll < 0.5:  # admission wrote a hold: the workload is read again
            truth.setdefault(wid, []).append(OpenHold(rng.choice(tenants), wid,
                                                  Decimal(rng.randint(1, 400)) / 100,
                                                  rng.random() < 0.2))
            book.replace_workloads([wid], truth[wid])
        elif roll < 0.75:  # released
            truth.pop(wid, None)
            book.replace_workloads([wid], [])
        elif roll < 0.9:  # its allocation closed
            truth.pop(wid, None)
            book.closed(wid)
        else:  # a tenant read whole
            t = rng.choice(tenants)
            book.replace_tenants([t], [h for hs in truth.values() for h in hs if h.tenant == t])
        for t in tenants:
            want = sum((h.amount if h.rolling else
                        max(Decimal(0), h.amount - consumed.get(h.workload_id, Decimal(0)))
                        for hs in truth.values() for h in hs if h.tenant == t), Decimal(0))
            mine = {w: c for w, c in consumed.items()
                    if any(h.tenant == t for h in truth.get(w, ()))}
            assert book.reserved(t, mine) == want
            theirs = [h for hs in truth.values() for h in hs if h.tenant == t]
            assert book.summary(t) == (len(theirs), sum((h.amount for h in theirs),
                                                        Decimal(0)))
