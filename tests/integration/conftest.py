"""Fixtures of the integration tier beyond the root conftest's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis

from kestrel.db import migrate
from kestrel.pgroles import OWNER_ROLE
from kestrel_sdk.v1 import gateway_pb2_grpc
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from services.gateway.store import MIGRATIONS as GATEWAY_MIGRATIONS
from services.meter.store import MIGRATIONS as METER_MIGRATIONS
from tests.conftest import Plane
from tests.integration.endpoint_world import World, _create, make_tenant


@pytest.fixture
async def owner(database: str, role_dsn: Callable[[str], str]
                ) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the schema owner to this test's database, with the meter's,
    the gateway's and admission's migrations applied (the order `make up` runs them)."""
    conn = await asyncpg.connect(role_dsn(OWNER_ROLE))
    for component, directory in (("meter", METER_MIGRATIONS), ("gateway", GATEWAY_MIGRATIONS),
                                 ("admission", ADMISSION_MIGRATIONS)):
        await migrate(conn, component, directory)
    yield conn
    await conn.close()


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
