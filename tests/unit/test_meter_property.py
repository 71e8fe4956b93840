"""Property: whatever the order of events and ticks, every allocation's rows sum
exactly to gpus x (end - start), and its cost to that times its price."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_sdk.money import row_cost
from services.meter.domain import Allocation, AllocStatus, Event, EventType, Row, apply_events
from services.meter.domain import tick as cut

T0 = 1_700_000_000_000_000
PRICES = {"gpu-h100": Decimal("0.001"), "gpu-a10": Decimal("0.000300001")}


@dataclass(frozen=True)
class Spec:
    wid: str
    gpus: int
    flavor: str
    start: int
    end: int
    close: EventType
    bound_s: int  # 0: unbounded


specs = st.builds(
    lambda i, gpus, flavor, start, length, close, bound: Spec(
        f"w{i}", gpus, flavor, T0 + start, T0 + start + length, close, bound),
    st.integers(0, 10_000), st.integers(1, 8), st.sampled_from(sorted(PRICES)),
    st.integers(0, 10_000_000), st.integers(0, 10_000_000),
    st.sampled_from([EventType.FINISHED, EventType.EVICTED, EventType.FAILED]),
    st.sampled_from([0, 1, 3, 8, 20]))


def events_of(s: Spec) -> list[Event]:
    return [Event(f"{s.wid}-a", "acme", s.wid, 1, EventType.ADMITTED, s.start, s.flavor, s.gpus,
                  s.bound_s),
            Event(f"{s.wid}-s", "acme", s.wid, 1, EventType.STARTED, s.start + 1, s.flavor,
                  s.gpus),
            Event(f"{s.wid}-c", "acme", s.wid, 1, s.close, s.end, s.flavor, s.gpus)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Spec], list[object]]:
    allocs = draw(st.lists(specs, min_size=1, max_size=12, unique_by=lambda s: s.wid))
    evs: list[object] = [e for s in allocs for e in events_of(s)]
    evs = draw(st.permutations(evs))
    # Interleave ticks at increasing cut instants anywhere in the stream.
    n_ticks = draw(st.integers(0, 12))
    tick_step = draw(st.integers(1, 3_000_000))
    ticks = [("tick", T0 + (k + 1) * tick_step) for k in range(n_ticks)]
    positions = sorted(draw(st.lists(st.integers(0, len(evs)), min_size=n_ticks,
                                     max_size=n_ticks)))
    for offset, (pos, t) in enumerate(zip(positions, ticks, strict=True)):
        evs.insert(pos + offset, t)
    # Redeliver a few events: the store drops known ids before the domain sees them.
    dupes = draw(st.lists(st.sampled_from([e for e in evs if isinstance(e, Event)]),
                          max_size=5))
    return allocs, evs + dupes


def run(stream: list[object]) -> tuple[dict[str, Allocation], list[Row]]:
    state: dict[str, Allocation] = {}
    rows: list[Row] = []
    seen: set[str] = set()
    for item in stream:
        if isinstance(item, Event):
            if item.event_id in seen:
                continue
            seen.add(item.event_id)
            out = apply_events(state, [item], PRICES)
        else:
            assert isinstance(item, tuple)
            cut_to: int = item[1]
            out = cut([a for a in state.values() if a.status is AllocStatus.OPEN], cut_to,
                      f"tick-{cut_to}")
        state.update(out.allocations)
        rows += out.rows
    return state, rows


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_rows_of_every_allocation_sum_exactly_to_gpus_times_elapsed_within_its_bound(
        scenario: tuple[list[Spec], list[object]]) -> None:
    allocs, stream = scenario
    state, rows = run(stream)
    assert len({r.cause_id for r in rows}) == len(rows), "a cause wrote two rows"
    for s in allocs:
        a = state[s.wid]
        assert a.status is AllocStatus.CLOSED
        end = max(s.end, s.start)
        if s.bound_s:  # never metered past start + bound
            end = min(end, s.start + s.bound_s * 1_000_000)
        mine = [r for r in rows if r.workload_id == s.wid]
        assert sum(r.gpu_us for r in mine) == s.gpus * (end - s.start)
        cost = sum((r.cost for r in mine), Decimal(0))
        assert cost == row_cost(s.gpus * (end - s.start), PRICES[s.flavor])
        assert cost == sum((r.gpu_us * r.price / 1_000_000 for r in mine), Decimal(0))
