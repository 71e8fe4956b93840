"""End-to-end: docker-compose.yml on the Debian docker engine, brought up and down by
testcontainers (its DockerCompose; Ryuk off, since no image can be pulled here).

Every container runs the Kestrel image built here (images/build.sh), loaded into the
engine as kestrel.dev/kestrel:local. Through the SDK, as a user would: an operator
makes a tenant, the tenant submits a job that Kueue runs on the local cluster's
simulated GPU pool, and creates a CPU endpoint whose replica the compose stack's
placer runs on the real kubelet node; Infer answers with real embeddings; the ledger
(ListMyUsage) holds the job's GPU-seconds and the endpoint's core-seconds. The ports
are a block of this test's own, so a `make compose-up` stack can keep running."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from kestrel_sdk import Client, JobState
from kestrel_tools import cluster as kc
from kestrel_tools import dockerd
from kestrel_tools import kubework as kw

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROJECT = "kestrel-e2e"
# Below the kernel's ephemeral range (32768-60999): a fixed port up there can be taken
# by any outgoing connection of the moment (one was: nats' 44222, "address in use").
PORTS = {"POSTGRES": 21432, "NATS": 21222, "NATS_MONITOR": 21822, "REDIS": 21379,
         "GATEWAY": 21051, "ADMISSION": 21052, "METER": 21053, "PLACER": 21054,
         "AUTOSCALER": 21055, "PROMETHEUS": 21090, "GATEWAY_METRICS": 9451,
         "ADMISSION_METRICS": 9452, "METER_METRICS": 9453, "PLACER_METRICS": 9454,
         "AUTOSCALER_METRICS": 9455, "GATEWAY_HTTP": 21080}
SERVICES = ["provision", "postgres", "nats", "redis", "migrate", "meter", "admission",
            "placer", "gateway", "autoscaler", "prometheus"]
ONE_SHOT = ("provision", "migrate")
WAIT_S = 240.0
TENANT = "compose-e2e"


def _env() -> dict[str, str]:
    return {"COMPOSE_PROJECT_NAME": PROJECT, "TESTCONTAINERS_RYUK_DISABLED": "true",
            "KESTREL_RUNWAY_CHECK": "kestrel-runway-compose-e2e",
            "KESTREL_AUTOSCALER_LEASE": "kestrel-autoscaler-compose-e2e",
            **{f"KESTREL_COMPOSE_{k}_PORT": str(v) for k, v in PORTS.items()}}


@pytest.fixture(scope="module")
def stack(cluster_up: kc.ClusterInfo) -> Iterator[object]:
    from testcontainers.compose import DockerCompose

    engine = dockerd.up()
    print(engine)
    dockerd.compose_plugin()
    print(dockerd.load_images())
    saved = {k: os.environ.get(k) for k in _env()}
    os.environ.update(_env())
    compose = DockerCompose(REPO, compose_file_name="docker-compose.yml", pull=False,
                            build=False, wait=True)
    try:
        compose.start()
        yield compose
    finally:
        try:
            out, err = compose.get_logs()
            print(out[-6000:], err[-3000:])
        finally:
            compose.stop()  # down --volumes
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            api = kc.api_client()
            kw.delete_tenant_queues(api, [f"kestrel-{TENANT}"])
            kc.kubectl("delete", "admissioncheck", "kestrel-runway-compose-e2e",
                       "--ignore-not-found", check=False)
            kc.kubectl("delete", "lease", "-n", "default", "kestrel-autoscaler-compose-e2e",
                       "--ignore-not-found", check=False)
            if "started" in engine:  # leave no engine behind that was not running before
                print(dockerd.down())


def _ps() -> list[dict[str, str]]:
    proc = subprocess.run(["docker", "compose", "ps", "--all", "--format", "json"],
                          cwd=REPO, env={**os.environ, **_env()}, capture_output=True,
                          text=True, check=True, timeout=60)
    text = proc.stdout.strip()
    if text.startswith("["):  # older compose: one JSON array
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _token() -> str:
    proc = subprocess.run(["docker", "compose", "exec", "-T", "gateway", "python", "-m",
                           "kestrel_tools.containers", "env"], cwd=REPO,
                          env={**os.environ, **_env()}, capture_output=True, text=True,
                          check=True, timeout=60)
    env = dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines())
    assert env["KESTREL_GATEWAY_ADDR"] == f"127.0.0.1:{PORTS['GATEWAY']}"
    return env["KESTREL_OPERATOR_TOKEN"]


def _until(what: str, probe: object, timeout_s: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()  # type: ignore[operator]
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_every_container_is_healthy_and_the_secrets_stay_out_of_others_env(
        stack: object) -> None:
    by_name = {c["Service"]: c for c in _ps()}
    assert sorted(by_name) == sorted(SERVICES)
    for name in SERVICES:
        if name in ONE_SHOT:
            assert by_name[name]["State"] == "exited" and "(0)" in by_name[name]["Status"]
        else:
            assert by_name[name]["Health"] == "healthy", by_name[name]
    inspect = subprocess.run(["docker", "inspect", by_name["meter"]["Name"]],
                             capture_output=True, text=True, check=True, timeout=60)
    config = json.loads(inspect.stdout)[0]
    assert config["Config"]["User"] == "10001:10001"
    assert config["HostConfig"]["ReadonlyRootfs"] is True
    assert config["HostConfig"]["NetworkMode"] == "host"


def test_a_job_runs_an_endpoint_infers_and_the_ledger_holds_both(stack: object) -> None:
    addr = f"127.0.0.1:{PORTS['GATEWAY']}"
    with Client(addr, operator_token=_token(), timeout_s=30) as op:
        op.create_tenant(TENANT, gpu_quota={"gpu-h100": 8, "gpu-a10": 8}, rate_per_s=50,
                         burst=100, initial_credits=Decimal("50"))
        key = op.create_api_key(TENANT, "e2e")
    with Client(addr, api_key=key.secret, timeout_s=30) as me:
        job = me.submit_job(name="compose", gpus=1, max_duration_s=60, flavor="gpu-a10",
                            sim_duration_s=2)

        def finished() -> JobState | None:
            j = me.get_job(job.job_id)
            return j.state if j.terminal else None

        assert _until("job finished", finished) == JobState.SUCCEEDED
        rows = _until("job metered", lambda: list(me.usage(workload_id=job.job_id)))
        assert sum(r.gpu_us for r in rows) > 0  # type: ignore[attr-defined]

        endpoint = me.create_endpoint("embed", min_replicas=1, max_replicas=1, flavor="cpu")

        def answered() -> object:
            try:
                return me.infer(endpoint.endpoint_id, ["a compose stack", "serves the model"])
            except Exception:  # not serving yet: its replica pod is starting
                return None

        result = _until("infer answered", answered)
        vectors = result.embeddings  # type: ignore[attr-defined]
        assert len(vectors) == 2 and len(vectors[0]) == 384
        assert not result.simulated  # type: ignore[attr-defined]
        # The same texts through the OpenAI-compatible port compose exposes.
        req = urllib.request.Request(
            f"http://127.0.0.1:{PORTS['GATEWAY_HTTP']}/v1/embeddings",
            json.dumps({"model": "embed", "input": ["a compose stack", "serves the model"],
                        "encoding_format": "float"}).encode(),
            {"Authorization": f"Bearer {key.secret}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.loads(resp.read())
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert body["usage"]["prompt_tokens"] > 0
        assert max(abs(a - b) for a, b in zip(body["data"][0]["embedding"], vectors[0],
                                              strict=True)) < 1e-4
        me.delete_endpoint(endpoint.endpoint_id)

        def endpoint_metered() -> list[object]:
            return [r for r in me.usage() if r.flavor == "cpu" and r.gpu_us > 0]

        assert _until("endpoint metered", endpoint_metered)
