"""An endpoint's replicas while creations, scalings and deletions overlap (issue 56),
over the gateway's endpoint logic on real Postgres, as the gateway's own role, with two
gateways sharing it where it matters.

Admission and the placer are replaced here by a ledger of replicas (`Replicas`): it
records which replica jobs were admitted and which stopped, and holds an admission open
on a gate until the test has made the other call, so that each interleaving that lost a
replica in `make demo` happens every time rather than one run in five. What is under
test is which replicas the endpoint records and which get stopped; the real admission
and placer are exercised by the e2e tests.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import pytest

from kestrel.clock import now_us
from kestrel.db import migrate
from kestrel.errors import NotFound
from kestrel.pgroles import OWNER_ROLE
from kestrel_sdk.v1 import common_pb2
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from services.gateway.endpoint_store import EndpointStore
from services.gateway.endpoints import Endpoints
from services.gateway.replicas import Added
from services.gateway.store import MIGRATIONS as GATEWAY_MIGRATIONS
from services.gateway.store import GatewayStore
from services.meter.store import MIGRATIONS as METER_MIGRATIONS

pytestmark = pytest.mark.integration
TENANT = "acme"


@dataclass
class Replicas:
    """Admission and the placer as far as the gateway's endpoint logic sees them:
    every replica admitted and every replica stopped. `gate`, while set, holds the next
    admission open until it is released (and says when it is being held)."""

    admitted: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    async def add(self, tenant: str, endpoint_id: str, spec: common_pb2.EndpointSpec,
                  first_index: int, count: int, now_us: int) -> Added:
        out = []
        for _ in range(count):
            gate, self.gate = self.gate, None
            if gate is not None:
                self.holding.set()
                await gate.wait()
            job_id = f"job-{next(self.ids):016x}"
            self.admitted.append(job_id)
            out.append(job_id)
        return Added(tuple(out))

    async def stop(self, tenant: str, job_ids: Sequence[str], reason: str) -> None:
        self.stopped.extend(job_ids)

    def running(self) -> set[str]:
        return set(self.admitted) - set(self.stopped)

    def hold_next(self) -> asyncio.Event:
        self.gate = asyncio.Event()
        self.holding.clear()
        return self.gate


@pytest.fixture
async def pool(database: str, role_dsn: Callable[[str], str]) -> AsyncIterator[asyncpg.Pool]:
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    for component, directory in (("meter", METER_MIGRATIONS), ("gateway", GATEWAY_MIGRATIONS),
                                 ("admission", ADMISSION_MIGRATIONS)):
        await migrate(owner, component, directory)
    await owner.close()
    conn = await asyncpg.connect(database)
    await conn.execute("INSERT INTO tenant_profiles (tenant, rate_per_s, burst, created_us) "
                       "VALUES ($1, 10, 10, $2)", TENANT, now_us())
    await conn.close()
    p = await asyncpg.create_pool(role_dsn("kestrel_gateway"), min_size=1, max_size=10)
    yield p
    await p.close()


def gateway(pool: asyncpg.Pool, replicas: Replicas) -> Endpoints:
    """One gateway's endpoint logic (its own in-process locks and caches)."""
    return Endpoints(EndpointStore(pool), GatewayStore(pool), replicas,  # type: ignore[arg-type]
                     meter=None, infer_backend=None, placed=True)  # type: ignore[arg-type]


SPEC = common_pb2.EndpointSpec(name="embed", flavor="gpu-a10", min_replicas=1, max_replicas=2)


async def recorded(pool: asyncpg.Pool, endpoint_id: str) -> set[str]:
    row = await EndpointStore(pool).get(TENANT, endpoint_id)
    assert row is not None
    return set(row.replicas)


async def created_id(pool: asyncpg.Pool) -> str:
    """The id of the endpoint a creation held at its first admission has inserted."""
    rows = await EndpointStore(pool).every_live(TENANT, 0, 10)
    assert len(rows) == 1
    return rows[0].endpoint_id


