"""Transport: kestrel.v1.Admission. Called by the gateway, which has validated input."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from kestrel.errors import Violations
from kestrel.grpcserver import completes, map_errors
from kestrel.jobs import job_to_wire
from kestrel.money import fmt
from kestrel.v1 import admission_pb2, admission_pb2_grpc, common_pb2
from services.admission.core import Admission
from services.admission.domain import JobAsk, JobState

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@map_errors
class AdmissionServicer(admission_pb2_grpc.AdmissionServicer):
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def Admit(self, request: admission_pb2.AdmitRequest,
                    context: Ctx) -> admission_pb2.AdmitResponse:
        job = request.job
        v = Violations()
        if not job.job_id:
            v.add("job.job_id", "is required")
        if not job.tenant:
            v.add("job.tenant", "is required")
        if job.spec.gpus <= 0:
            v.add("job.spec.gpus", "must be positive")
        if job.spec.max_duration_s <= 0:
            v.add("job.spec.max_duration_s", "must be positive")
        v.raise_if_any()
        ask = JobAsk(job.job_id, job.tenant, job.spec.gpus, job.spec.flavor,
                     job.spec.max_duration_s, job.spec.priority,
                     rolling=bool(job.spec.endpoint_id))
        # Once begun, a decision ends committed, held and announced, deadline or not.
        out = await completes(self.admission.admit(ask, job.spec.name,
                                                   job.spec.SerializeToString(),
                                                   job.idempotency_key))
        b = out.budget
        return admission_pb2.AdmitResponse(
            decision=int(out.decision.verdict),  # type: ignore[arg-type]
            reason=out.decision.reason, reserved=fmt(out.decision.reserved),
            priced_flavor=out.decision.priced_flavor,
            runway=common_pb2.Runway(tenant=job.tenant, credits=fmt(b.credits),
                                     charged=fmt(b.charged), reserved=fmt(b.reserved),
                                     remaining=fmt(b.remaining)),
            job=job_to_wire(out.job))

    async def Release(self, request: admission_pb2.ReleaseRequest,
                      context: Ctx) -> admission_pb2.ReleaseResponse:
        row = await completes(self.admission.cancel(request.tenant, request.job_id,
                                                    request.reason))
        return admission_pb2.ReleaseResponse(released=row.state is JobState.CANCELLED,
                                             job=job_to_wire(row))

    async def ListHeld(self, request: admission_pb2.ListHeldRequest,
                       context: Ctx) -> admission_pb2.ListHeldResponse:
        rows = await self.admission.store.held(request.tenant)
        return admission_pb2.ListHeldResponse(jobs=[job_to_wire(r) for r in rows])
