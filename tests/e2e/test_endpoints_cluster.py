"""Endpoints on the real cluster: a CPU endpoint's replica is a Kestrel job that Kueue
admits on the `cpu` flavor and the real kubelet (kestrel-cpu-0) runs: the model worker
in a container of the Kestrel image, reading requests from the plane's Redis. It is
metered per core-second like any job and stopped when the budget is spent."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from kestrel_sdk import AsyncClient, Endpoint, JobState, KestrelError
from kestrel_tools import cluster as kc
from tests.e2e.loop import Loop, allocation, in_state, plane_env, until

pytestmark = pytest.mark.e2e
TOKEN = "kso_e2e-endpoints"
FOOD, BREAD, BABY = ("A man is eating food.", "A man is eating a piece of bread.",
                     "The girl is carrying a baby.")


@pytest.fixture
async def loop(cluster_up: kc.ClusterInfo, service_env: dict[str, str], database: str,
               tmp_path: Path) -> AsyncIterator[Loop]:
    lp = Loop(plane_env(cluster_up, service_env, TOKEN), tmp_path, database)
    try:
        lp.start_all()
        yield lp
    finally:
        lp.stop_all()


def cos(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b))


def pods(tenant: str, endpoint_id: str) -> list[dict[str, Any]]:
    out = kc.kubectl("get", "pods", "-n", f"kestrel-{tenant}", "-l",
                     f"kestrel.dev/endpoint={endpoint_id}", "-o", "json", check=True).stdout
    import json
    return list(json.loads(out)["items"])


def ready(client: AsyncClient, endpoint_id: str, n: int) -> Any:
    async def check() -> Endpoint | None:
        e = await client.get_endpoint(endpoint_id)
        return e if e.ready_replicas == n else None
    return check


async def events(dsn: str, job_id: str) -> dict[int, int]:
    """type -> time_us of a job's lifecycle events as the placer published them."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT type, time_us FROM workload_events "
                                "WHERE workload_id = $1", job_id)
    finally:
        await conn.close()
    return {int(r["type"]): int(r["time_us"]) for r in rows}


async def test_a_cpu_endpoint_serves_the_real_model_from_the_real_node_metered_per_core(
        loop: Loop) -> None:
    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    created = await client.create_endpoint("embed", min_replicas=1, max_replicas=2,
                                           flavor="cpu")
    assert created.replicas == 1
    # Kueue admits it, the kubelet starts the container, the worker loads the model.
    ep = await until("a ready replica", ready(client, created.endpoint_id, 1), timeout_s=240)
    assert ep.reason == ""
    placed = pods(tenant, created.endpoint_id)
    assert len(placed) == 1
    pod = placed[0]
    assert pod["spec"]["nodeName"] == kc.NODE_NAME  # the real kubelet, not a KWOK node
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"

    got = await client.infer(created.endpoint_id, [FOOD, BREAD, BABY])
    assert len(got.embeddings) == 3 and all(len(v) == 384 for v in got.embeddings)
    assert cos(got.embeddings[0], got.embeddings[1]) > cos(got.embeddings[0], got.embeddings[2])
    job_id = got.replica  # the worker names itself after its job
    assert pod["metadata"]["labels"]["kestrel.dev/job-id"] == job_id
    job = await client.get_job(job_id)
    assert job.state is JobState.RUNNING and job.spec.flavor == "cpu"
    # The worker's own log: loaded in the pod, on the kubelet's container runtime.
    log = kc.kubectl("logs", "-n", f"kestrel-{tenant}", pod["metadata"]["name"],
                     check=True).stdout
    assert "model loaded (sha256 verified)" in log

    assert await client.delete_endpoint(created.endpoint_id) is True
    closed = await until("the replica's allocation closed",
                         lambda: allocation(loop.dsn, job_id))
    ev = await events(loop.dsn, job_id)
    # Metered exactly: 1 core from its start to the cancel, in core-µs.
    assert closed[2] == ev[7] and closed[1] == ev[7] - ev[1]
    assert (await client.get_job(job_id)).state is JobState.CANCELLED

    async def gone() -> bool | None:
        return True if not await asyncio.to_thread(pods, tenant, created.endpoint_id) else None
    await until("the replica's pod deleted", gone)
    await client.close()


