"""The autoscaler simulation (simulated figures): deterministic, within budget, three
policies on the same arrivals, and replaying the cores' reasons where the scenarios say
they happen."""

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
             "two_tenants_sharing_a_cohort", "mixed_ramp", "gpu_endpoint_light_load",
             "latency_slo_100ms", "steady")
    return {n: sim.simulate(SCENARIOS[n], seed=7) for n in names}


def test_the_scenarios_the_issue_asks_for_are_there() -> None:
    assert set(SCENARIOS) >= {
        "steady", "spike", "ramp", "diurnal", "idle_to_zero", "cooldown_flapping",
        "budget_nearly_exhausted", "topup_mid_run", "exhaustion",
        "two_tenants_sharing_a_cohort"}
    several = [s for s in SCENARIOS.values() if any(len(e.flavors) > 1 for e in s.endpoints)]
    assert len(several) >= 3


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


def ca(results: dict[str, Any], name: str, policy: str = "cost_aware") -> dict[str, Any]:
    e: dict[str, Any] = results[name]["endpoints"][0]["policies"][policy]
    return e


@pytest.mark.parametrize("name", ["budget_nearly_exhausted", "exhaustion", "topup_mid_run",
                                  "two_tenants_sharing_a_cohort"])
@pytest.mark.parametrize("policy", ["budget_aware", "cost_aware"])
def test_the_money_aware_runs_never_spend_more_than_the_budget(
        results: dict[str, Any], name: str, policy: str) -> None:
    for e in results[name]["endpoints"]:
        assert Decimal(e["policies"][policy]["cost"]) <= Decimal(e["budget"])
        assert e["policies"][policy]["over_budget_decisions"] == 0


@pytest.mark.parametrize("policy", ["budget_aware", "cost_aware"])
def test_exhaustion_takes_the_endpoint_to_zero_within_one_tick(
        results: dict[str, Any], policy: str) -> None:
    e = ca(results, "exhaustion", policy)
    s = e["series"]
    first = s["reason"].index(Reason.RUNWAY_EXHAUSTED)
    assert s["target"][first - 1] > 0  # it was serving the tick before
    assert s["target"][first] == 0 and s["billed"][first] == 0
    assert set(s["target"][first:]) == {0}
    assert (e["final_replicas"], e["final_reason"]) == (0, Reason.RUNWAY_EXHAUSTED)


def test_load_only_spends_at_least_the_budget_aware_cost_when_the_budget_nearly_runs_out(
        results: dict[str, Any]) -> None:
    lo, ba = (ca(results, "budget_nearly_exhausted", p) for p in ("load_only", "budget_aware"))
    assert Decimal(lo["cost"]) >= Decimal(ba["cost"])
    assert Decimal(ba["saved"]) == Decimal(lo["cost"]) - Decimal(ba["cost"])
    assert ba["reasons"][Reason.COST_BUDGET_BLOCK] > 0
    assert ba["reasons"][Reason.RUNWAY_SHORT] > 0
    assert lo["reasons"][Reason.COST_BUDGET_BLOCK] == 0
    assert not results["budget_nearly_exhausted"]["budget_ample"]


def test_a_topup_brings_the_endpoint_back(results: dict[str, Any]) -> None:
    for policy in ("budget_aware", "cost_aware"):
        s = ca(results, "topup_mid_run", policy)["series"]
        assert 0 in s["target"][:400]
        assert s["target"][-1] > 0


def test_a_rising_load_moves_the_endpoint_from_the_cpu_pool_to_a_gpu_and_back(
        results: dict[str, Any]) -> None:
    mix = ca(results, "mixed_ramp")["series"]["mix"]
    assert mix["cpu"][30] > 0 and mix["gpu-a10"][30] + mix["gpu-h100"][30] == 0
    peak = {f: n * sim.FLAVORS[f].service_rps for f, n in ((f, c[600]) for f, c in mix.items())}
    assert mix["gpu-h100"][600] > 0 and peak["cpu"] < 0.2 * sum(peak.values())
    assert mix["cpu"][-1] > 0 and mix["gpu-h100"][-1] == 0
    e = ca(results, "mixed_ramp")
    assert e["reasons"][Reason.CHEAPER_FLAVOR] > 0
    assert Decimal(e["cost"]) < Decimal(ca(results, "mixed_ramp", "load_only")["cost"])


def test_an_endpoint_declared_on_a_gpu_serves_a_light_load_from_the_cpu_pool(
        results: dict[str, Any]) -> None:
    e = ca(results, "gpu_endpoint_light_load")
    assert e["peak_mix"].keys() == {"cpu"}
    assert e["saved_pct"] > 30


def test_an_slo_the_cpu_cannot_meet_keeps_the_endpoint_on_a_gpu(
        results: dict[str, Any]) -> None:
    e = ca(results, "latency_slo_100ms")
    assert not any(e["series"]["mix"]["cpu"])
    assert e["reasons"][Reason.SLO_NEEDS_FASTER_FLAVOR] > 0
    assert e["series"]["mix"]["gpu-a10"][200] == 1  # cheaper than the declared h100


def test_with_one_flavor_and_an_ample_budget_the_three_policies_serve_alike(
        results: dict[str, Any]) -> None:
    p = results["steady"]["endpoints"][0]["policies"]
    assert results["steady"]["budget_ample"]
    assert p["load_only"]["cost"] == p["budget_aware"]["cost"]
    assert p["cost_aware"]["sla_missed_s"] <= p["load_only"]["sla_missed_s"]


def test_the_summary_line_names_the_saving_over_ample_budgets_only(
        results: dict[str, Any]) -> None:
    s = sim.summary(list(results.values()))
    assert set(s["ample_scenarios"]) == {"mixed_ramp", "gpu_endpoint_light_load",
                                         "latency_slo_100ms", "steady"}
    line = sim.sim_line(s)
    assert line.startswith(f"sim: scenarios={len(results)} cost_aware_saved_pct=")
    assert line.endswith("budget_respected=true")
    lo = Decimal(s["load_only"]["ample_cost"])
    assert s["cost_aware_saved_pct"] == round(
        float((lo - Decimal(s["cost_aware"]["ample_cost"])) / lo * 100), 1)


def test_a_report_with_its_plots_is_written(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert sim.main(["--out", str(tmp_path), "--seed", "1", "--only", "exhaustion"]) == 0
    assert (tmp_path / "exhaustion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "[1/1] exhaustion" in out
    assert out.rstrip().splitlines()[-1].startswith("sim: scenarios=1 ")
