"""kestrel.v1.Autoscaler over gRPC: a thin layer over the loop's last decisions."""

from __future__ import annotations

from typing import Any

from kestrel.endpoints import ENDPOINT_ID_RE
from kestrel.errors import NotFound, Violations
from kestrel.grpcserver import map_errors
from kestrel_sdk.v1 import autoscaler_pb2, autoscaler_pb2_grpc
from services.autoscaler.core import Autoscaler


@map_errors
class AutoscalerServicer(autoscaler_pb2_grpc.AutoscalerServicer):
    def __init__(self, autoscaler: Autoscaler) -> None:
        self.autoscaler = autoscaler

    async def GetScaleState(self, request: autoscaler_pb2.GetScaleStateRequest,
                            context: Any) -> autoscaler_pb2.GetScaleStateResponse:
        v = Violations()
        if not request.tenant:
            v.add("tenant", "is required")
        if not ENDPOINT_ID_RE.match(request.endpoint_id):
            v.add("endpoint_id", "must look like ep-<16 hex digits>")
        v.raise_if_any()
        got = self.autoscaler.scale_state(request.tenant, request.endpoint_id)
        if got is None:
            raise NotFound(f"no decision yet for endpoint {request.endpoint_id} of "
                           f"{request.tenant!r} (unknown, deleted, or its tenant's runway "
                           "not seen yet)")
        return got