async def test_a_spent_budget_stops_the_replica_and_infer_says_why(loop: Loop) -> None:
    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    created = await client.create_endpoint("embed", min_replicas=1, flavor="cpu")
    await until("a ready replica", ready(client, created.endpoint_id, 1), timeout_s=240)
    job_id = (await client.infer(created.endpoint_id, [FOOD])).replica

    async with loop.operator() as op:
        runway = await client.runway()
        await op.adjust_credits(tenant, -runway.credits, note="e2e: budget withdrawn")
    evicted = await until("the replica evicted", in_state(client, job_id, JobState.EVICTED))
    assert evicted.reason == f"evicted: tenant {tenant}'s budget is spent"
    with pytest.raises(KestrelError) as err:
        await until("Infer refused", lambda: _refused(client, created.endpoint_id),
                    timeout_s=30)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "budget is spent" in err.value.message
    closed = await until("the allocation closed", lambda: allocation(loop.dsn, job_id))
    ev = await events(loop.dsn, job_id)
    assert closed[1] == closed[2] - ev[1]  # one core, start to the eviction instant
    await client.close()


async def _refused(client: AsyncClient, endpoint_id: str) -> None:
    """Raises once Infer is refused (FAILED_PRECONDITION); None while it still answers."""
    try:
        await client.infer(endpoint_id, [FOOD], timeout_s=2)
    except KestrelError as e:
        if e.code is grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return None


async def test_creating_an_endpoint_the_budget_cannot_hold_keeps_nothing(loop: Loop) -> None:
    # 1 core x 600 s x 0.0005 = 0.3 credits per replica for the default horizon.
    client = await loop.tenant("0.5")
    tenant = loop.tenants[-1]
    with pytest.raises(KestrelError) as err:
        await client.create_endpoint("too-many", min_replicas=2, max_replicas=2, flavor="cpu")
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert await client.list_endpoints() == []
    # The first replica was admitted before the second was refused: its hold is released
    # and its Job (if the placer wrote it already) deleted.

    async def nothing_kept() -> bool | None:
        jobs = (await asyncio.to_thread(kc.kubectl, "get", "jobs", "-n", f"kestrel-{tenant}",
                                        "-o", "name", check=False)).stdout.split()
        runway = await client.runway()
        return True if not jobs and runway.reserved == 0 else None
    await until("no Job and no hold left", nothing_kept, timeout_s=30)
    await client.close()


async def test_a_gpu_endpoint_answers_from_a_host_stand_in_and_says_it_is_simulated(
        loop: Loop) -> None:
    """A GPU replica is a KWOK pod (Kueue admits it on GPU quota, the meter counts its
    GPU-seconds); the placer runs the worker on the host in its place while it runs."""
    import redis.asyncio as aioredis

    from kestrel import endpoints as ep

    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    created = await client.create_endpoint("embed-gpu", min_replicas=1, flavor="gpu-a10")
    assert created.simulated and created.flavor == "gpu-a10"
    await until("a ready stand-in", ready(client, created.endpoint_id, 1), timeout_s=120)
    [pod] = pods(tenant, created.endpoint_id)
    node = kc.kubectl("get", "node", pod["spec"]["nodeName"], "-o",
                      "jsonpath={.metadata.annotations.kwok\\.x-k8s\\.io/node}",
                      check=True).stdout
    assert node == "fake"  # a KWOK node: the GPU is simulated

    got = await client.infer(created.endpoint_id, [FOOD, BREAD, BABY])
    assert got.simulated and got.replica == pod["metadata"]["labels"]["kestrel.dev/job-id"]
    assert cos(got.embeddings[0], got.embeddings[1]) > cos(got.embeddings[0], got.embeddings[2])
    job_id = got.replica
    assert (await client.get_job(job_id)).spec.flavor == "gpu-a10"

    assert await client.delete_endpoint(created.endpoint_id)
    closed = await until("the allocation closed", lambda: allocation(loop.dsn, job_id))
    ev = await events(loop.dsn, job_id)
    assert closed[2] == ev[7] and closed[1] == ev[7] - ev[1]  # 1 GPU, admission to cancel
    r = aioredis.Redis.from_url(loop.env["KESTREL_REDIS_URL"])

    async def left() -> bool | None:  # the stand-in stopped and left the replica set
        return True if not await r.hlen(ep.replicas_key(created.endpoint_id)) else None
    try:
        await until("the stand-in gone", left, timeout_s=30)
    finally:
        await r.aclose()
    await client.close()
