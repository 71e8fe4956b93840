"""Fixtures of the integration tier beyond the root conftest's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis

from kestrel_sdk.v1 import gateway_pb2_grpc
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from tests.conftest import Plane
from tests.integration.endpoint_world import World, _create, make_tenant


@pytest.fixture
def workers(plane: Plane, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    started: list[ServiceProcess] = []

    def start(endpoint_id: str, **env: str) -> ServiceProcess:
        port = free_port()
        proc = ServiceProcess("worker", {
            **plane.env, "KESTREL_WORKER_ENDPOINT": endpoint_id, "KESTREL_WORKER_TENANT": "acme",
            "KESTREL_WORKER_PORT": str(port), "KESTREL_WORKER_METRICS_PORT": "0",
            "KESTREL_WORKER_CLAIM_IDLE_MS": "1000", **env},
            f"127.0.0.1:{port}", tmp_path / f"worker-{len(started)}.log")
        started.append(proc)
        return proc.start()

    yield start
    for p in started:
        p.stop()


@pytest.fixture
async def world(plane: Plane, workers: Callable[..., ServiceProcess]) -> AsyncIterator[World]:
    channel = grpc.aio.insecure_channel(plane.address("gateway"))
    stub = gateway_pb2_grpc.GatewayStub(channel)
    md = await make_tenant(stub, "acme")
    other = await make_tenant(stub, "other")
    created = await stub.CreateEndpoint(_create("embed"), metadata=md)
    r = aioredis.Redis.from_url(plane.env["KESTREL_REDIS_URL"])
    try:
        yield World(plane, channel, stub, md, other, created.endpoint.endpoint_id, r, workers)
    finally:
        await r.aclose()
        await channel.close()
