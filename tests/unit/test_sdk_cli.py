"""The `kestrel` CLI without a server: parsing, rendering and errors, with the SDK
client replaced by a fake that records calls and returns SDK dataclasses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from kestrel.cli import _common, app
from kestrel.sdk import (
    ApiKeyCreated,
    InvalidArgument,
    Job,
    JobSpec,
    JobState,
    Runway,
    Tenant,
    TopUpResult,
    Unavailable,
)

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
    """Stands in for kestrel.Client; `calls` records (method, args, kwargs)."""

    address = "fake:0"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: Exception | None = None
        self.watch: list[Job] = []

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
        return iter([job(), job(JobState.RUNNING)])

    def watch_job(self, job_id: str) -> Iterator[Job]:
        self._record("watch_job", job_id)
        return iter(self.watch)

    def runway(self) -> Runway:
        self._record("runway")
        return RUNWAY

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


def test_a_server_error_is_one_sentence_with_the_code_and_exit_status_2(
        fake: FakeClient) -> None:
    fake.error = InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, "invalid request",
                                 [("gpus", "must be between 1 and 8")])
    result = runner.invoke(app, ["submit", "--name", "x", "--gpus", "9", "--max-duration",
                                 "60"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error INVALID_ARGUMENT: gpus: must be between 1 and 8"
    assert result.stdout == ""


def test_an_unreachable_gateway_names_the_address(fake: FakeClient) -> None:
    fake.error = Unavailable(grpc.StatusCode.UNAVAILABLE, "failed to connect")
    result = runner.invoke(app, ["runway"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error UNAVAILABLE: failed to connect (gateway fake:0; "
                                     "set --gateway or KESTREL_GATEWAY_ADDR)")


def test_a_missing_api_key_is_reported_without_contacting_the_gateway(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KESTREL_API_KEY", raising=False)
    result = runner.invoke(app, ["--gateway", "127.0.0.1:1", "job", "j-1"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error UNAUTHENTICATED: no API key: pass --api-key or "
                                     "set KESTREL_API_KEY")


def test_jobs_filters_by_state_and_renders_a_table(fake: FakeClient) -> None:
    result = runner.invoke(app, ["jobs", "--state", "held", "--state", "RUNNING"])
    assert result.exit_code == 0, result.output
    assert fake.calls[0][1] == ([JobState.HELD, JobState.RUNNING],)
    assert "HELD" in result.stdout and "RUNNING" in result.stdout
    assert "waiting for budget" in result.stdout


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
    assert (kwargs["rate_per_s"], kwargs["burst"]) == (2.5, 5)
    assert kwargs["initial_credits"] == "100.50"
    assert json.loads(result.stdout)["runway"]["credits"] == "100"


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
