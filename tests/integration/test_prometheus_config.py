"""The Prometheus configuration kestrel_tools.prometheus generates, and the dashboards'
shape, checked by promtool and without a cluster (the live check of every panel is
tests/e2e/test_dashboards.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kestrel_tools import prometheus
from kestrel_tools.procs import REPO
from tests.e2e.test_dashboards import DASHBOARDS, concrete, panel_queries


def test_every_live_dashboard_has_panels_and_the_waiting_one_says_so() -> None:
    queries = panel_queries()
    assert len({(d, t) for d, t, _ in queries}) >= 20
    assert {d for d, _, _ in queries} == {"admission.json", "platform.json", "runway.json"}
    for _, _, expr in queries:
        concrete(expr)  # every variable is one the live test knows
    waiting = json.loads((DASHBOARDS / "endpoints.json").read_text())
    assert "WAITING FOR THE ENDPOINTS ISSUE" in waiting["description"]


def test_the_generated_configuration_passes_promtool(tmp_path: Path) -> None:
    """prometheus.yml as `make up` writes it, Kubernetes jobs included, with the
    repository's rules: promtool loads it (rules, credential files, the file_sd list)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make setup)")
    files = {n: tmp_path / n for n in ("ca.crt", "admin.crt", "admin.key", "kueue.crt", "tok")}
    for f in files.values():
        f.write_text("x")
    kube = prometheus.KubeScrape("127.0.0.1:16443", str(files["ca.crt"]),
                                 str(files["admin.crt"]), str(files["admin.key"]),
                                 "127.0.0.1:18443", str(files["kueue.crt"]), str(files["tok"]))
    metrics = {n: f"127.0.0.1:{p}" for n, p in prometheus.DEFAULT_METRICS_PORTS.items()}
    config = prometheus.scrape_config(metrics, tmp_path, kube=kube)
    path = prometheus.write_config(tmp_path, config)
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = (REPO / "deploy" / "prometheus" / "rules" / "kestrel.yml").read_text().count(
        "- alert:")
    assert f"{rules} rules found" in result.stdout + result.stderr
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    assert jobs == {"kestrel-gateway", "kestrel-admission", "kestrel-meter", "kestrel-placer",
                    "kestrel-autoscaler", "kestrel-model-workers", "kube-apiserver", "kueue"}
    assert json.loads((tmp_path / "targets" / prometheus.WORKERS_FILE).read_text()) == []
    assert (REPO / "deploy" / "prometheus" / "rules").is_dir()


def test_without_the_cluster_only_kestrel_is_scraped(tmp_path: Path) -> None:
    config = prometheus.scrape_config({"meter": "127.0.0.1:1"}, tmp_path, kube=None,
                                      scrape_interval_s=1)
    assert [j["job_name"] for j in config["scrape_configs"]] == [
        "kestrel-meter", "kestrel-model-workers"]
    assert config["global"]["scrape_interval"] == "1s"
    assert prometheus.scrape_config({}, tmp_path, kube=None, scrape_interval_s=0.5)[
        "global"]["scrape_interval"] == "500ms"


def test_worker_targets_are_a_file_sd_list_prometheus_reads(tmp_path: Path) -> None:
    path = prometheus.write_worker_targets(tmp_path, [
        ("127.0.0.1:9200", {"tenant": "acme", "endpoint": "embed", "replica": "0"})])
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9200"],
         "labels": {"tenant": "acme", "endpoint": "embed", "replica": "0"}}]
    config = prometheus.scrape_config({}, tmp_path, kube=None)
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str(path)]
    prometheus.write_config(tmp_path, config)  # keeps the list it finds
    assert len(json.loads(path.read_text())) == 1
    promtool = shutil.which("promtool")
    if promtool is not None:
        result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
