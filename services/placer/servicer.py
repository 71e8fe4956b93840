"""Transport: kestrel.v1.Placer. Thin: validate, call the core, convert back."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from kestrel.errors import Violations
from kestrel.grpcserver import map_errors
from kestrel.workloads import TENANT_ID_RE
from kestrel_sdk.v1 import placer_pb2, placer_pb2_grpc
from services.placer import manifests
from services.placer.core import Placer
from services.placer.tenancy import check_tenant_name

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@map_errors
class PlacerServicer(placer_pb2_grpc.PlacerServicer):
    def __init__(self, placer: Placer) -> None:
        self.placer = placer

    async def EnsureTenant(self, request: placer_pb2.EnsureTenantRequest,
                           context: Ctx) -> placer_pb2.EnsureTenantResponse:
        v = Violations()
        if not request.tenant:
            v.add("tenant", "is required")
        for i, q in enumerate(request.quota):
            if not q.flavor:
                v.add(f"quota[{i}].flavor", "is required")
            if q.gpus < 0:
                v.add(f"quota[{i}].gpus", "must not be negative")
            if q.borrow_gpus < 0:
                v.add(f"quota[{i}].borrow_gpus", "must not be negative")
        v.raise_if_any()
        check_tenant_name(request.tenant)
        quota = {q.flavor: q.gpus for q in request.quota} if request.quota else None
        borrow = {q.flavor: q.borrow_gpus for q in request.quota if q.borrow_gpus}
        await self.placer.tenancy.ensure_tenant(request.tenant, quota, borrow)
        return placer_pb2.EnsureTenantResponse(
            namespace=manifests.namespace_of(request.tenant), local_queue=manifests.LOCAL_QUEUE,
            cluster_queue=manifests.cluster_queue_of(request.tenant))

    async def CancelWorkload(self, request: placer_pb2.CancelWorkloadRequest,
                             context: Ctx) -> placer_pb2.CancelWorkloadResponse:
        v = Violations()
        if not request.tenant:
            v.add("tenant", "is required")
        if not request.workload_id:
            v.add("workload_id", "is required")
        v.raise_if_any()
        deleted, at = await self.placer.cancel(request.tenant, request.workload_id)
        return placer_pb2.CancelWorkloadResponse(deleted=deleted, cancelled_us=at)

    async def ListNodes(self, request: placer_pb2.ListNodesRequest,
                        context: Ctx) -> placer_pb2.ListNodesResponse:
        return placer_pb2.ListNodesResponse(nodes=await self.placer.tenancy.nodes())

    async def ListClusterQueues(self, request: placer_pb2.ListClusterQueuesRequest,
                                context: Ctx) -> placer_pb2.ListClusterQueuesResponse:
        if request.tenant and not TENANT_ID_RE.match(request.tenant):
            # It goes into a label selector: nothing but a label value may.
            v = Violations()
            v.add("tenant", "must be a tenant name (lowercase letters, digits and '-')")
            v.raise_if_any()
        return placer_pb2.ListClusterQueuesResponse(
            cluster_queues=await self.placer.tenancy.cluster_queues(request.tenant))
