"""Fixtures: the real infrastructure (Postgres, NATS JetStream, Redis) on loopback.

One stack per test session, in its own directory with its own free ports;
each test that needs isolation gets a fresh database and clean streams.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from kestrel import bus
from kestrel.pgroles import OWNER_ROLE
from kestrel_tools.devstack import SUPERUSER, Stack, free_port, port_map
from kestrel_tools.procs import ServiceProcess


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="kestrel-test-", dir="/tmp"))
    s = Stack(root, durable=False)
    s.up()
    try:
        yield s
    finally:
        s.destroy()


@pytest.fixture
async def database(stack: Stack) -> AsyncIterator[str]:
    """The superuser's DSN of a new, empty database owned by kestrel_owner, as the
    devstack's own is (dropped afterwards). Tests inspect and seed with it; services
    get their own roles' DSNs of it (`service_env`, `role_dsn`)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(stack.postgres_admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name} OWNER {OWNER_ROLE}")
        yield stack.dsn(SUPERUSER, name)
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


def _db_name(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


@pytest.fixture
def role_dsn(stack: Stack, database: str) -> Callable[[str], str]:
    """DSN of the test's database for a Postgres role (e.g. "kestrel_meter")."""
    return lambda role: stack.dsn(role, _db_name(database))


@pytest.fixture
async def clean_bus(stack: Stack) -> AsyncIterator[str]:
    """NATS URL with every Kestrel stream empty and without consumers.

    Purged rather than deleted: JetStream can refuse to re-create a stream whose
    store it is still removing."""
    nc = await bus.connect(stack.nats_url, "test-setup")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    for spec in bus.STREAMS:
        for consumer in await js.consumers_info(spec.name):
            await js.delete_consumer(spec.name, consumer.name)
        await js.purge_stream(spec.name)
    await nc.drain()
    yield stack.nats_url


@pytest.fixture
def service_env(stack: Stack, database: str, clean_bus: str) -> dict[str, str]:
    """As an operator's: each service connects to Postgres as its own role (migrations
    as the owner) and to NATS as its own user (kestrel.natsauth)."""
    return {**stack.service_dsns(_db_name(database)), **stack.service_nats_urls(),
            "KESTREL_NATS_URL": clean_bus, "KESTREL_REDIS_URL": stack.redis_url}


@pytest.fixture
def meter_factory(service_env: dict[str, str], tmp_path: Path) -> Iterator[object]:
    """Build meter processes sharing one database and bus; all stopped at the end."""
    started: list[ServiceProcess] = []
    port = free_port()

    def make(**env: str) -> ServiceProcess:
        """A meter; KESTREL_METER_PORT in `env` serves a replica beside the others."""
        env = {**service_env, "KESTREL_METER_PORT": str(port),
               "KESTREL_METER_METRICS_PORT": "0", **env}
        proc = ServiceProcess("meter", env, f"127.0.0.1:{env['KESTREL_METER_PORT']}",
                              tmp_path / f"meter-{len(started)}.log")
        started.append(proc)
        return proc

    yield make
    for p in started:
        p.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KESTREL_SKIP_E2E") == "1":
        skip = pytest.mark.skip(reason="KESTREL_SKIP_E2E=1")
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)


OPERATOR_TOKEN = "kso_test-operator-token"
# The CLI's contexts file: never the developer's own in a test (kestrel_sdk.cli.config).
os.environ.setdefault("KESTREL_CONFIG", str(Path(tempfile.gettempdir()) /
                                            "kestrel-tests-no-config.toml"))


class Plane:
    """Meter, gateway and admission as real processes over one database and bus."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.ports = port_map("meter", "gateway", "admission", "http", "replicas")
        self.env = {**env, "KESTREL_OPERATOR_TOKEN": OPERATOR_TOKEN,
                    "KESTREL_METER_ADDR": f"127.0.0.1:{self.ports['meter']}",
                    "KESTREL_ADMISSION_ADDR": f"127.0.0.1:{self.ports['admission']}",
                    "KESTREL_METER_PORT": str(self.ports["meter"]),
                    "KESTREL_GATEWAY_PORT": str(self.ports["gateway"]),
                    # The gateway's OpenAI-compatible API (services/gateway/http.py).
                    "KESTREL_GATEWAY_HTTP_PORT": str(self.ports["http"]),
                    # Its internal kestrel.v1.Replicas (the autoscaler's).
                    "KESTREL_REPLICAS_PORT": str(self.ports["replicas"]),
                    "KESTREL_REPLICAS_ADDR": f"127.0.0.1:{self.ports['replicas']}",
                    "KESTREL_ADMISSION_PORT": str(self.ports["admission"]),
                    "KESTREL_METER_METRICS_PORT": "0", "KESTREL_ADMISSION_METRICS_PORT": "0",
                    "KESTREL_GATEWAY_METRICS_PORT": "0",
                    "KESTREL_PRICES": "gpu-h100=0.01,gpu-a10=0.001",
                    "KESTREL_METER_TICK_S": "0.2", "KESTREL_METER_SETTLE_US": "0",
                    # No Kubernetes in this tier: no runway check, no placer.
                    "KESTREL_RUNWAY_CHECK": "", "KESTREL_PLACER_ADDR": ""}
        self.tmp = tmp
        self.procs: dict[str, ServiceProcess] = {}
        self.starts = 0

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def start(self, name: str) -> ServiceProcess:
        self.starts += 1
        proc = ServiceProcess(name, self.env, self.address(name),
                              self.tmp / f"{name}-{self.starts}.log").start()
        self.procs[name] = proc
        return proc

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.stop()


@pytest.fixture
def plane(service_env: dict[str, str], tmp_path: Path) -> Iterator[Plane]:
    p = Plane(service_env, tmp_path)
    try:
        for name in ("meter", "gateway", "admission"):
            p.start(name)
        yield p
    finally:
        p.stop_all()
