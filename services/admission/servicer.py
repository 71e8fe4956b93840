"""Transport: kestrel.v1.Admission. Called by the gateway, which has validated input."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from kestrel.errors import KestrelError, Violations, to_status
from kestrel.grpcserver import completes, log_failure, map_errors, request_id
from kestrel.jobs import job_to_wire
from kestrel_sdk.money import fmt
from kestrel_sdk.v1 import admission_pb2, admission_pb2_grpc, common_pb2
from services.admission.core import Admission, Outcome, Submission
from services.admission.domain import JobAsk, JobState

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# One AdmitBatch call: its answer repeats each job with its decision, so the request is
# bounded well inside the 4 MiB a gRPC client accepts by default.
MAX_BATCH_JOBS = 1000
MAX_BATCH_BYTES = 2 << 20


def _submission(request: admission_pb2.AdmitRequest) -> Submission:
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
    return Submission(ask, job.spec.name, job.spec.SerializeToString(), job.idempotency_key)


def _response(out: Outcome) -> admission_pb2.AdmitResponse:
    b = out.budget
    job = out.job
    return admission_pb2.AdmitResponse(
        decision=int(out.decision.verdict),  # type: ignore[arg-type]
        reason=out.decision.reason, reserved=fmt(out.decision.reserved),
        priced_flavor=out.decision.priced_flavor,
        runway=common_pb2.Runway(tenant=job.tenant, credits=fmt(b.credits),
                                 charged=fmt(b.charged), reserved=fmt(b.reserved),
                                 remaining=fmt(b.remaining)),
        job=job_to_wire(job))


@map_errors
class AdmissionServicer(admission_pb2_grpc.AdmissionServicer):
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def Admit(self, request: admission_pb2.AdmitRequest,
                    context: Ctx) -> admission_pb2.AdmitResponse:
        sub = _submission(request)
        # Once begun, a decision ends committed, held and announced, deadline or not.
        return _response(await completes(self.admission.admit(
            sub.ask, sub.name, sub.spec, sub.key)))

    async def AdmitBatch(self, request: admission_pb2.AdmitBatchRequest,
                         context: Ctx) -> admission_pb2.AdmitBatchResponse:
        if len(request.requests) > MAX_BATCH_JOBS or request.ByteSize() > MAX_BATCH_BYTES:
            v = Violations()
            v.add("requests", f"at most {MAX_BATCH_JOBS} jobs and {MAX_BATCH_BYTES >> 20} "
                              "MiB per call; send the rest in another")
            v.raise_if_any()
        results = [admission_pb2.AdmitResult() for _ in request.requests]
        subs: list[tuple[int, Submission]] = []
        for i, one in enumerate(request.requests):
            try:
                subs.append((i, _submission(one)))
            except KestrelError as exc:
                results[i] = admission_pb2.AdmitResult(
                    error=to_status(exc).SerializeToString())
        outs = await completes(self.admission.admit_many([s for _, s in subs]))
        rid = request_id(context)
        for (i, sub), out in zip(subs, outs, strict=True):
            if isinstance(out, Exception):
                log_failure(f"AdmitBatch[{sub.ask.job_id}]", rid, out)
                results[i] = admission_pb2.AdmitResult(error=to_status(out).SerializeToString())
            else:
                results[i] = admission_pb2.AdmitResult(response=_response(out))
        return admission_pb2.AdmitBatchResponse(results=results)

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
