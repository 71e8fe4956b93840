"""Protobuf <-> SDK dataclasses: exact money, instants, states, requests and JSON."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from kestrel_sdk import (
    ApiKey,
    ApiKeyCreated,
    Job,
    JobSpec,
    JobState,
    Runway,
    Tenant,
    UsageRow,
    to_jsonable,
)
from kestrel_sdk._convert import (
    create_tenant_request,
    list_jobs_request,
    money_text,
    submit_job_request,
)
from kestrel_sdk.v1 import common_pb2, gateway_pb2, meter_pb2

T0 = 1_700_000_000_123_456


def pb_job(**overrides: object) -> common_pb2.Job:
    job = common_pb2.Job(
        job_id="j-1", tenant="acme", state=common_pb2.JOB_STATE_RUNNING, reason="running",
        flavor="gpu-a10", flavor_reason="short runway: cheapest flavor that fits",
        reserved="0.108000000", created_us=T0, admitted_us=T0 + 1, started_us=T0 + 2,
        idempotency_key="idem-1",
        spec=common_pb2.JobSpec(name="train", gpus=2, max_duration_s=60, flavor="gpu-h100",
                                command=["python", "t.py"], priority=3,
                                labels={"team": "ml", "a": "b"}, sim_duration_s=5))
    for k, v in overrides.items():
        setattr(job, k, v)
    return job


def test_a_job_converts_with_exact_money_and_instants() -> None:
    j = Job.from_pb(pb_job())
    assert j.state is JobState.RUNNING and not j.terminal
    assert j.reserved == Decimal("0.108000000")
    assert j.spec == JobSpec(name="train", gpus=2, max_duration_s=60, flavor="gpu-h100",
                             command=("python", "t.py"), priority=3,
                             labels={"a": "b", "team": "ml"}, sim_duration_s=5)
    assert j.name == "train"
    assert j.created_at == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    assert j.finished_us == 0 and j.finished_at is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        j.state = JobState.FAILED  # type: ignore[misc]


def test_a_job_spec_round_trips_through_protobuf() -> None:
    spec = Job.from_pb(pb_job()).spec
    assert JobSpec.from_pb(spec.to_pb()) == spec
    assert spec.to_pb() == pb_job().spec


def test_an_empty_reservation_is_zero_not_an_error() -> None:
    assert Job.from_pb(pb_job(reserved="")).reserved == Decimal(0)


def test_every_proto_job_state_has_an_sdk_state_and_back() -> None:
    for name, number in common_pb2.JobState.items():
        state = JobState.from_pb(number)
        assert state.value == name.removeprefix("JOB_STATE_")
        assert state.to_pb() == number
    assert {s for s in JobState if s.terminal} == {
        JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.EVICTED,
        JobState.REJECTED}
    assert JobState.from_pb(999) is JobState.UNSPECIFIED  # a newer server's state


@pytest.mark.parametrize("text", ["running", "RUNNING", " Running ", "JOB_STATE_RUNNING"])
def test_job_states_parse_from_names_people_type(text: str) -> None:
    assert JobState.parse(text) is JobState.RUNNING


def test_an_unknown_state_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown job state 'runing'; known: held, admitted"):
        JobState.parse("runing")


def test_runway_keeps_decimals_and_says_unlimited_instead_of_infinity() -> None:
    r = Runway.from_pb(common_pb2.Runway(
        tenant="acme", credits="100", charged="0.000300000000000", reserved="1.5",
        remaining="98.4997", burn_per_s="0", runway_s=float("inf"), unlimited=True,
        as_of_us=T0, ledger_seq=42, remaining_bp=9849))
    assert r.charged == Decimal("0.0003")
    assert str(r.charged) == "0.000300000000000"  # the scale survives
    assert r.runway_s is None and r.unlimited
    assert r.as_of == datetime.fromtimestamp(T0 / 1e6, tz=UTC)
    finite = Runway.from_pb(common_pb2.Runway(tenant="acme", runway_s=3600.5,
                                              burn_per_s="0.002"))
    assert finite.runway_s == 3600.5 and finite.burn_per_s == Decimal("0.002")


def test_a_fully_reserved_runway_carries_how_long_the_money_lasts() -> None:
    # The meter's figures when one covered job reserves the whole budget (issue 10 #8).
    r = Runway.from_pb(common_pb2.Runway(
        tenant="acme", credits="10", charged="0", reserved="10", remaining="0",
        burn_per_s="0.05", runway_s=0.0, money_runway_s=200.0, free_to_reserve="0"))
    assert (r.runway_s, r.money_runway_s) == (0.0, 200.0)
    assert (r.free_to_reserve, r.unspent) == (Decimal(0), Decimal(10))
    # An older server sends neither: the SDK computes them the same way (kestrel_sdk.budget).
    old = Runway.from_pb(common_pb2.Runway(
        tenant="acme", credits="10", charged="2", reserved="9", remaining="-1",
        burn_per_s="0.5", runway_s=0.0))
    assert (old.money_runway_s, old.free_to_reserve) == (16.0, Decimal(0))
    idle = Runway.from_pb(common_pb2.Runway(tenant="acme", credits="10", remaining="10",
                                            free_to_reserve="10", unlimited=True))
    assert idle.money_runway_s is None and idle.free_to_reserve == Decimal(10)


def test_a_tenant_carries_its_runway_only_when_the_server_sent_one() -> None:
    pb = gateway_pb2.Tenant(tenant="acme", display_name="Acme", gpu_quota={"gpu-h100": 8},
                            rate_limit=gateway_pb2.RateLimit(per_s=5.5, burst=10),
                            created_us=T0)
    t = Tenant.from_pb(pb)
    assert (t.gpu_quota, t.rate_per_s, t.burst, t.runway) == ({"gpu-h100": 8}, 5.5, 10, None)
    with_runway = Tenant.from_pb(pb, common_pb2.Runway(tenant="acme", credits="7"))
    assert with_runway.runway is not None and with_runway.runway.credits == Decimal(7)


def test_a_new_key_hides_its_secret_from_repr_but_not_from_json() -> None:
    created = ApiKeyCreated.from_pb(gateway_pb2.CreateApiKeyResponse(
        key=gateway_pb2.ApiKey(key_id="k1", tenant="acme", name="ci", created_us=T0),
        secret="ks_k1_s3cret"))
    assert created.secret == "ks_k1_s3cret"
    assert "s3cret" not in repr(created)
    assert to_jsonable(created)["secret"] == "ks_k1_s3cret"


def test_a_revoked_key_says_so() -> None:
    k = ApiKey.from_pb(gateway_pb2.ApiKey(key_id="k1", revoked_us=T0))
    assert k.revoked and k.revoked_at is not None
    assert not ApiKey.from_pb(gateway_pb2.ApiKey(key_id="k2")).revoked


def test_a_usage_row_keeps_its_exact_cost() -> None:
    row = UsageRow.from_pb(meter_pb2.UsageRow(
        row_id=7, tenant="acme", workload_id="j-1", flavor="gpu-h100", gpus=2, start_us=T0,
        end_us=T0 + 1_000_000, gpu_us=2_000_000, price_per_gpu_s="0.001",
        cost="0.002000000000000", cause_id="tick-1", recorded_us=T0 + 5))
    assert row.cost == Decimal("0.002") and row.price_per_gpu_s == Decimal("0.001")
    assert row.end is not None and row.start is not None
    assert (row.end - row.start).total_seconds() == 1


@pytest.mark.parametrize(("value", "text"), [
    (Decimal("12.50"), "12.50"), (Decimal("1E+2"), "100"), ("  3.25 ", "3.25"), (5, "5"),
    (Decimal("0.000000001"), "0.000000001"),
])
def test_money_arguments_go_on_the_wire_as_plain_decimal_text(
        value: Decimal | str | int, text: str) -> None:
    assert money_text(value) == text


def test_money_refuses_floats_and_non_finite_decimals() -> None:
    with pytest.raises(TypeError, match="not float"):
        money_text(0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        money_text(Decimal("NaN"))


def test_create_tenant_request_carries_quota_limits_and_credits() -> None:
    req = create_tenant_request("acme", display_name="Acme", gpu_quota={"gpu-a10": 4},
                                rate_per_s=2.5, burst=5, initial_credits=Decimal("100.5"))
    assert req.tenant.tenant == "acme" and dict(req.tenant.gpu_quota) == {"gpu-a10": 4}
    assert (req.tenant.rate_limit.per_s, req.tenant.rate_limit.burst) == (2.5, 5)
    assert req.initial_credits == "100.5"
    assert dict(req.tenant.gpu_borrow) == {}
    borrowing = create_tenant_request("acme", display_name="", gpu_quota={"gpu-a10": 4},
                                      rate_per_s=1, burst=1, initial_credits="1",
                                      gpu_borrow={"gpu-a10": 8})
    assert dict(borrowing.tenant.gpu_borrow) == {"gpu-a10": 8}
    assert Tenant.from_pb(borrowing.tenant).gpu_borrow == {"gpu-a10": 8}


def test_submit_job_request_builds_the_spec_and_refuses_a_command_string() -> None:
    req = submit_job_request(name="n", gpus=1, max_duration_s=30, command=["echo", "hi"],
                             labels={"k": "v"}, idempotency_key="i-1")
    assert list(req.spec.command) == ["echo", "hi"] and dict(req.spec.labels) == {"k": "v"}
    assert req.idempotency_key == "i-1"
    with pytest.raises(TypeError, match="sequence of arguments"):
        submit_job_request(name="n", gpus=1, max_duration_s=30, command="echo hi")


def test_list_jobs_request_accepts_states_by_name_or_enum() -> None:
    req = list_jobs_request(["held", JobState.RUNNING], 50, "tok")
    assert list(req.states) == [common_pb2.JOB_STATE_HELD, common_pb2.JOB_STATE_RUNNING]
    assert (req.page_size, req.page_token) == (50, "tok")


def test_json_of_a_job_is_plain_data_with_exact_money() -> None:
    data = to_jsonable(Job.from_pb(pb_job()))
    assert json.loads(json.dumps(data)) == data
    assert data["state"] == "RUNNING"
    assert data["reserved"] == "0.108000000"
    assert data["spec"]["command"] == ["python", "t.py"]
    assert data["spec"]["labels"] == {"a": "b", "team": "ml"}
    assert to_jsonable([Decimal("1E-9")]) == ["0.000000001"]
