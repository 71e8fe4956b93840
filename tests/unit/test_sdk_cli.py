"""The `kestrel` CLI without a server: parsing, rendering and errors, with the SDK
client replaced by a fake that records calls and returns SDK dataclasses."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from kestrel_sdk import (
    ApiKey,
    ApiKeyCreated,
    InvalidArgument,
    Job,
    JobSpec,
    JobState,
    Runway,
    Tenant,
    TopUpResult,
    Unavailable,
    UsageRow,
)
from kestrel_sdk.cli import _common, app, render
from kestrel_sdk.cli import meter as cli_meter
from kestrel_sdk.v1 import common_pb2, meter_pb2

runner = CliRunner(env={"COLUMNS": "200"})  # wide: rich wraps nothing
T0 = 1_700_000_000_000_000


def job(state: JobState = JobState.HELD, reason: str = "waiting for budget",
        flavor: str = "") -> Job:
    return Job(job_id="j-1", tenant="acme",
               spec=JobSpec(name="train", gpus=2, max_duration_s=600, labels={"team": "ml"}),
               state=state, reason=reason, flavor=flavor, flavor_reason="",
               reserved=Decimal("1.200000000"), created_us=T0, admitted_us=0, started_us=0,
               finished_us=0, idempotency_key="")


RUNWAY = Runway(tenant="acme", credits=Decimal("100"), charged=Decimal("0.5"),
                reserved=Decimal("1.2"), remaining=Decimal("98.3"),
                burn_per_s=Decimal("0.002"), runway_s=49150.0, unlimited=False,
                running_gpus=2, as_of_us=T0, ledger_seq=9, remaining_bp=9830)


class FakeClient:
    """Stands in for kestrel_sdk.Client; `calls` records (method, args, kwargs)."""

    address = "fake:0"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: Exception | None = None
        self.watch: list[Job] = []
        self.jobs: list[Job] = [job(), job(JobState.RUNNING)]
        self.runway_figures = RUNWAY

    def _record(self, method: str, /, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        pass

    def submit_job(self, **kwargs: Any) -> Job:
        self._record("submit_job", **kwargs)
        return job()

    def get_job(self, job_id: str) -> Job:
        self._record("get_job", job_id)
        return job(JobState.RUNNING, "running on gpu-a10", "gpu-a10")

    def list_jobs(self, states: Any = (), page_size: int = 100) -> Iterator[Job]:
        self._record("list_jobs", list(states), page_size=page_size)
        return iter(self.jobs)

    def list_all_jobs(self, tenant: str = "", states: Any = (),
                      page_size: int = 100) -> Iterator[Job]:
        self._record("list_all_jobs", tenant, list(states), page_size=page_size)
        return iter(self.jobs)

    def watch_job(self, job_id: str) -> Iterator[Job]:
        self._record("watch_job", job_id)
        return iter(self.watch)

    def runway(self) -> Runway:
        self._record("runway")
        return self.runway_figures

    def create_api_key(self, tenant: str, name: str) -> ApiKeyCreated:
        self._record("create_api_key", tenant, name)
        return ApiKeyCreated(key_id="k1", secret="ks_k1_s3cret", tenant=tenant, name=name,
                             created_us=T0)

    def create_tenant(self, tenant: str, **kwargs: Any) -> Tenant:
        self._record("create_tenant", tenant, **kwargs)
        return Tenant(tenant=tenant, display_name="", gpu_quota=kwargs["gpu_quota"],
                      rate_per_s=kwargs["rate_per_s"], burst=kwargs["burst"],
                      suspended=False, created_us=T0, runway=RUNWAY)

    def suspend_tenant(self, tenant: str, suspended: bool = True, reason: str = "") -> Tenant:
        self._record("suspend_tenant", tenant, suspended=suspended, reason=reason)
        return Tenant(tenant=tenant, display_name="", gpu_quota={}, rate_per_s=1, burst=1,
                      suspended=suspended, created_us=T0)

    def top_up(self, tenant: str, amount: str, top_up_id: str | None = None,
               note: str = "") -> TopUpResult:
        self._record("top_up", tenant, amount, top_up_id, note)
        return TopUpResult(applied=True, runway=RUNWAY)

    def adjust_credits(self, tenant: str, amount: str, note: str,
                       adjust_id: str | None = None) -> TopUpResult:
        self._record("adjust_credits", tenant, amount, note, adjust_id)
        return TopUpResult(applied=True, runway=RUNWAY)

    def get_tenant(self, tenant: str) -> Tenant:
        self._record("get_tenant", tenant)
        return Tenant(tenant=tenant, display_name="", gpu_quota={}, rate_per_s=1, burst=1,
                      suspended=False, created_us=T0, runway=RUNWAY)

    def list_tenants(self) -> Iterator[Tenant]:
        self._record("list_tenants")
        return iter([self.get_tenant("acme")])

    def cancel_job(self, job_id: str, reason: str = "") -> Job:
        self._record("cancel_job", job_id, reason)
        return job(JobState.CANCELLED, reason)

    def revoke_api_key(self, key_id: str) -> ApiKey:
        self._record("revoke_api_key", key_id)
        return ApiKey(key_id=key_id, tenant="acme", name="ci", created_us=T0, revoked_us=T0)

    def usage(self, start_us: int = 0, end_us: int = 0, workload: str = "",
              page_size: int = 100) -> Iterator[UsageRow]:
        self._record("usage", start_us, end_us, workload)
        return iter([UsageRow(row_id=1, tenant="acme", workload_id="j-1", flavor="gpu-h100",
                              gpus=2, start_us=T0, end_us=T0 + 1_000_000, gpu_us=2_000_000,
                              price_per_gpu_s=Decimal("0.01"), cost=Decimal("0.02"),
                              cause_id="tick-1/j-1", recorded_us=T0)])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(_common, "make_client", lambda g: client)
    return client


def test_help_lists_tenant_operator_and_meter_commands_and_keeps_tap() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("tap", "submit", "jobs", "job", "cancel", "watch", "runway", "usage",
                    "tenants", "keys", "top-up", "meter"):
        assert command in result.stdout
    tap_help = runner.invoke(app, ["tap", "--help"])
    assert tap_help.exit_code == 0
    assert "--nats-url" in tap_help.stdout and "--count" in tap_help.stdout


def test_the_meter_direct_commands_live_under_meter() -> None:
    result = runner.invoke(app, ["meter", "--help"])
    assert result.exit_code == 0
    for command in ("runway", "usage", "top-up", "account", "summary", "prices"):
        assert command in result.stdout


def test_submit_passes_durations_labels_and_command_to_the_sdk(fake: FakeClient) -> None:
    result = runner.invoke(app, [
        "submit", "--name", "train", "--gpus", "2", "--max-duration", "15m",
        "--sim-duration", "90s", "--label", "team=ml", "--label", "run=a=b", "--priority",
        "5", "--idempotency-key", "k-1", "--json", "--", "python", "train.py", "--lr=1"])
    assert result.exit_code == 0, result.output
    name, _, kwargs = fake.calls[0]
    assert name == "submit_job"
    assert kwargs["max_duration_s"] == 900 and kwargs["sim_duration_s"] == 90
    assert kwargs["labels"] == {"team": "ml", "run": "a=b"}
    assert kwargs["command"] == ("python", "train.py", "--lr=1")
    assert (kwargs["priority"], kwargs["idempotency_key"]) == (5, "k-1")
    data = json.loads(result.stdout)
    assert data["state"] == "HELD" and data["reserved"] == "1.200000000"


@pytest.mark.parametrize(("label", "why"), [
    ("team", "'team' is not KEY=VALUE"), ("=ml", "'=ml' is not KEY=VALUE"),
])
def test_a_malformed_label_is_a_usage_error_before_any_call(
        fake: FakeClient, label: str, why: str) -> None:
    result = runner.invoke(app, ["submit", "--name", "x", "--gpus", "1", "--max-duration",
                                 "60", "--label", label])
    assert result.exit_code == 2
    assert why in result.output and "--label" in result.output
    assert fake.calls == []


def test_a_label_given_twice_is_refused(fake: FakeClient) -> None:
    result = runner.invoke(app, ["submit", "--name", "x", "--gpus", "1", "--max-duration",
                                 "60", "--label", "a=1", "--label", "a=2"])
    assert result.exit_code == 2 and "'a' is given twice" in result.output


def test_a_malformed_duration_and_state_are_usage_errors(fake: FakeClient) -> None:
    bad_duration = runner.invoke(app, ["submit", "--name", "x", "--gpus", "1",
                                       "--max-duration", "ten minutes"])
    assert bad_duration.exit_code == 2 and "is not a duration" in bad_duration.output
    bad_state = runner.invoke(app, ["jobs", "--state", "runing"])
    assert bad_state.exit_code == 2 and "unknown job state 'runing'" in bad_state.output
    assert fake.calls == []


def test_a_server_error_is_one_sentence_with_the_code_and_exit_status_1(
        fake: FakeClient) -> None:
    fake.error = InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, "invalid request",
                                 [("gpus", "must be between 1 and 8")])
    result = runner.invoke(app, ["submit", "--name", "x", "--gpus", "9", "--max-duration",
                                 "60"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error INVALID_ARGUMENT: gpus: must be between 1 and 8"
    assert result.stdout == ""


def test_an_unreachable_gateway_names_the_address(fake: FakeClient) -> None:
    fake.error = Unavailable(grpc.StatusCode.UNAVAILABLE, "failed to connect")
    result = runner.invoke(app, ["runway"])
    assert result.exit_code == 1
    assert result.stderr.strip() == ("error UNAVAILABLE: failed to connect (gateway fake:0; "
                                     "set --gateway or KESTREL_GATEWAY_ADDR)")


def test_a_missing_api_key_is_reported_without_contacting_the_gateway(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KESTREL_API_KEY", raising=False)
    result = runner.invoke(app, ["--gateway", "127.0.0.1:1", "job", "j-1"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error UNAUTHENTICATED: no API key: pass --api-key, "
                                     "set KESTREL_API_KEY or use a context (kestrel config)")


def test_jobs_filters_by_state_and_renders_a_table(fake: FakeClient) -> None:
    result = runner.invoke(app, ["jobs", "--state", "held", "--state", "RUNNING"])
    assert result.exit_code == 0, result.output
    assert fake.calls[0][1] == ([JobState.HELD, JobState.RUNNING],)
    assert "HELD" in result.stdout and "RUNNING" in result.stdout
    assert "waiting for budget" in result.stdout


def test_the_operators_jobs_listing_filters_by_tenant_and_state_and_shows_the_tenant(
        fake: FakeClient) -> None:
    result = runner.invoke(app, ["-o", "wide", "tenants", "jobs", "acme", "--state", "held"])
    assert result.exit_code == 0, result.output
    assert fake.calls[0][0] == "list_all_jobs"
    assert fake.calls[0][1] == ("acme", [JobState.HELD])
    assert "jobs of acme" in result.stdout and "tenant" in result.stdout
    every = runner.invoke(app, ["tenants", "jobs"])
    assert every.exit_code == 0 and fake.calls[-1][1] == ("", [])
    assert "jobs of every tenant" in every.stdout


def test_global_json_applies_to_every_command(fake: FakeClient) -> None:
    result = runner.invoke(app, ["--json", "jobs"])
    assert result.exit_code == 0
    assert [j["state"] for j in json.loads(result.stdout)] == ["HELD", "RUNNING"]


def test_job_shows_state_flavor_and_reason(fake: FakeClient) -> None:
    result = runner.invoke(app, ["job", "j-1"])
    assert result.exit_code == 0
    for text in ("j-1", "RUNNING", "gpu-a10", "running on gpu-a10", "team=ml", "1.2"):
        assert text in result.stdout


def test_watch_prints_each_state_change_once_until_terminal(fake: FakeClient) -> None:
    fake.watch = [job(), job(), job(JobState.ADMITTED, "budget reserved"),
                  job(JobState.RUNNING, "running", "gpu-h100"),
                  job(JobState.SUCCEEDED, "completed", "gpu-h100")]
    result = runner.invoke(app, ["watch", "j-1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[3] for line in lines] == ["HELD", "ADMITTED", "RUNNING", "SUCCEEDED"]
    assert "on gpu-h100" in lines[2] and lines[3].endswith("completed")
    as_json = runner.invoke(app, ["watch", "j-1", "--json"])
    assert [json.loads(x)["state"] for x in as_json.stdout.splitlines()] == [
        "HELD", "ADMITTED", "RUNNING", "SUCCEEDED"]


def test_watch_that_ends_before_a_terminal_state_says_so(fake: FakeClient) -> None:
    fake.watch = [job(JobState.RUNNING, "running")]
    result = runner.invoke(app, ["watch", "j-1"])
    assert result.exit_code == 1
    assert "before a terminal state (last seen: RUNNING)" in result.stderr


def test_runway_json_keeps_money_exact(fake: FakeClient) -> None:
    result = runner.invoke(app, ["runway", "--json"])
    data = json.loads(result.stdout)
    assert data["remaining"] == "98.3" and data["runway_s"] == 49150.0


def test_keys_create_prints_the_secret_once_with_a_warning(fake: FakeClient) -> None:
    result = runner.invoke(app, ["keys", "create", "acme", "--name", "ci"])
    assert result.exit_code == 0
    assert "ks_k1_s3cret" in result.stdout
    assert "cannot be shown again" in result.stderr
    assert fake.calls == [("create_api_key", ("acme", "ci"), {})]


def test_tenants_create_parses_quota_and_passes_credits_as_text(fake: FakeClient) -> None:
    result = runner.invoke(app, ["tenants", "create", "acme", "--credits", "100.50",
                                 "--quota", "gpu-h100=8", "--quota", "gpu-a10=4", "--rate",
                                 "2.5", "--burst", "5", "--json"])
    assert result.exit_code == 0, result.output
    _, args, kwargs = fake.calls[0]
    assert args == ("acme",)
    assert kwargs["gpu_quota"] == {"gpu-h100": 8, "gpu-a10": 4}
    assert kwargs["gpu_borrow"] == {}  # the quota is a cap unless --borrow says otherwise
    assert (kwargs["rate_per_s"], kwargs["burst"]) == (2.5, 5)
    assert kwargs["initial_credits"] == "100.50"
    assert json.loads(result.stdout)["runway"]["credits"] == "100"


def test_borrowing_beyond_the_quota_is_an_explicit_option(fake: FakeClient) -> None:
    result = runner.invoke(app, ["tenants", "create", "acme", "--quota", "gpu-h100=4",
                                 "--borrow", "gpu-h100=8"])
    assert result.exit_code == 0, result.output
    assert fake.calls[0][2]["gpu_borrow"] == {"gpu-h100": 8}
    bad = runner.invoke(app, ["tenants", "create", "acme", "--borrow", "gpu-h100=-1"])
    assert bad.exit_code == 2 and "--borrow" in bad.output


def test_a_bad_quota_is_a_usage_error(fake: FakeClient) -> None:
    result = runner.invoke(app, ["tenants", "create", "acme", "--credits", "1", "--quota",
                                 "gpu-h100=lots"])
    assert result.exit_code == 2 and "whole number" in result.output
    assert fake.calls == []


def test_suspend_and_resume_flip_the_flag(fake: FakeClient) -> None:
    assert runner.invoke(app, ["tenants", "suspend", "acme", "--reason", "abuse"]).exit_code == 0
    assert runner.invoke(app, ["tenants", "resume", "acme"]).exit_code == 0
    assert [c[2] for c in fake.calls] == [{"suspended": True, "reason": "abuse"},
                                          {"suspended": False, "reason": ""}]


def test_top_up_goes_through_the_sdk(fake: FakeClient) -> None:
    result = runner.invoke(app, ["top-up", "acme", "50", "--top-up-id", "t-1"])
    assert result.exit_code == 0
    assert fake.calls == [("top_up", ("acme", "50", "t-1", ""), {})]
    assert "applied" in result.stdout


# --- issue 10 #8: a fully reserved budget is not "out of money" ------------------------

FULLY_RESERVED = Runway(tenant="acme", credits=Decimal("10"), charged=Decimal("0"),
                        reserved=Decimal("10"), remaining=Decimal("0"),
                        burn_per_s=Decimal("0.05"), runway_s=0.0, unlimited=False,
                        running_gpus=1, as_of_us=T0, ledger_seq=3, remaining_bp=0,
                        money_runway_s=200.0, free_to_reserve=Decimal("0"))


def test_a_fully_reserved_runway_says_how_long_the_money_lasts_and_what_is_free(
        fake: FakeClient) -> None:
    fake.runway_figures = FULLY_RESERVED
    result = runner.invoke(app, ["runway"])
    assert result.exit_code == 0, result.output
    assert "money lasts 3m20s at the current burn" in result.stdout
    assert "free to reserve 0 of 10 (10 reserved by admitted jobs)" in result.stdout
    assert "0.0s" not in result.stdout  # the old "runway 0.0s"


class FakeMeter:
    """Stands in for kestrel.v1.MeterStub in `kestrel meter ...`."""

    RUNWAY = common_pb2.Runway(tenant="acme", credits="10", charged="0", reserved="10",
                               remaining="0", burn_per_s="0.05", runway_s=0.0,
                               money_runway_s=200.0, free_to_reserve="0", running_gpus=1)

    def GetRunway(self, req: Any, timeout: float) -> Any:
        return meter_pb2.GetRunwayResponse(runway=self.RUNWAY)

    def TopUp(self, req: Any, timeout: float) -> Any:
        return meter_pb2.TopUpResponse(runway=self.RUNWAY, applied=True)

    def CreateAccount(self, req: Any, timeout: float) -> Any:
        return meter_pb2.CreateAccountResponse(runway=self.RUNWAY, created=True)

    def GetTenantSummary(self, req: Any, timeout: float) -> Any:
        return meter_pb2.GetTenantSummaryResponse(runway=self.RUNWAY, flavors=[
            meter_pb2.FlavorUsage(flavor="gpu-h100", gpu_us=2_000_000, cost="0.02", rows=1)])

    def ListPrices(self, req: Any, timeout: float) -> Any:
        return meter_pb2.ListPricesResponse(prices=[meter_pb2.Price(
            flavor="gpu-h100", price_per_gpu_s="0.01", price_per_gpu_h="36")])

    def ListUsage(self, req: Any, timeout: float) -> Any:
        return meter_pb2.ListUsageResponse(rows=[meter_pb2.UsageRow(
            row_id=1, tenant="acme", workload_id="j-1", flavor="gpu-h100", gpus=2,
            start_us=T0, end_us=T0 + 1_000_000, gpu_us=2_000_000, price_per_gpu_s="0.01",
            cost="0.02", cause_id="tick-1/j-1")])


@pytest.fixture
def fake_meter(monkeypatch: pytest.MonkeyPatch) -> FakeMeter:
    stub = FakeMeter()
    monkeypatch.setattr(cli_meter, "_meter", lambda addr: stub)
    return stub


def test_the_meter_runway_words_a_fully_reserved_budget_the_same_way(
        fake_meter: FakeMeter) -> None:
    result = runner.invoke(app, ["meter", "runway", "acme"])
    assert result.exit_code == 0, result.output
    assert "money lasts 3m20s at the current burn" in result.stdout
    assert "free to reserve 0 of 10" in result.stdout and "0.0s" not in result.stdout
    data = json.loads(runner.invoke(app, ["meter", "runway", "acme", "-o", "json"]).stdout)
    assert (data["runway"]["money_runway_s"], data["runway"]["free_to_reserve"]) == (200.0, "0")
    assert data["runway"]["runway_s"] == 0.0  # zero fields are printed, not left out


@pytest.mark.parametrize(("figures", "line"), [
    (dict(charged=Decimal("10.5"), reserved=Decimal(0), remaining=Decimal("-0.5"),
          money_runway_s=0.0), "money: spent (10.5 charged of 10 credits)"),
    (dict(burn_per_s=Decimal(0), unlimited=True, runway_s=None, money_runway_s=None,
          running_gpus=0), "money: 10 left; nothing is running, so none is being spent"),
    (dict(money_runway_s=7_500.0, running_gpus=2), "money lasts 2h05m at the current burn "
                                                   "(0.05/s on 2 GPUs): 10 of 10 credits left"),
])
def test_the_money_line_for_spent_idle_and_burning_budgets(
        figures: dict[str, Any], line: str) -> None:
    assert render.runway_lines(dataclasses.replace(FULLY_RESERVED, **figures))[0] == line


@pytest.mark.parametrize(("seconds", "text"), [
    (0.4, "under 1s"), (45.9, "45s"), (200, "3m20s"), (7_500, "2h05m"), (273_600, "3d04h")])
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert render.duration(seconds) == text


# --- issue 10 #9: negative amounts, tables for scripts, -o json ---------------------------


@pytest.mark.parametrize("argv", [
    ["adjust", "acme", "-0.6", "--note", "x"],
    ["adjust", "acme", "--note", "x", "-0.6"],
    ["adjust", "--note", "x", "acme", "-0.6"],
])
def test_adjust_takes_a_negative_amount_as_its_help_says(
        fake: FakeClient, argv: list[str]) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert fake.calls == [("adjust_credits", ("acme", "-0.6", "x", None), {})]
    assert "applied" in result.stdout


def test_adjust_still_refuses_what_is_not_a_signed_amount(fake: FakeClient) -> None:
    bad = runner.invoke(app, ["adjust", "acme", "-x", "--note", "n"])
    assert bad.exit_code == 2 and "'-x' is not a signed decimal" in bad.output
    no_note = runner.invoke(app, ["adjust", "acme", "-5", "--nte", "n"])
    assert no_note.exit_code == 2 and "--note" in no_note.output
    raised = runner.invoke(app, ["adjust", "acme", "+20", "--note", "n"])
    assert raised.exit_code == 0, raised.output
    assert fake.calls == [("adjust_credits", ("acme", "+20", "n", None), {})]
    assert "-50 lowers the budget" in runner.invoke(app, ["adjust", "--help"]).stdout


LONG_REASON = ("needs 96 credits (8 GPU x 1200 s x 0.01 on gpu-h100), 3.5 remain; held until "
               "a top-up or a reservation frees")


def test_tables_are_never_cut_when_stdout_is_not_a_terminal(fake: FakeClient) -> None:
    fake.jobs = [job(reason=LONG_REASON)]
    result = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert LONG_REASON in result.stdout and "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 80


def test_on_a_terminal_tables_fit_it_unless_wide_is_asked(
        fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "_stdout_is_terminal", lambda: True)
    fake.jobs = [job(reason=LONG_REASON)]
    fitted = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": "80"})
    assert LONG_REASON not in fitted.stdout
    assert max(len(line) for line in fitted.stdout.splitlines()) <= 80
    wide = CliRunner().invoke(app, ["jobs", "-o", "wide"], env={"COLUMNS": "80"})
    assert LONG_REASON in wide.stdout and "…" not in wide.stdout


@pytest.mark.parametrize("argv", [
    ["jobs"], ["job", "j-1"], ["cancel", "j-1"], ["runway"], ["usage"],
    ["submit", "--name", "x", "--gpus", "1", "--max-duration", "60"],
    ["tenants", "list"], ["tenants", "get", "acme"], ["tenants", "create", "acme"],
    ["tenants", "jobs"], ["tenants", "jobs", "acme", "--state", "held"],
    ["tenants", "suspend", "acme"], ["tenants", "resume", "acme"],
    ["keys", "create", "acme"], ["keys", "revoke", "k1"],
    ["top-up", "acme", "5"], ["adjust", "acme", "-5", "--note", "n"],
    ["meter", "runway", "acme"], ["meter", "usage", "acme"], ["meter", "top-up", "acme", "5"],
    ["meter", "account", "acme"], ["meter", "summary", "acme"], ["meter", "prices"],
])
@pytest.mark.parametrize("how", ["-o", "--output", "global"])
def test_every_listing_and_show_command_prints_json_with_output_json(
        fake: FakeClient, fake_meter: FakeMeter, argv: list[str], how: str) -> None:
    args = ["-o", "json", *argv] if how == "global" else [*argv, how, "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout), dict | list)


def test_watch_prints_json_lines_with_output_json(fake: FakeClient) -> None:
    fake.watch = [job(), job(JobState.SUCCEEDED, "completed")]
    result = runner.invoke(app, ["watch", "j-1", "-o", "json"])
    assert [json.loads(x)["state"] for x in result.stdout.splitlines()] == [
        "HELD", "SUCCEEDED"]
