"""Infer's one path, whatever the transport: gRPC `Gateway.Infer` (servicer.py) and the
OpenAI-compatible `POST /v1/embeddings` (http.py) both authenticate through Callers
(the key, then one token of the tenant's rate limit) and then call `Inference.infer`
with an InferRequest: the same field checks, the same budget gate, the same queue,
batching and replicas, the same reply checks. A transport only converts, and checks
every string of the request first, as kestrel.grpcserver.map_errors does for gRPC."""

from __future__ import annotations

from kestrel.errors import BudgetSpent, Unavailable
from kestrel_sdk.v1 import gateway_pb2
from services.gateway.endpoint_checks import check_infer
from services.gateway.endpoint_store import EndpointRow
from services.gateway.endpoints import Endpoints
from services.gateway.infer import InferBackend
from services.gateway.store import Profile


class Inference:
    def __init__(self, endpoints: Endpoints, backend: InferBackend | None,
                 placed: bool) -> None:
        self.endpoints = endpoints
        self.backend = backend
        self.placed = placed

    async def infer(self, tenant: Profile, request: gateway_pb2.InferRequest,
                    remaining_s: float | None) -> gateway_pb2.InferResponse:
        """Embed request.inputs on the caller's endpoint, waiting at most the shorter of
        request.timeout_ms and the caller's remaining time."""
        priority, timeout_s = check_infer(request, remaining_s)
        row = await self.endpoints.get(tenant.tenant, request.endpoint_id, cached=True)
        if self.backend is None:
            raise Unavailable("inference is not configured on this gateway", 5.0)
        await self._budget_gate(tenant.tenant, row)
        reply = await self.backend.infer(tenant.tenant, row.endpoint_id,
                                         list(request.inputs), priority, timeout_s)
        if reply.error:
            raise Unavailable(f"replica {reply.replica} could not serve the request: "
                              f"{reply.error}", retry_after_s=1.0)
        if len(reply.embeddings) != len(request.inputs):
            raise Unavailable(f"replica {reply.replica} answered {len(reply.embeddings)} "
                              f"vectors for {len(request.inputs)} inputs", retry_after_s=1.0)
        return gateway_pb2.InferResponse(
            embeddings=[gateway_pb2.Embedding(values=e.values) for e in reply.embeddings],
            model=reply.model, latency_ms=reply.latency_ms, replica=reply.replica,
            truncated=reply.truncated, max_input_tokens=reply.max_input_tokens,
            queue_ms=reply.queue_ms, simulated=reply.simulated,
            input_tokens=reply.input_tokens)

    async def _budget_gate(self, tenant: str, row: EndpointRow) -> None:
        """A tenant whose credits are used up is not served (the meter's runway, cached
        for a moment per tenant). With the placer, its replicas are stopped as well."""
        if not await self.endpoints.budget_spent(tenant):
            return
        then = (f"the replicas of endpoint {row.endpoint_id} were stopped; top up, then "
                "create the endpoint again" if self.placed else "top up to be served again")
        raise BudgetSpent(f"tenant {tenant!r}'s budget is spent: {then}")
