"""kestrel.v1.Replicas, the gateway's internal service (issue 48: the autoscaler scales
through an internal RPC of the service that owns replicas, not the public API with an
operator token). On the real gateway process of the fixtures: the public port offers
no scaling at all, the internal port serves the autoscaler's two calls without
credentials, and bad input gets field violations there as everywhere."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from kestrel_sdk.v1 import replicas_pb2, replicas_pb2_grpc
from tests.integration.endpoint_world import World

pytestmark = pytest.mark.integration


def _fields(err: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(err)
    assert status is not None
    out: dict[str, str] = {}
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            out.update({v.field: v.description for v in bad.field_violations})
    return out


async def test_the_public_port_offers_no_way_to_scale(world: World) -> None:
    for method in ("/kestrel.v1.Replicas/ScaleEndpoint", "/kestrel.v1.Gateway/ScaleEndpoint"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await world.channel.unary_unary(method)(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, method


async def test_the_internal_port_lists_every_tenants_live_endpoints_without_a_token(
        world: World) -> None:
    async with grpc.aio.insecure_channel(world.plane.address("replicas")) as ch:
        stub = replicas_pb2_grpc.ReplicasStub(ch)
        every = await stub.ListLiveEndpoints(replicas_pb2.ListLiveEndpointsRequest(),
                                             timeout=10)
        assert world.endpoint_id in [e.endpoint_id for e in every.endpoints]
        acme = await stub.ListLiveEndpoints(
            replicas_pb2.ListLiveEndpointsRequest(tenant="acme"), timeout=10)
        other = await stub.ListLiveEndpoints(
            replicas_pb2.ListLiveEndpointsRequest(tenant="other"), timeout=10)
        assert [e.endpoint_id for e in acme.endpoints] == [world.endpoint_id]
        assert [e.tenant for e in acme.endpoints] == ["acme"]
        assert list(other.endpoints) == []

        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name async for r in responses for s in r.list_services_response.service}
    assert "kestrel.v1.Replicas" in names and "kestrel.v1.Gateway" not in names


Scale = replicas_pb2.ScaleEndpointRequest


@pytest.mark.parametrize(("request_of", "code", "fields"), [
    pytest.param(lambda _: Scale(endpoint_id="x", replicas=1), grpc.StatusCode.INVALID_ARGUMENT,
                 {"tenant", "endpoint_id"}, id="no tenant and a malformed id"),
    # Exactly as an id that never existed.
    pytest.param(lambda ep: Scale(tenant="other", endpoint_id=ep), grpc.StatusCode.NOT_FOUND,
                 set(), id="another tenant's endpoint"),
    # The spec's default max is 1.
    pytest.param(lambda ep: Scale(tenant="acme", endpoint_id=ep, replicas=5),
                 grpc.StatusCode.INVALID_ARGUMENT, {"replicas"}, id="past the endpoint's max"),
])
async def test_scale_refuses_bad_requests_with_their_fields_or_as_not_found(
        world: World, request_of: Callable[[str], replicas_pb2.ScaleEndpointRequest],
        code: grpc.StatusCode, fields: set[str]) -> None:
    async with grpc.aio.insecure_channel(world.plane.address("replicas")) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await replicas_pb2_grpc.ReplicasStub(ch).ScaleEndpoint(
                request_of(world.endpoint_id), timeout=10)
    assert err.value.code() == code, err.value.details()
    assert set(_fields(err.value)) == fields
