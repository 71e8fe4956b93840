"""The gateway's endpoint field checks and its reply hub's once-only delivery."""

from __future__ import annotations

import asyncio

import pytest

from kestrel.endpoints import Priority
from kestrel.errors import InvalidArgument, Violations
from kestrel_sdk.v1 import common_pb2, gateway_pb2, worker_pb2
from services.gateway.endpoint_checks import (
    check_endpoint_spec,
    check_flavor_replicas,
    check_infer,
    flavors_of,
    normalised_spec,
)
from services.gateway.infer import ReplyHub

EP = "ep-0123456789abcdef"


@pytest.mark.parametrize(("name", "request_kw", "remaining", "want"), [
    ("no timeout and no deadline: 10 s at normal priority", {}, None, (Priority.NORMAL, 10.0)),
    ("unspecified priority is normal", {"priority": 0}, None, (Priority.NORMAL, 10.0)),
    ("high priority, 2 s asked", {"priority": 3, "timeout_ms": 2000}, None,
     (Priority.HIGH, 2.0)),
    ("the call's deadline is shorter: a little inside it", {"timeout_ms": 5000}, 1.0,
     (Priority.NORMAL, 0.95)),
    ("a long deadline leaves 50 ms of margin", {}, 4.0, (Priority.NORMAL, 3.95)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_infer_priority_and_wait(name: str, request_kw: dict[str, int],
                                 remaining: float | None,
                                 want: tuple[Priority, float]) -> None:
    req = gateway_pb2.InferRequest(endpoint_id=EP, inputs=["x"], **request_kw)  # type: ignore[arg-type]
    prio, wait = check_infer(req, remaining)
    assert prio == want[0] and wait == pytest.approx(want[1])


@pytest.mark.parametrize(("name", "request_kw", "field"), [
    ("no texts", {"inputs": []}, "inputs"),
    ("257 texts", {"inputs": ["x"] * 257}, "inputs"),
    ("an unknown priority", {"priority": 7}, "priority"),
    ("a negative timeout", {"timeout_ms": -1}, "timeout_ms"),
    ("a timeout over a minute", {"timeout_ms": 60_001}, "timeout_ms"),
    ("an id that is not an endpoint id", {"endpoint_id": "a-ep"}, "endpoint_id"),
    ("an endpoint id with a trailing newline", {"endpoint_id": EP + "\n"}, "endpoint_id"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_infer_names_the_field(name: str, request_kw: dict[str, object],
                                   field: str) -> None:
    kw: dict[str, object] = {"endpoint_id": EP, "inputs": ["x"], **request_kw}
    with pytest.raises(InvalidArgument) as err:
        check_infer(gateway_pb2.InferRequest(**kw), None)  # type: ignore[arg-type]
    assert [v.field for v in err.value.violations] == [field]


@pytest.mark.parametrize(("name", "spec", "fields"), [
    ("a name alone is enough", common_pb2.EndpointSpec(name="embed"), []),
    ("no name", common_pb2.EndpointSpec(), ["spec.name"]),
    ("another model", common_pb2.EndpointSpec(name="e", model="gpt"), ["spec.model"]),
    ("an unknown flavor", common_pb2.EndpointSpec(name="e", flavor="tpu"), ["spec.flavor"]),
    ("min above max", common_pb2.EndpointSpec(name="e", min_replicas=3, max_replicas=2),
     ["spec.min_replicas"]),
    ("too many replicas", common_pb2.EndpointSpec(name="e", max_replicas=17),
     ["spec.max_replicas"]),
    ("a negative horizon", common_pb2.EndpointSpec(name="e", reservation_horizon_s=-1),
     ["spec.reservation_horizon_s"]),
], ids=lambda x: x if isinstance(x, str) else "")
def test_endpoint_spec(name: str, spec: common_pb2.EndpointSpec, fields: list[str]) -> None:
    v = Violations()
    check_endpoint_spec(v, spec, {"gpu-h100"}, 8)
    assert [x.field for x in v.items] == fields


def test_defaults_are_filled_in() -> None:
    s = normalised_spec(common_pb2.EndpointSpec(name="e"))
    assert (s.model, s.flavor, s.max_replicas) == ("all-MiniLM-L6-v2", "cpu", 1)


async def test_a_reply_resolves_its_call_once_and_late_or_duplicate_ones_are_dropped() -> None:
    hub = ReplyHub("redis://127.0.0.1:1/0", gateway_id="g")  # never connects here
    fut = hub.expect("r1")
    reply = worker_pb2.WorkerReply(request_id="r1", replica="a").SerializeToString()
    hub.deliver(reply)
    hub.deliver(reply)  # a replica killed between reply and ack, then its successor
    hub.deliver(worker_pb2.WorkerReply(request_id="gone").SerializeToString())
    hub.deliver(b"\xff not a reply")
    assert (await asyncio.wait_for(fut, 1)).replica == "a"
    assert (hub.stats.replies, hub.stats.unclaimed) == (3, 2)
    await hub.redis.aclose()


@pytest.mark.parametrize(("name", "spec_kw", "fields"), [
    ("an unknown flavor among the others", {"flavors": ["gpu-t4"]}, ["spec.flavors[0]"]),
    ("a flavor named twice", {"flavors": ["gpu-a10", "gpu-a10"]}, ["spec.flavors[1]"]),
    ("a value that is not a decimal", {"missed_slo_value_per_s": "1e3"},
     ["spec.missed_slo_value_per_s"]),
    ("a negative value", {"missed_slo_value_per_s": "-1"}, ["spec.missed_slo_value_per_s"]),
], ids=lambda x: x if isinstance(x, str) else "")
def test_the_flavors_an_endpoint_may_run_on_are_checked(
        name: str, spec_kw: dict[str, object], fields: list[str]) -> None:
    v = Violations()
    spec = common_pb2.EndpointSpec(name="embed", max_replicas=2, **spec_kw)  # type: ignore[arg-type]
    check_endpoint_spec(v, spec, {"gpu-a10", "gpu-h100"}, 8)
    with pytest.raises(InvalidArgument) as err:
        v.raise_if_any()
    assert [x.field for x in err.value.violations] == fields


def test_the_endpoints_own_flavor_is_not_listed_again_among_the_others() -> None:
    spec = normalised_spec(common_pb2.EndpointSpec(name="e", flavors=["cpu", "gpu-a10",
                                                                      "gpu-a10"]))
    assert (spec.flavor, list(spec.flavors)) == ("cpu", ["gpu-a10"])
    assert flavors_of(spec) == ("cpu", "gpu-a10")


@pytest.mark.parametrize(("name", "replicas", "by", "fields"), [
    ("counts on the flavors it may run on", 0, {"cpu": 1, "gpu-a10": 2}, []),
    ("replicas equal to their sum", 3, {"cpu": 1, "gpu-a10": 2}, []),
    ("a flavor it may not run on", 0, {"gpu-h100": 1}, ["flavor_replicas['gpu-h100']"]),
    ("a flavor over the maximum", 0, {"gpu-a10": 5}, ["flavor_replicas[gpu-a10]"]),
    ("replicas that are not their sum", 2, {"cpu": 1, "gpu-a10": 2}, ["replicas"]),
], ids=lambda x: x if isinstance(x, str) else "")
def test_scaling_per_flavor_is_checked(name: str, replicas: int, by: dict[str, int],
                                       fields: list[str]) -> None:
    spec = normalised_spec(common_pb2.EndpointSpec(name="e", max_replicas=4,
                                                   flavors=["gpu-a10"]))
    v = Violations()
    check_flavor_replicas(v, spec, replicas, by)
    got = []
    try:
        v.raise_if_any()
    except InvalidArgument as err:
        got = [x.field for x in err.violations]
    assert got == fields
