"""The autoscaler's live loop on the real cluster: load grows a CPU endpoint's replicas
on the real kubelet, a spent budget takes it to zero (Infer then says why), a top-up
brings its floor back. Every change goes through the gateway's internal Replicas
service, so each new replica is admitted against the budget and placed by Kueue like
any job."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from nats.js.api import DeliverPolicy

from kestrel import bus
from kestrel_sdk import AsyncClient, Endpoint, KestrelError
from kestrel_sdk.v1 import autoscaler_pb2, autoscaler_pb2_grpc, events_pb2
from kestrel_tools import cluster as kc
from kestrel_tools.devstack import free_port
from tests.e2e.loop import Loop, plane_env, until

pytestmark = pytest.mark.e2e
TOKEN = "kso_e2e-autoscaler"
TEXTS = ["A man is eating food."] * 8


@pytest.fixture
async def loop(cluster_up: kc.ClusterInfo, service_env: dict[str, str], database: str,
               tmp_path: Path) -> AsyncIterator[Loop]:
    env = plane_env(cluster_up, service_env, TOKEN)
    port = free_port()
    env |= {"KESTREL_AUTOSCALER_PORT": str(port), "KESTREL_AUTOSCALER_ADDR": f"127.0.0.1:{port}",
            # each test its own Lease, short, so a killed leader is replaced within seconds
            "KESTREL_AUTOSCALER_LEASE": f"e2e-autoscaler-{uuid.uuid4().hex[:6]}",
            "KESTREL_AUTOSCALER_LEASE_S": "3",
            "KESTREL_AUTOSCALER_METRICS_PORT": "0", "KESTREL_AUTOSCALER_INTERVAL_S": "0.5",
            # short windows so a test sees a whole cycle; one replica takes ~2 requests/s
            "KESTREL_AUTOSCALER_STABLE_WINDOW_S": "6", "KESTREL_AUTOSCALER_PANIC_WINDOW_S": "2",
            "KESTREL_AUTOSCALER_SCALE_UP_COOLDOWN_S": "1",
            "KESTREL_AUTOSCALER_SCALE_DOWN_COOLDOWN_S": "5",
            "KESTREL_AUTOSCALER_REPLICA_RPS": "2",
            # a CPU replica pinned at 2 requests/s (not the measured rate, which depends
            # on the machine) and a simulated gpu-a10 one at 6: at the e2e prices (a10 at
            # twice the CPU's) one a10 is the cheapest way to serve more than 2 a second
            "KESTREL_AUTOSCALER_FLAVOR_RATES": "cpu=2:147:4,gpu-a10=6:20:15"}
    lp = Loop(env, tmp_path, database)
    try:
        lp.start_all()
        lp.start("autoscaler")
        yield lp
    finally:
        lp.stop_all()


def replicas(client: AsyncClient, endpoint_id: str, n: int,
             ready: int | None = None) -> Callable[[], Awaitable[Endpoint | None]]:
    async def check() -> Endpoint | None:
        e = await client.get_endpoint(endpoint_id)
        ok = e.replicas == n and (ready is None or e.ready_replicas == ready)
        return e if ok else None
    return check


async def test_load_grows_the_endpoint_a_spent_budget_empties_it_a_top_up_restores_it(
        loop: Loop, clean_bus: str) -> None:
    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    e = await client.create_endpoint("embed", min_replicas=1, max_replicas=2, flavor="cpu")
    await until("the first replica ready", replicas(client, e.endpoint_id, 1, ready=1),
                timeout_s=180)

    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            try:
                await client.infer(e.endpoint_id, TEXTS, timeout_s=10)
            except KestrelError:
                await asyncio.sleep(0.2)

    clients = [asyncio.create_task(load()) for _ in range(6)]
    try:
        grown = await until("a second replica for the load",
                            replicas(client, e.endpoint_id, 2, ready=2),
                            timeout_s=180)
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert grown.replicas == 2
    pods = kc.kubectl("get", "pods", "-n", f"kestrel-{tenant}", "-l",
                      f"kestrel.dev/endpoint={e.endpoint_id}", "-o",
                      "jsonpath={.items[*].spec.nodeName}", check=True).stdout.split()
    assert pods == [kc.NODE_NAME, kc.NODE_NAME]  # both on the real kubelet

    async with loop.operator() as op:
        r = await client.runway()
        await op.adjust_credits(tenant, -r.unspent, note="e2e: budget withdrawn")
    await until("zero replicas", replicas(client, e.endpoint_id, 0),
                timeout_s=60)

    async def refused() -> KestrelError | None:  # the gateway's view of it is 2 s old at most
        try:
            await client.infer(e.endpoint_id, TEXTS, timeout_s=1)
        except KestrelError as err:
            return err if err.code is grpc.StatusCode.FAILED_PRECONDITION else None
        return None
    err = await until("Infer refused: the budget is spent", refused, timeout_s=15)
    assert "budget is spent" in err.message
    async with grpc.aio.insecure_channel(loop.env["KESTREL_AUTOSCALER_ADDR"]) as ch:
        state = await autoscaler_pb2_grpc.AutoscalerStub(ch).GetScaleState(
            autoscaler_pb2.GetScaleStateRequest(tenant=tenant, endpoint_id=e.endpoint_id))
    assert (state.target_replicas, state.reason) == (0, "runway_exhausted")

    async with loop.operator() as op:
        await op.top_up(tenant, "10")

    async def back() -> Endpoint | None:
        got = await client.get_endpoint(e.endpoint_id)
        return got if got.ready_replicas >= 1 else None
    await until("replicas back after the top-up", back, timeout_s=180)

    async def served() -> int | None:  # the gateway's view of the top-up is 2 s old at most
        try:
            return len((await client.infer(e.endpoint_id, TEXTS)).embeddings)
        except KestrelError as err:
            if err.code is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return None
    assert await until("Infer served after the top-up", served, timeout_s=15) == 8

    # Every change was published with its reason, in order.
    nc = await bus.connect(clean_bus, "e2e-autoscaler")
    seen: list[events_pb2.EndpointScaled] = []
    sub = await nc.jetstream().subscribe(f"kestrel.endpoint.{tenant}.>",
                                         ordered_consumer=True,
                                         deliver_policy=DeliverPolicy.ALL)
    try:
        while True:
            msg = await sub.next_msg(timeout=2)
            seen.append(events_pb2.EndpointScaled.FromString(msg.data))
    except Exception:
        pass
    await nc.close()
    steps = [(m.from_replicas, m.to_replicas, m.reason) for m in seen]
    assert steps[0][:2] == (1, 2) and steps[0][2] in ("scale_up", "max_replicas_block"), steps
    assert all(a != b for a, b, _ in steps), steps  # published only when the size changed
    exhausted = [i for i, s in enumerate(steps) if s[1] == 0]
    assert exhausted and steps[exhausted[0]][2] == "runway_exhausted", steps
    # The top-up brought it back: the first change after the exhaustion, whatever the
    # autoscaler did since (a scale-down once the load stopped, on a slow run).
    back_step = steps[exhausted[0] + 1:]
    assert back_step and back_step[0][0] == 0 and back_step[0][1] >= 1, steps
    assert back_step[0][2] in ("warm_pool_floor", "scale_from_zero"), steps
    await client.close()


def holder(lease: str) -> str:
    return kc.kubectl("get", "lease", "-n", "default", lease, "-o",
                      "jsonpath={.spec.holderIdentity}", check=False).stdout.strip()


async def test_one_autoscaler_leads_and_a_killed_leader_is_replaced_within_seconds(
        loop: Loop) -> None:
    """Two autoscalers share the Lease: one acts. kill -9 of it: the other takes the
    Lease once it expires (3 s) and acts; the endpoint keeps exactly its replicas (a
    decision sets a count, so one applied again changes nothing)."""
    second = free_port()
    loop.env |= {"KESTREL_AUTOSCALER_PORT": str(second),
                 "KESTREL_AUTOSCALER_ADDR": f"127.0.0.1:{second}"}
    loop.start("autoscaler")  # procs["autoscaler"] is now the second one
    b = loop.procs["autoscaler"]
    a = next(p for p in loop.started if p.name == "autoscaler" and p is not b)
    lease = loop.env["KESTREL_AUTOSCALER_LEASE"]
    first = await until("a leader", lambda: _value(holder(lease)), timeout_s=30)
    pids = {a.proc.pid: a, b.proc.pid: b}  # type: ignore[union-attr]
    leader = next(p for pid, p in pids.items() if f"-{pid}-" in first)
    follower = b if leader is a else a

    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    e = await client.create_endpoint("embed", min_replicas=1, max_replicas=2, flavor="cpu")
    await until("a ready replica", replicas(client, e.endpoint_id, 1, ready=1), timeout_s=180)

    async def decided(addr: str) -> autoscaler_pb2.GetScaleStateResponse | None:
        async with grpc.aio.insecure_channel(addr) as ch:
            try:
                got: autoscaler_pb2.GetScaleStateResponse = await autoscaler_pb2_grpc \
                    .AutoscalerStub(ch).GetScaleState(autoscaler_pb2.GetScaleStateRequest(
                        tenant=tenant, endpoint_id=e.endpoint_id))
            except grpc.aio.AioRpcError:
                return None
            return got

    got = await until("the leader's decision", lambda: decided(leader.grpc_address))
    assert got.reason == "warm_pool_floor" and got.target_replicas == 1
    assert await decided(follower.grpc_address) is None  # a follower decides nothing

    leader.kill9()
    t0 = asyncio.get_running_loop().time()
    after = await until("another leader", lambda: _value(
        None if holder(lease) in ("", first) else holder(lease)), timeout_s=30)
    took = asyncio.get_running_loop().time() - t0
    assert f"-{follower.proc.pid}-" in after  # type: ignore[union-attr]
    assert took < 10, took
    got = await until("the new leader's decision", lambda: decided(follower.grpc_address))
    assert got.target_replicas == 1
    await asyncio.sleep(2)
    assert (await client.get_endpoint(e.endpoint_id)).replicas == 1
    await client.close()


async def _value(v: str | None) -> str | None:
    return v or None


async def test_a_budget_that_pays_for_one_replica_caps_the_load_until_a_top_up(
        loop: Loop) -> None:
    """1 core x 60 s x 0.0005 = 0.03 credits a replica over its horizon; 0.05 credits
    pay for one, so the load that wants two is held at one (cost_budget_block) for as
    long as it lasts, and a top-up lets the endpoint grow."""
    client = await loop.tenant("0.05")
    tenant = loop.tenants[-1]
    e = await client.create_endpoint("embed", min_replicas=1, max_replicas=2, flavor="cpu",
                                     horizon_s=60)
    await until("the first replica ready", replicas(client, e.endpoint_id, 1, ready=1),
                timeout_s=180)
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            try:
                await client.infer(e.endpoint_id, TEXTS, timeout_s=10)
            except KestrelError:
                await asyncio.sleep(0.2)

    async def reason() -> str:
        async with grpc.aio.insecure_channel(loop.env["KESTREL_AUTOSCALER_ADDR"]) as ch:
            try:
                got = await autoscaler_pb2_grpc.AutoscalerStub(ch).GetScaleState(
                    autoscaler_pb2.GetScaleStateRequest(tenant=tenant,
                                                        endpoint_id=e.endpoint_id))
            except grpc.aio.AioRpcError:
                return ""
            return str(got.reason)

    async def blocked() -> str | None:
        r = await reason()
        return r if r == "cost_budget_block" else None

    clients = [asyncio.create_task(load()) for _ in range(6)]
    try:
        await until("the cost block under load", blocked, timeout_s=60)
        for _ in range(10):  # while the load lasts, the budget holds it at one
            await asyncio.sleep(0.5)
            assert (await client.get_endpoint(e.endpoint_id)).replicas == 1
        async with loop.operator() as op:
            await op.top_up(tenant, "10")
        grown = await until("a second replica after the top-up",
                            replicas(client, e.endpoint_id, 2), timeout_s=120)
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert grown.replicas == 2
    await client.close()


def on(client: AsyncClient, endpoint_id: str, want: dict[str, int]
       ) -> Callable[[], Awaitable[Endpoint | None]]:
    """The endpoint runs exactly `want` replicas per flavor, all of them ready."""
    async def check() -> Endpoint | None:
        e = await client.get_endpoint(endpoint_id)
        ok = dict(e.flavor_replicas) == want and dict(e.flavor_ready) == want
        return e if ok else None
    return check


async def paced(client: AsyncClient, endpoint_id: str, rps: float, stop: asyncio.Event,
                workers: int = 2) -> None:
    """`rps` Infer calls a second of 8 texts each, spread over `workers`."""
    period = workers / rps

    async def one() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            began = loop.time()
            with contextlib.suppress(KestrelError):
                await client.infer(endpoint_id, TEXTS, timeout_s=10)
            await asyncio.sleep(max(0.0, period - (loop.time() - began)))
    await asyncio.gather(*(one() for _ in range(workers)))


async def test_a_rising_load_moves_an_endpoint_from_the_cpu_pool_to_a_gpu_flavor_and_back(
        loop: Loop, clean_bus: str) -> None:
    """An endpoint on cpu that may also run on gpu-a10: at 4 requests/s one simulated
    a10 replica (6 requests/s for twice a CPU replica's price) is cheaper than the CPU
    replicas it would take, so the autoscaler starts one, and stops the CPU replica once
    the a10 is ready; at 1 request/s one CPU replica is cheaper again. Each replica is
    billed at its own flavor's price."""
    import asyncpg

    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    e = await client.create_endpoint("embed", min_replicas=1, max_replicas=3, flavor="cpu",
                                     flavors=["gpu-a10"], target_p95_ms=5000)
    assert e.flavors == ("gpu-a10",)
    await until("one ready CPU replica", on(client, e.endpoint_id, {"cpu": 1}), timeout_s=180)

    stop = asyncio.Event()
    high = asyncio.create_task(paced(client, e.endpoint_id, 4.0, stop))
    try:
        moved = await until("the endpoint on one gpu-a10 replica alone",
                            on(client, e.endpoint_id, {"gpu-a10": 1}), timeout_s=180)
    finally:
        stop.set()
        await high
    assert moved.simulated
    nodes = kc.kubectl("get", "pods", "-n", f"kestrel-{tenant}", "-l",
                       f"kestrel.dev/endpoint={e.endpoint_id}", "-o",
                       "jsonpath={.items[*].spec.nodeName}", check=True).stdout.split()
    assert set(nodes) - {kc.NODE_NAME}  # a KWOK GPU node (the CPU pod may be stopping)

    stop = asyncio.Event()
    low = asyncio.create_task(paced(client, e.endpoint_id, 1.0, stop, workers=1))
    try:
        await until("back on one CPU replica", on(client, e.endpoint_id, {"cpu": 1}),
                    timeout_s=180)
        async with grpc.aio.insecure_channel(loop.env["KESTREL_AUTOSCALER_ADDR"]) as ch:
            stub = autoscaler_pb2_grpc.AutoscalerStub(ch)

            async def settled() -> autoscaler_pb2.GetScaleStateResponse | None:
                got = await stub.GetScaleState(autoscaler_pb2.GetScaleStateRequest(
                    tenant=tenant, endpoint_id=e.endpoint_id))
                return got if dict(got.flavor_replicas) == {"cpu": 1} else None
            state = await until("the autoscaler's view of one CPU replica", settled,
                                timeout_s=30)
    finally:
        stop.set()
        await low
    assert dict(state.cheapest_mix) == {"cpu": 1} and state.demand_rps < 2
    assert dict(state.target_flavor_replicas) == {"cpu": 1}

    conn = await asyncpg.connect(loop.dsn)
    try:
        rows = await conn.fetch("SELECT DISTINCT flavor, price FROM ledger WHERE tenant = $1 "
                                "AND kind = 'usage'", tenant)
    finally:
        await conn.close()
    prices = dict(item.split("=") for item in loop.env["KESTREL_PRICES"].split(","))
    assert {r["flavor"]: r["price"] for r in rows} == {
        "cpu": Decimal(prices["cpu"]), "gpu-a10": Decimal(prices["gpu-a10"])}
    await client.close()
