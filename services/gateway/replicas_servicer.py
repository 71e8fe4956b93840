"""Transport: kestrel.v1.Replicas, the gateway's internal service on its own port
(KESTREL_REPLICAS_PORT). The autoscaler reads every live endpoint and sets replica
counts here; the replicas themselves are the gateway's (endpoints.py), so this is the
one write path for them, as the public API is for everything a tenant or an operator
does. No operator token: like admission's and the meter's, the port is reached only by
the services that call it (loopback by default, mutual TLS and a NetworkPolicy in a
cluster). Thin: validate, call the endpoints core, convert back."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from kestrel.errors import Violations
from kestrel.grpcserver import map_errors
from kestrel_sdk.v1 import replicas_pb2, replicas_pb2_grpc
from services.gateway.endpoint_checks import check_endpoint_id
from services.gateway.endpoints import Endpoints
from services.gateway.servicer import live_endpoints_page

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@map_errors
class ReplicasServicer(replicas_pb2_grpc.ReplicasServicer):
    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints

    async def ListLiveEndpoints(self, request: replicas_pb2.ListLiveEndpointsRequest,
                                context: Ctx) -> replicas_pb2.ListLiveEndpointsResponse:
        endpoints, token = await live_endpoints_page(self.endpoints, request.tenant,
                                                     request.page_size, request.page_token)
        return replicas_pb2.ListLiveEndpointsResponse(endpoints=endpoints,
                                                      next_page_token=token)

    async def ScaleEndpoint(self, request: replicas_pb2.ScaleEndpointRequest,
                            context: Ctx) -> replicas_pb2.ScaleEndpointResponse:
        v = Violations()
        check_endpoint_id(v, request.endpoint_id)
        if not request.tenant:
            v.add("tenant", "is required")
        v.raise_if_any()
        out = await self.endpoints.scale(request.tenant, request.endpoint_id, request.replicas,
                                         request.reason, dict(request.flavor_replicas))
        return replicas_pb2.ScaleEndpointResponse(
            endpoint=await self.endpoints.wire(out.row), started=out.started,
            stopped=out.stopped, refusal=out.refusal)
