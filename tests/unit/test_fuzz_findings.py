"""Issue 17, pure: what the fuzzer found, each pinned where it is fixed, and the
bus's parse that decides what a consumer parks. No I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from kestrel import bus
from kestrel.errors import Violations
from kestrel.paging import after_int, after_str, decode_int_token, decode_token, encode_token
from kestrel_sdk.v1 import common_pb2, events_pb2, gateway_pb2
from services.gateway.validation import MIN_RATE_PER_S, check_tenant

Q: tuple[object, ...] = ("jobs", "acme", ())


@pytest.mark.parametrize("position", [0, 1, 2**63 - 1])
def test_an_integer_position_that_fits_a_bigint_is_read_back(position: int) -> None:
    assert decode_int_token(encode_token(position, Q), Q) == position


@pytest.mark.parametrize("position", [2**63, 2**70, "-1", "\u00b2", "1e3", " 5", "0x10"])
def test_a_forged_integer_position_is_not_a_token(position: object) -> None:
    token = encode_token(position, Q)  # type: ignore[arg-type]
    assert decode_int_token(token, Q) is None
    v = Violations()
    assert after_int(v, token, Q) == 0
    assert [i.field for i in v.items] == ["page_token"]


@pytest.mark.parametrize("position", ["\x00", "a\x1bb", "a" * 257])
def test_a_forged_text_position_is_not_a_token(position: str) -> None:
    token = encode_token(position, ("tenants",))
    assert decode_token(token, ("tenants",)) is None
    v = Violations()
    after_str(v, token, ("tenants",))
    assert [i.field for i in v.items] == ["page_token"]


def test_another_querys_token_is_refused_like_garbage() -> None:
    theirs = encode_token(5, ("jobs", "other", ()))
    for token in (theirs, "garbage", "Zm9v"):
        v = Violations()
        after_int(v, token, Q)
        assert [(i.field, i.description) for i in v.items] == [
            ("page_token", "is not a token this query returned")]


@pytest.mark.parametrize("per_s", [1e-300, 5e-324, 0.0, -1.0, math.nan, math.inf, 100_001.0])
def test_a_rate_limit_the_limiter_cannot_compute_is_refused(per_s: float) -> None:
    v = Violations()
    check_tenant(v, gateway_pb2.Tenant(tenant="acme", rate_limit=gateway_pb2.RateLimit(
        per_s=per_s, burst=1)), {"gpu-h100"})
    assert [i.field for i in v.items] == ["tenant.rate_limit.per_s"]


@pytest.mark.parametrize("per_s", [MIN_RATE_PER_S, 1.0, 100_000.0])
def test_a_sane_rate_limit_passes(per_s: float) -> None:
    v = Violations()
    check_tenant(v, gateway_pb2.Tenant(tenant="acme", rate_limit=gateway_pb2.RateLimit(
        per_s=per_s, burst=1)), {"gpu-h100"})
    assert v.items == []


@dataclass
class FakeMsg:
    data: bytes
    headers: dict[str, str] | None
    subject: str = "kestrel.workload.acme.admitted"


WORKLOAD = "kestrel.v1.WorkloadEvent"


def test_parse_returns_the_message_for_its_type_or_no_header() -> None:
    e = events_pb2.WorkloadEvent(event_id="e1", tenant="acme", workload_id="job-1",
                                 kind=common_pb2.WORKLOAD_KIND_JOB, time_us=5)
    for headers in ({bus.TYPE_HEADER: WORKLOAD}, None):
        assert bus.parse(FakeMsg(e.SerializeToString(), headers), events_pb2.WorkloadEvent) == e


@pytest.mark.parametrize(("data", "headers", "why"), [
    (events_pb2.RunwayChanged().SerializeToString(),
     {bus.TYPE_HEADER: "kestrel.v1.RunwayChanged"}, "Kestrel-Type is"),
    (b"\xff\xff\xff", {bus.TYPE_HEADER: WORKLOAD}, "does not decode"),
    (b"\x0a\x02\xff\xfe", None, "does not decode"),  # invalid UTF-8 in event_id
    (events_pb2.WorkloadEvent(event_id="e\x00").SerializeToString(), None, "event_id"),
    (events_pb2.WorkloadEvent(reason="r" * 5000).SerializeToString(), None, "reason"),
])
def test_parse_names_why_a_message_is_unusable(data: bytes, headers: dict[str, str] | None,
                                               why: str) -> None:
    with pytest.raises(bus.Unusable, match=why):
        bus.parse(FakeMsg(data, headers), events_pb2.WorkloadEvent)


def test_the_dead_letter_stream_is_one_of_the_kestrel_streams() -> None:
    spec = {s.name: s for s in bus.STREAMS}["KESTREL_DEADLETTER"]
    assert spec.subjects == ["kestrel.deadletter.>"]
    assert bus.subject_deadletter("meter") == "kestrel.deadletter.meter"


def test_tap_shows_a_dead_letter_with_its_origin_and_reason() -> None:
    import json

    from kestrel_tools.tap import render

    msg = FakeMsg(b"\xff\x00", {bus.DEADLETTER_SUBJECT_HEADER: "kestrel.workload.a.admitted",
                                bus.DEADLETTER_REASON_HEADER: "does not decode",
                                bus.DEADLETTER_TYPE_HEADER: WORKLOAD},
                  subject="kestrel.deadletter.meter")
    line = json.loads(render(msg))  # type: ignore[arg-type]
    assert line["deadletter"] == {"subject": "kestrel.workload.a.admitted",
                                  "reason": "does not decode", "type": WORKLOAD}
    assert line["raw_base64"] == "/wA="


def _event(**kw: object) -> events_pb2.WorkloadEvent:
    base: dict[str, object] = {"event_id": "e", "tenant": "acme", "workload_id": "w",
                               "kind": common_pb2.WORKLOAD_KIND_JOB, "type": 1,
                               "time_us": 1_700_000_000_000_000, "gpus": 8,
                               "flavor": "gpu-h100"}
    base.update(kw)
    return events_pb2.WorkloadEvent(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [
    # Found by the bus fuzz: its first tick overflowed the ledger's bigint gpu_us, the
    # tick transaction failed every time and no tenant was metered again.
    {"gpus": 2**31 - 1, "time_us": 1},
    {"gpus": 1025}, {"time_us": 1}, {"time_us": 2**63 - 1}, {"max_duration_s": 2**62},
    {"gpus": -1}])
def test_an_event_no_ledger_row_can_hold_is_bad(kw: dict[str, object]) -> None:
    from services.meter.wire import BadEvent, event_from_wire

    with pytest.raises(BadEvent):
        event_from_wire(_event(**kw))


def test_the_widest_meterable_event_fits_a_bigint_row() -> None:
    from services.meter.wire import MAX_GPUS, MAX_US, MIN_US, event_from_wire

    assert MAX_GPUS * (MAX_US - MIN_US) < 2**63
    event_from_wire(_event(gpus=MAX_GPUS, time_us=MIN_US))
    event_from_wire(_event(gpus=MAX_GPUS, time_us=MAX_US, type=3))


@pytest.mark.parametrize("value", ["acme\n", "job-0123456789abcdef\n"])
def test_an_identifier_with_a_trailing_newline_is_refused(value: str) -> None:
    from services.gateway.validation import JOB_ID_RE, name_problem, tenant_problem
    from services.meter.servicer import check_tenant as meter_check_tenant

    if value.startswith("job-"):
        assert not JOB_ID_RE.match(value)
        return
    assert name_problem(value) is not None and tenant_problem(value) is not None
    v = Violations()
    meter_check_tenant(v, value)
    assert [i.field for i in v.items] == ["tenant"]
