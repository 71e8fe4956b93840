"""No dead panel: every query of the Grafana dashboards returns series from a real
Prometheus scraping a real plane (gateway, admission, placer, meter, Kueue,
kube-apiserver) during a scenario with two tenants, running jobs, a held job, a
rejected one and a top-up.

deploy/grafana/endpoints.json is left out on purpose: endpoints, model workers and
the autoscaler do not exist yet (its description says it waits for them)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kestrel_sdk import AsyncClient, JobState
from kestrel_tools import cluster as kc
from kestrel_tools import prometheus
from kestrel_tools.procs import REPO
from tests.e2e.loop import NAMES, Loop, in_state, plane_env, until

pytestmark = pytest.mark.e2e
# Every alert rule of the plane, loaded and evaluating.
RULES = (REPO / "deploy" / "prometheus" / "rules" / "kestrel.yml").read_text().count("- alert:")
TOKEN = "kso_e2e-dashboards"
DASHBOARDS = REPO / "deploy" / "grafana"
WAITING = {"endpoints.json"}  # panels that can only be empty until endpoints exist


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every live dashboard's panel target."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        if path.name in WAITING:
            continue
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def concrete(expr: str) -> str:
    """What Grafana would send with every tenant selected: $tenant is a regex (.*)."""
    out = (expr.replace("$__rate_interval", "10s").replace("${tenant}", ".*")
           .replace("$tenant", ".*"))
    assert "$" not in out, f"a dashboard variable the test does not know: {out}"
    return out


@pytest.fixture
async def watched(cluster_up: kc.ClusterInfo, service_env: dict[str, str], database: str,
                  tmp_path: Path) -> AsyncIterator[tuple[Loop, prometheus.Prometheus]]:
    """The plane with /metrics on, and a Prometheus scraping it every second."""
    env = plane_env(cluster_up, service_env, TOKEN, metrics=True)
    lp = Loop(env, tmp_path, database)
    prom = prometheus.Prometheus(tmp_path / "prometheus")
    try:
        lp.start_all()
        config = await asyncio.to_thread(
            prometheus.plane_config, prom.root,
            {n: f"127.0.0.1:{env[f'KESTREL_{n.upper()}_METRICS_PORT']}" for n in NAMES}, 1.0,
            lambda s: None)
        assert {j["job_name"] for j in config["scrape_configs"]} >= {
            "kube-apiserver", "kueue", "kestrel-model-workers"}, "the cluster is up"
        await asyncio.to_thread(prom.up, config)
        yield lp, prom
    finally:
        await asyncio.to_thread(prom.down)
        lp.stop_all()


async def tenant(lp: Loop, credits: str) -> tuple[str, AsyncClient]:
    name = f"e2e{uuid.uuid4().hex[:8]}"
    lp.tenants.append(name)
    async with AsyncClient(lp.env["KESTREL_GATEWAY_ADDR"], operator_token=TOKEN) as op:
        await op.create_tenant(name, gpu_quota={"gpu-h100": 8, "gpu-a10": 8}, rate_per_s=100,
                               burst=100, initial_credits=credits)
        key = await op.create_api_key(name, "e2e")
    return name, AsyncClient(lp.env["KESTREL_GATEWAY_ADDR"], api_key=key.secret)


async def test_every_panel_query_returns_series_from_the_live_plane(
        watched: tuple[Loop, prometheus.Prometheus]) -> None:
    lp, prom = watched
    # Small: 1 GPU x 100 s x 0.01 = 1 credit, its whole budget; the next is held, and
    # one larger than the budget is rejected. Big: work on both flavors.
    small, a = await tenant(lp, "1")
    _, b = await tenant(lp, "10")
    first = await a.submit_job(name="first", gpus=1, max_duration_s=100, sim_duration_s=40,
                               flavor="gpu-h100")
    held = await a.submit_job(name="held", gpus=1, max_duration_s=100, sim_duration_s=2,
                              flavor="gpu-h100")
    refused = await a.submit_job(name="too-big", gpus=2, max_duration_s=100, flavor="gpu-h100")
    assert (first.state, held.state, refused.state) == (
        JobState.ADMITTED, JobState.HELD, JobState.REJECTED)
    for flavor in ("gpu-h100", "gpu-a10"):
        await b.submit_job(name=f"on-{flavor}", gpus=2, max_duration_s=60, sim_duration_s=30,
                           flavor=flavor)
    await until("the first job running", in_state(a, first.job_id, JobState.RUNNING))

    missing = {(d, title, concrete(e)) for d, title, e in panel_queries()}
    deadline = time.monotonic() + 60
    while missing and time.monotonic() < deadline:
        for item in sorted(missing):
            if await asyncio.to_thread(prom.query, item[2]):
                missing.discard(item)
        if missing:
            await asyncio.sleep(1)
    down = [t["labels"]["job"] for t in await asyncio.to_thread(prom.targets)
            if t["health"] != "up"]
    assert not missing, (f"dead panels (no series after 60 s): {sorted(missing)}; "
                         f"targets not up: {down}")
    assert not down, f"targets not up: {down}"
    consumers = {r["metric"]["consumer"] for r in await asyncio.to_thread(
        prom.query, "kestrel_consumer_pending_messages")}
    assert consumers == {"meter", "admission", "placer"}
    answered = {r["metric"]["job"] for r in await asyncio.to_thread(
        prom.query, "sum by (job) (kestrel_grpc_server_handled_total)")}
    assert answered >= {"kestrel-gateway", "kestrel-admission", "kestrel-meter"}
    rules = [r for g in (await asyncio.to_thread(prom.api, "rules"))["groups"]
             for r in g["rules"]]
    assert len(rules) == RULES and all(r["health"] == "ok" for r in rules), rules

    # The top-up releases the held job; Prometheus sees the release and the held count fall.
    async with AsyncClient(lp.env["KESTREL_GATEWAY_ADDR"], operator_token=TOKEN) as op:
        await op.top_up(small, "1")
    await until("the held job released", in_state(a, held.job_id, JobState.ADMITTED,
                                                  JobState.QUEUED, JobState.RUNNING,
                                                  JobState.SUCCEEDED), timeout_s=30)

    async def seen_released() -> bool | None:
        got = await asyncio.to_thread(prom.query, (
            f'kestrel_admission_decisions_total{{tenant="{small}", decision="released"}} == 1'
            f' and on() sum(kestrel_admission_held_jobs{{tenant="{small}"}}) == 0'))
        return True if got else None

    await until("Prometheus sees the release", seen_released, timeout_s=30)
    await a.close()
    await b.close()