async def test_a_scaling_that_reads_an_endpoint_still_starting_keeps_its_first_replica(
        pool: asyncpg.Pool) -> None:
    """The demo's 'no ready replica within 180 s': the autoscaler saw beta's endpoint the
    moment it was inserted, with no replica recorded yet, scaled it 0 -> 1, and recorded
    only its own replica over the creation's. The creation's replica ran and billed
    unrecorded (so never counted ready); the autoscaler's waited for quota the first held.
    """
    replicas = Replicas()
    a, b = gateway(pool, replicas), gateway(pool, replicas)
    release = replicas.hold_next()
    create = asyncio.create_task(a.create(TENANT, SPEC))
    await replicas.holding.wait()  # the row is there; its first replica is being admitted
    endpoint_id = await created_id(pool)
    scale = asyncio.create_task(b.scale(TENANT, endpoint_id, 1, "warm_pool_floor"))
    await asyncio.sleep(0.3)  # the scaling is under way: it waits for the creation
    assert not scale.done()
    release.set()
    row, scaled = await create, await scale
    assert len(replicas.admitted) == 1  # one replica wanted, one started
    assert scaled.started == () and scaled.stopped == ()
    assert await recorded(pool, endpoint_id) == set(row.replicas) == replicas.running()


async def test_a_deletion_during_a_scale_up_stops_the_replica_the_scaling_started(
        pool: asyncpg.Pool) -> None:
    """The demo's acme row 'equal NO': a replica started by a scaling the deletion did not
    see ran on, billed, with nothing to stop it."""
    replicas = Replicas()
    a, b = gateway(pool, replicas), gateway(pool, replicas)
    row = await a.create(TENANT, SPEC)
    release = replicas.hold_next()
    scale = asyncio.create_task(a.scale(TENANT, row.endpoint_id, 2, "panic"))
    await replicas.holding.wait()  # the second replica is being admitted
    delete = asyncio.create_task(b.delete(TENANT, row.endpoint_id))  # another gateway
    await asyncio.sleep(0.3)
    release.set()
    await scale
    assert await delete
    assert len(replicas.admitted) == 2
    assert replicas.running() == set()  # both stopped: the deletion saw what was recorded


async def test_a_deletion_while_the_first_replica_is_admitted_leaves_none_running(
        pool: asyncpg.Pool) -> None:
    replicas = Replicas()
    a, b = gateway(pool, replicas), gateway(pool, replicas)
    release = replicas.hold_next()
    create = asyncio.create_task(a.create(TENANT, SPEC))
    await replicas.holding.wait()
    endpoint_id = await created_id(pool)
    delete = asyncio.create_task(b.delete(TENANT, endpoint_id))
    await asyncio.sleep(0.3)
    release.set()
    await create
    assert await delete
    assert replicas.admitted and replicas.running() == set()
    with pytest.raises(NotFound):
        await a.scale(TENANT, endpoint_id, 1, "operator")


async def test_a_scaling_that_lost_the_race_to_a_deletion_starts_nothing(
        pool: asyncpg.Pool) -> None:
    replicas = Replicas()
    a, b = gateway(pool, replicas), gateway(pool, replicas)
    row = await a.create(TENANT, SPEC)
    assert await b.delete(TENANT, row.endpoint_id)
    assert not await b.delete(TENANT, row.endpoint_id)  # deleted already
    with pytest.raises(NotFound):
        await a.scale(TENANT, row.endpoint_id, 2, "panic")
    assert replicas.admitted == list(row.replicas) and replicas.running() == set()


async def test_a_replica_list_is_never_recorded_on_a_deleted_endpoint(
        pool: asyncpg.Pool) -> None:
    """The last line of defence, whatever the locks: the write that records replicas
    refuses a deleted row, so its caller stops what it started."""
    store = EndpointStore(pool)
    row = await store.insert("ep-00000000000000aa", TENANT, SPEC, now_us())
    assert row is not None
    assert await store.set_replicas(TENANT, row.endpoint_id, ("job-1",))
    assert await store.delete(TENANT, row.endpoint_id, now_us()) == ("job-1",)
    assert not await store.set_replicas(TENANT, row.endpoint_id, ("job-1", "job-2"))
    assert await store.delete(TENANT, row.endpoint_id, now_us()) is None
    assert await recorded(pool, row.endpoint_id) == {"job-1"}
