"""The autoscaler simulation (simulated figures): deterministic, within budget, and
replaying the core's reasons where the scenarios say they happen."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bench import autoscale_sim as sim
from services.autoscaler.domain import Reason

SCENARIOS = {s.name: s for s in sim.scenarios()}


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    names = ("budget_nearly_exhausted", "exhaustion", "topup_mid_run",
             "two_tenants_sharing_a_cohort")
    return {n: sim.simulate(SCENARIOS[n], seed=7) for n in names}


def test_the_scenarios_the_issue_asks_for_are_there() -> None:
    assert set(SCENARIOS) >= {
        "steady", "spike", "ramp", "diurnal", "idle_to_zero", "cooldown_flapping",
        "budget_nearly_exhausted", "topup_mid_run", "exhaustion",
        "two_tenants_sharing_a_cohort"}


def test_the_same_seed_gives_a_byte_identical_report(tmp_path: Path) -> None:
    args = ["--seed", "3", "--only", "spike,exhaustion", "--no-plots"]
    sim.main(["--out", str(tmp_path / "a"), *args])
    sim.main(["--out", str(tmp_path / "b"), *args])
    a = (tmp_path / "a" / "report.json").read_bytes()
    assert a == (tmp_path / "b" / "report.json").read_bytes()
    rep = json.loads(a)
    assert rep["simulated"] is True and "SIMULATED" in rep["note"]
    assert "simulated" in (tmp_path / "a" / "report.md").read_text()


def test_another_seed_gives_other_arrivals() -> None:
    sc, ep = SCENARIOS["steady"], SCENARIOS["steady"].endpoints[0]
    assert sim.arrivals(sc, ep, 1) != sim.arrivals(sc, ep, 2)


@pytest.mark.parametrize("name", ["budget_nearly_exhausted", "exhaustion", "topup_mid_run",
                                  "two_tenants_sharing_a_cohort"])
def test_the_budget_aware_run_never_spends_more_than_the_budget(
        results: dict[str, Any], name: str) -> None:
    for e in results[name]["endpoints"]:
        assert Decimal(e["cost"]) <= Decimal(e["budget"])


def test_exhaustion_takes_the_endpoint_to_zero_within_one_tick(
        results: dict[str, Any]) -> None:
    e = results["exhaustion"]["endpoints"][0]
    s = e["series"]
    first = s["reason"].index(Reason.RUNWAY_EXHAUSTED)
    assert s["target"][first - 1] > 0  # it was serving the tick before
    assert s["target"][first] == 0 and s["billed"][first] == 0
    assert set(s["target"][first:]) == {0}
    assert (e["final_replicas"], e["final_reason"]) == (0, Reason.RUNWAY_EXHAUSTED)


def test_load_only_spends_at_least_the_budget_aware_cost_when_the_budget_nearly_runs_out(
        results: dict[str, Any]) -> None:
    e = results["budget_nearly_exhausted"]["endpoints"][0]
    assert Decimal(e["load_only_cost"]) >= Decimal(e["cost"])
    assert Decimal(e["saved"]) == Decimal(e["load_only_cost"]) - Decimal(e["cost"])
    assert e["reasons"][Reason.COST_BUDGET_BLOCK] > 0
    assert e["reasons"][Reason.RUNWAY_SHORT] > 0
    assert e["load_only_reasons"][Reason.COST_BUDGET_BLOCK] == 0


def test_a_topup_brings_the_endpoint_back(results: dict[str, Any]) -> None:
    s = results["topup_mid_run"]["endpoints"][0]["series"]
    assert 0 in s["target"][:400]
    assert s["target"][-1] > 0


def test_a_report_with_its_plots_is_written(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert sim.main(["--out", str(tmp_path), "--seed", "1", "--only", "exhaustion"]) == 0
    assert (tmp_path / "exhaustion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "[1/1] exhaustion" in out and out.rstrip().splitlines()[-1].startswith("total")
