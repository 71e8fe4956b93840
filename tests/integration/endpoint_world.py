"""The world of the endpoint tests (test_endpoints.py, test_openai_api.py): a plane,
two tenants with keys, one endpoint of the first, model workers started on demand as
host processes; and the helpers both files call. Fixtures are in conftest.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import redis.asyncio as aioredis
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.procs import ServiceProcess
from tests.conftest import OPERATOR_TOKEN, Plane

Md = tuple[tuple[str, str], ...]
OP: Md = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)
FOOD = "A man is eating food."
BREAD = "A man is eating a piece of bread."
BABY = "The girl is carrying a baby."


@dataclass
class World:
    plane: Plane
    channel: grpc.aio.Channel
    stub: gateway_pb2_grpc.GatewayStub
    md: Md
    other_md: Md
    endpoint_id: str
    redis: aioredis.Redis
    start_worker: Callable[..., ServiceProcess]


def cos(a: Any, b: Any) -> float:
    return float(sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)))


async def make_tenant(stub: gateway_pb2_grpc.GatewayStub, name: str, rate: float = 100_000,
                      burst: int = 100_000) -> Md:
    await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant=name, rate_limit=gateway_pb2.RateLimit(
            per_s=rate, burst=burst)), initial_credits="100"), metadata=OP)
    key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant=name, name="k"),
                                  metadata=OP)
    return (("authorization", f"Bearer {key.secret}"),)


def _create(name: str) -> gateway_pb2.CreateEndpointRequest:
    return gateway_pb2.CreateEndpointRequest(spec=common_pb2.EndpointSpec(name=name))


async def answer(coro: Any) -> tuple[grpc.StatusCode, str, float | None, Any]:
    """(code, details, RetryInfo delay, response) of one call."""
    try:
        resp = await coro
        return grpc.StatusCode.OK, "", None, resp
    except grpc.aio.AioRpcError as err:
        retry = None
        status = rpc_status.from_call(err)
        for d in status.details if status else ():
            if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                d.Unpack(info)
                retry = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        return err.code(), err.details() or "", retry, None


def infer(w: World, texts: list[str], md: Md | None = None, endpoint_id: str | None = None,
          **kw: Any) -> Any:
    return w.stub.Infer(gateway_pb2.InferRequest(
        endpoint_id=endpoint_id or w.endpoint_id, inputs=texts, **kw),
        metadata=md or w.md, timeout=kw.get("timeout_ms", 10_000) / 1000 + 5)
