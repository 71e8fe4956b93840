"""Issue 10: load, unstorable strings and undecodable requests get honest statuses.

Real meter, gateway and admission processes over real Postgres, NATS and Redis.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import kestrel_sdk
from kestrel_sdk import KestrelError
from kestrel_sdk.v1 import gateway_pb2, gateway_pb2_grpc, meter_pb2, meter_pb2_grpc
from tests.conftest import OPERATOR_TOKEN, Plane

pytestmark = pytest.mark.integration
Md = tuple[tuple[str, str], ...]
OP: Md = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)


def _plane_with(env: dict[str, str], tmp: Path) -> Iterator[Plane]:
    p = Plane(env, tmp)
    try:
        for name in ("meter", "gateway", "admission"):
            p.start(name)
        yield p
    finally:
        p.stop_all()


@pytest.fixture
def small_pool_plane(service_env: dict[str, str], tmp_path: Path) -> Iterator[Plane]:
    """A gateway whose Redis pool is deliberately tiny and impatient."""
    yield from _plane_with({**service_env, "KESTREL_GATEWAY_REDIS_MAX_CONNECTIONS": "2",
                            "KESTREL_GATEWAY_REDIS_WAIT_S": "0.05"}, tmp_path)


@pytest.fixture
def patient_pool_plane(service_env: dict[str, str], tmp_path: Path) -> Iterator[Plane]:
    """A gateway whose small Redis pool lets a call wait long for a connection."""
    yield from _plane_with({**service_env, "KESTREL_GATEWAY_REDIS_MAX_CONNECTIONS": "8",
                            "KESTREL_GATEWAY_REDIS_WAIT_S": "20"}, tmp_path)


async def _tenant(stub: gateway_pb2_grpc.GatewayStub, name: str) -> str:
    await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 8},
                                  rate_limit=gateway_pb2.RateLimit(per_s=100_000,
                                                                   burst=100_000)),
        initial_credits="1000000"), metadata=OP)
    key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant=name, name="k"),
                                  metadata=OP)
    return str(key.secret)


def _bad_request(err: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(err)
    assert status is not None, "a rich status with BadRequest details"
    fields: list[str] = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            fields += [v.field for v in bad.field_violations]
    return fields


async def _burst(plane: Plane, redis_url: str, calls: int, pause_ms: int,
                 tenants: int = 2) -> tuple[Counter[str], list[str]]:
    """`calls` concurrent SubmitJob calls from `tenants` tenants (rate limits far above
    the burst) while Redis is paused for `pause_ms`: each tenant's rate-limit request
    holds a Redis connection at once (a tenant's concurrent calls wait for one request
    of theirs: services.gateway.ratelimit), as under real load. Returns the outcome per
    code and the calls that answered anything but OK or a retryable refusal with
    RetryInfo."""
    addr = plane.address("gateway")
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        secrets = [await _tenant(stub, f"load-{t}") for t in range(tenants)]
    clients = [kestrel_sdk.AsyncClient(addr, api_key=s, timeout_s=120) for s in secrets]
    for c in clients:  # warm the gateway's key caches and channels
        await c.submit_job(name="warm", gpus=1, max_duration_s=60, flavor="gpu-h100")
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []

    async def submit(i: int) -> None:
        try:
            await clients[i % len(clients)].submit_job(name="load", gpus=1, max_duration_s=60,
                                            flavor="gpu-h100")
            outcomes["OK"] += 1
        except KestrelError as err:
            outcomes[err.code_name] += 1
            retryable = err.code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     grpc.StatusCode.UNAVAILABLE)
            if not retryable or err.retry_after_s is None:
                wrong.append(repr(err))

    r = aioredis.from_url(redis_url)
    try:
        await r.client_pause(pause_ms)  # all commands
        await asyncio.gather(*(submit(i) for i in range(calls)))
    finally:
        await r.aclose()
        for c in clients:
            await c.close()
    return outcomes, wrong


async def test_concurrent_submits_beyond_a_tiny_redis_pool_are_refused_retryably(
        small_pool_plane: Plane, service_env: dict[str, str]) -> None:
    # Eight tenants' requests against a pool of two connections.
    outcomes, wrong = await _burst(small_pool_plane, service_env["KESTREL_REDIS_URL"],
                                   400, pause_ms=1000, tenants=8)
    assert not wrong, f"{outcomes}: {wrong[:3]}"
    assert outcomes["UNAVAILABLE"] > 0, outcomes  # the pool's bound was reached


async def test_concurrent_submits_wait_for_a_full_redis_pool(
        patient_pool_plane: Plane, service_env: dict[str, str]) -> None:
    outcomes, wrong = await _burst(patient_pool_plane, service_env["KESTREL_REDIS_URL"],
                                   400, pause_ms=1000)
    assert not wrong, f"{outcomes}: {wrong[:3]}"
    assert outcomes == Counter({"OK": 400})


async def test_a_nul_in_a_top_up_note_is_invalid_argument_at_the_gateway_and_the_meter(
        plane: Plane) -> None:
    async with grpc.aio.insecure_channel(plane.address("gateway")) as gw_ch, \
            grpc.aio.insecure_channel(plane.address("meter")) as meter_ch:
        gw = gateway_pb2_grpc.GatewayStub(gw_ch)
        meter = meter_pb2_grpc.MeterStub(meter_ch)
        await _tenant(gw, "nul")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gw.TopUp(gateway_pb2.GatewayTopUpRequest(
                tenant="nul", amount="5", note="bad\x00note"), metadata=OP)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert _bad_request(err.value) == ["note"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await meter.TopUp(meter_pb2.TopUpRequest(tenant="nul", amount="5",
                                                     top_up_id="t\x00", note="bad\x00note"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert sorted(_bad_request(err.value)) == ["note", "top_up_id"]
        # Nothing was written: the runway still shows the initial credits alone.
        runway = (await meter.GetRunway(meter_pb2.GetRunwayRequest(tenant="nul"))).runway
        assert runway.credits == "1000000"


async def test_input_the_meter_rejects_stays_invalid_argument_with_its_fields(
        plane: Plane) -> None:
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        gw = gateway_pb2_grpc.GatewayStub(ch)
        await _tenant(gw, "picky")
        # The gateway's own checks pass these; the meter's (note <= 500, id pattern) do not.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gw.TopUp(gateway_pb2.GatewayTopUpRequest(
                tenant="picky", amount="5", top_up_id="has spaces", note="n" * 600),
                metadata=OP)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert sorted(_bad_request(err.value)) == ["note", "top_up_id"]
        # A megabyte of note: refused by the gateway itself, as INVALID_ARGUMENT too.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await gw.TopUp(gateway_pb2.GatewayTopUpRequest(
                tenant="picky", amount="5", note="n" * 1_000_000), metadata=OP)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert _bad_request(err.value) == ["note"]


# Hand-built bodies: field 1 (tag 0x0a, length-delimited) holding invalid UTF-8, and garbage.
INVALID_UTF8 = b"\x0a\x02\xff\xfe"
GARBAGE = b"\xff\xff\xff\xff"


@pytest.mark.parametrize("service", ["gateway", "meter", "admission"])
@pytest.mark.parametrize("body", [INVALID_UTF8, GARBAGE], ids=["invalid-utf8", "garbage"])
async def test_a_request_that_cannot_be_decoded_is_invalid_argument(
        plane: Plane, service: str, body: bytes) -> None:
    method = {"gateway": "/kestrel.v1.Gateway/TopUp", "meter": "/kestrel.v1.Meter/TopUp",
              "admission": "/kestrel.v1.Admission/ListHeld"}[service]
    async with grpc.aio.insecure_channel(plane.address(service)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary(method)(body, metadata=OP)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert "could not be decoded" in (err.value.details() or "")
        if service == "gateway":  # a server-streaming RPC too
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in ch.unary_stream("/kestrel.v1.Gateway/WatchJob")(body):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
