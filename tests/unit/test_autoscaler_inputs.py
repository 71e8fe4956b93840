"""What the live loop feeds the decision (services/autoscaler/inputs.py)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from kestrel.endpoints import Priority
from kestrel_sdk.v1 import common_pb2, worker_pb2
from services.autoscaler.inputs import (
    StreamReading,
    Windows,
    arrival_rps,
    budget_for,
    inputs_for,
    measured_rps,
    mix_inputs_for,
    parse_flavor_rates,
    policy_of,
    replica_price,
    worst_p95,
)

PRICES = {"gpu-h100": Decimal("0.01"), "gpu-a10": Decimal("0.001"), "cpu": Decimal("0.0005")}


def runway(credits: str = "10", charged: str = "0", free: str = "9.4", burn: str = "0.0005",
           unlimited: bool = False) -> common_pb2.Runway:
    return common_pb2.Runway(tenant="acme", credits=credits, charged=charged,
                             free_to_reserve=free, burn_per_s=burn, unlimited=unlimited)


@pytest.mark.parametrize(("name", "r", "own", "want"), [
    ("the endpoint's own holds are added back to what is free",
     runway(), 2, (Decimal("10.0"), 10 / 0.0005)),
    ("nothing burns: the runway is unlimited", runway(burn="0", unlimited=True), 0,
     (Decimal("9.4"), math.inf)),
    ("spent money: nothing remains and no runway, whatever is held",
     runway(credits="5", charged="5", free="0"), 2, (Decimal(0), 0.0)),
    ("no runway message yet: no budget", None, 1, (Decimal(0), 0.0)),
])
def test_budget_for(name: str, r: common_pb2.Runway | None, own: int,
                    want: tuple[Decimal, float]) -> None:
    # each replica holds 1 core x 600 s x 0.0005 = 0.3
    remaining, seconds = budget_for(r, own, Decimal("0.0005"), 600)
    assert remaining == want[0], name
    assert seconds == pytest.approx(want[1]), name


def test_a_replica_costs_its_units_at_its_flavors_price() -> None:
    cpu = common_pb2.EndpointSpec(flavor="cpu", gpus_per_replica=4)
    assert replica_price(cpu, PRICES) == Decimal("0.0005")  # one core whatever gpus says
    a10 = common_pb2.EndpointSpec(flavor="gpu-a10", gpus_per_replica=2)
    assert replica_price(a10, PRICES) == Decimal("0.002")
    # No flavor: admission picks by runway, so the dearest GPU flavor bounds it.
    assert replica_price(common_pb2.EndpointSpec(), PRICES) == Decimal("0.01")


def test_arrivals_are_entries_added_since_the_last_reading() -> None:
    before = {p: StreamReading(0, 0, 10) for p in Priority}
    now = {Priority.HIGH: StreamReading(0, 0, 30), Priority.NORMAL: StreamReading(0, 0, 10),
           Priority.LOW: StreamReading(0, 0, 20)}
    assert arrival_rps(before, now, 2.0) == 15.0
    assert arrival_rps(None, now, 2.0) == 0.0  # the first reading has no rate


def test_the_spec_sets_the_policy_where_it_says_something() -> None:
    spec = common_pb2.EndpointSpec(min_replicas=1, max_replicas=3, warm_pool=2, cooldown_s=7,
                                   reservation_horizon_s=120, target_queue_depth=4)
    p = policy_of(spec, Windows(stable_window_s=10, panic_window_s=2))
    assert (p.min_replicas, p.max_replicas, p.warm_pool, p.horizon_s) == (1, 3, 2, 120)
    assert (p.scale_down_cooldown_s, p.target_queue_depth, p.stable_window_s) == (7, 4, 10)
    default = policy_of(common_pb2.EndpointSpec(max_replicas=1), Windows())
    assert default.horizon_s == 600 and default.scale_down_cooldown_s == 30


def test_queued_is_what_no_replica_holds_yet_and_pending_is_in_flight() -> None:
    e = common_pb2.Endpoint(endpoint_id="ep-0123456789abcdef", tenant="acme", replicas=2,
                            ready_replicas=1,
                            spec=common_pb2.EndpointSpec(flavor="cpu", max_replicas=2))
    streams = {Priority.HIGH: StreamReading(5, 2, 50), Priority.NORMAL: StreamReading(3, 3, 9),
               Priority.LOW: StreamReading(0, 0, 0)}
    i = inputs_for(e, streams, 4.0, 120.0, runway(), PRICES, Windows(), None, None)
    assert i.queue_depth == {Priority.HIGH: 3, Priority.NORMAL: 0, Priority.LOW: 0}
    assert i.in_flight == 5 and (i.current, i.ready, i.pending) == (2, 1, 1)
    assert i.remaining == Decimal("9.4") + 2 * Decimal("0.3")


# --- endpoints on several flavors ------------------------------------------------

def mixed(**kw: object) -> common_pb2.Endpoint:
    spec = common_pb2.EndpointSpec(flavor="cpu", flavors=["gpu-a10"], max_replicas=4,
                                   reservation_horizon_s=100, target_queue_depth=10,
                                   gpus_per_replica=1, missed_slo_value_per_s="0.02")
    return common_pb2.Endpoint(endpoint_id="ep-0123456789abcdef", tenant="acme", spec=spec,
                               **kw)  # type: ignore[arg-type]


def test_an_endpoint_on_several_flavors_prices_each_flavor_and_counts_its_replicas() -> None:
    e = mixed(replicas=3, ready_replicas=2, flavor_replicas={"cpu": 2, "gpu-a10": 1},
              flavor_ready={"cpu": 2})
    w = Windows(replica_rps=2.0, flavor_rates=parse_flavor_rates("gpu-a10=6:20:15"))
    i = mix_inputs_for(e, {}, 3.0, 90.0, runway(), PRICES, w, None, None)
    by = {f.name: f for f in i.policy.flavors}
    assert (by["cpu"].price_per_replica_s, by["gpu-a10"].price_per_replica_s) == (
        Decimal("0.0005"), Decimal("0.001"))
    assert (by["cpu"].replica_rps, by["cpu"].simulated) == (2.0, False)
    assert (by["gpu-a10"].replica_rps, by["gpu-a10"].simulated) == (6.0, True)
    assert dict(i.current) == {"cpu": 2, "gpu-a10": 1} and dict(i.ready) == {"cpu": 2}
    # the windows count in replicas of the smallest flavor; the endpoint's holds come back
    assert i.policy.scale.replica_rps == 2.0
    assert i.policy.missed_slo_value_per_s == Decimal("0.02")
    assert i.remaining == Decimal("9.4") + (2 * Decimal("0.0005") + Decimal("0.001")) * 100


def test_a_gateway_that_counts_no_flavors_leaves_the_replicas_on_the_endpoints_own() -> None:
    i = mix_inputs_for(mixed(replicas=2, ready_replicas=1), {}, 0.0, None, runway(), PRICES,
                       Windows(), None, None)
    assert dict(i.current) == {"cpu": 2}


@pytest.mark.parametrize(("text", "match"), [
    ("gpu-a10=6:20", "want flavor=rps:p95_ms:cold_start_s"),
    ("gpu-a10=0:20:15", "must be positive"),
    ("gpu-a10=x:20:15", "want flavor"),
])
def test_flavor_rates_that_cannot_be_read_are_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_flavor_rates(text)


def test_unconfigured_flavors_get_the_documented_defaults() -> None:
    w = Windows(replica_rps=30.0)
    assert w.rate_of("cpu").replica_rps == 30.0 and not w.rate_of("cpu").simulated
    assert w.rate_of("gpu-h100").simulated and w.rate_of("gpu-h100").replica_rps == 2700.0


def beat(served: int, busy_s: float, simulated: bool = False,
         p95: float = 50.0) -> worker_pb2.WorkerHeartbeat:
    return worker_pb2.WorkerHeartbeat(served=served, busy_s=busy_s, simulated=simulated,
                                      p95_ms=p95)


@pytest.mark.parametrize(("name", "beats", "want"), [
    ("the CPU pool's replicas: requests per model second, at target utilisation",
     [beat(100, 2.0), beat(60, 2.0)], 0.75 * 160 / 4.0),
    ("stand-ins for simulated GPUs do not count", [beat(100, 4.0), beat(10_000, 1.0, True)],
     0.75 * 100 / 4.0),
    ("too few model seconds yet: no figure", [beat(10, 0.5)], None),
    ("no replica served", [], None),
], ids=lambda x: x if isinstance(x, str) else "")
def test_the_cpu_pools_rate_is_measured_from_its_heartbeats(
        name: str, beats: list[worker_pb2.WorkerHeartbeat], want: float | None) -> None:
    got = measured_rps(beats)
    assert got == (pytest.approx(want) if want is not None else None)


def test_a_measured_cpu_rate_is_used_unless_one_is_configured() -> None:
    e = mixed(replicas=1, flavor_replicas={"cpu": 1}, flavor_ready={"cpu": 1})
    got = mix_inputs_for(e, {}, 0.0, None, runway(), PRICES, Windows(replica_rps=2.0), None,
                         None, measured_cpu_rps=17.5)
    assert {f.name: f.replica_rps for f in got.policy.flavors}["cpu"] == 17.5
    pinned = Windows(flavor_rates=parse_flavor_rates("cpu=3:100:4"))
    got = mix_inputs_for(e, {}, 0.0, None, runway(), PRICES, pinned, None, None,
                         measured_cpu_rps=17.5)
    assert {f.name: f.replica_rps for f in got.policy.flavors}["cpu"] == 3.0
    assert worst_p95([beat(1, 1.0, p95=80.0), beat(0, 0.0, p95=900.0)]) == 80.0
