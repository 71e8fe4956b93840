"""An endpoint's replicas, each a Kestrel job: the gateway asks admission for it like
any job (so it passes the same budget decision, Kueue quota and runway check) and the
placer runs it as a Kueue Workload: the model worker in a pod on the real kubelet for
the CPU pool, a KWOK pod for a GPU flavor (simulated).

What makes a replica different from a job is in its JobSpec: `endpoint_id` is set, it
has no deadline, and its reservation rolls: it holds units x horizon x price for as
long as it runs (kestrel_sdk/budget.py Hold.rolling), so a tenant can never start more
replicas than its remaining budget covers for the endpoint's horizon, and when the
budget is spent the runway check deactivates them like any running work.

Pure parts (`replica_spec`; `units_of`, `horizon_of` from kestrel.endpoints, shared
with the autoscaler) are separate from the calls.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from kestrel.endpoints import DEFAULT_HORIZON_S as DEFAULT_HORIZON_S
from kestrel.endpoints import horizon_of as horizon_of
from kestrel.endpoints import units_of as units_of
from kestrel_sdk.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    common_pb2,
    placer_pb2,
    placer_pb2_grpc,
)

log = logging.getLogger("kestrel.gateway.replicas")

def replica_spec(endpoint_id: str, spec: common_pb2.EndpointSpec,
                 index: int) -> common_pb2.JobSpec:
    suffix = f"-r{index}"
    return common_pb2.JobSpec(
        name=spec.name[:63 - len(suffix)].rstrip("-") + suffix,
        gpus=units_of(spec), flavor=spec.flavor, max_duration_s=horizon_of(spec),
        endpoint_id=endpoint_id)


@dataclass(frozen=True)
class Added:
    job_ids: tuple[str, ...]  # admitted replicas, in order
    refusal: str = ""  # why the next one was not admitted (empty: all were)


class Replicas:
    """Starts and stops an endpoint's replicas through admission and the placer."""

    def __init__(self, admission: admission_pb2_grpc.AdmissionStub,
                 placer: placer_pb2_grpc.PlacerStub | None) -> None:
        self.admission = admission
        self.placer = placer

    async def add(self, tenant: str, endpoint_id: str, spec: common_pb2.EndpointSpec,
                  first_index: int, count: int, now_us: int) -> Added:
        """Ask admission for `count` replicas, stopping at the first one it does not
        admit (a held one is released at once: an endpoint never waits in the queue
        of held jobs). Idempotent per (endpoint, index) within one call: a replica
        started later under the same index is a new one."""
        admitted: list[str] = []
        nonce = uuid.uuid4().hex[:8]
        for index in range(first_index, first_index + count):
            job = common_pb2.Job(
                job_id=f"job-{uuid.uuid4().hex[:16]}", tenant=tenant,
                spec=replica_spec(endpoint_id, spec, index),
                idempotency_key=f"{endpoint_id}/replica/{index}/{nonce}", created_us=now_us)
            try:
                resp = await self.admission.Admit(admission_pb2.AdmitRequest(job=job),
                                                  timeout=10)
            except grpc.aio.AioRpcError:
                # keep nothing half-made: the ones admitted so far are stopped
                await self.stop(tenant, admitted, "the endpoint was not created")
                raise
            if resp.decision != admission_pb2.DECISION_ADMITTED:
                if resp.decision == admission_pb2.DECISION_HELD:
                    await self.stop(tenant, [resp.job.job_id], "the endpoint was not created")
                return Added(tuple(admitted), resp.reason)
            admitted.append(resp.job.job_id)
        return Added(tuple(admitted))

    async def stop(self, tenant: str, job_ids: Sequence[str], reason: str) -> None:
        """Cancel each replica: admission releases its hold, the placer deletes its Job
        (its allocation ends at this instant). A replica already ended is skipped."""
        for job_id in job_ids:
            try:
                await self.admission.Release(admission_pb2.ReleaseRequest(
                    tenant=tenant, job_id=job_id, reason=reason), timeout=10)
            except grpc.aio.AioRpcError as err:
                if err.code() not in (grpc.StatusCode.FAILED_PRECONDITION,
                                      grpc.StatusCode.NOT_FOUND):
                    raise
            if self.placer is None:
                continue
            try:
                await self.placer.CancelWorkload(placer_pb2.CancelWorkloadRequest(
                    tenant=tenant, workload_id=job_id, reason=reason), timeout=10)
            except grpc.aio.AioRpcError as err:
                # The runway check rejects a cancelled job's Workload anyway.
                log.warning("placer CancelWorkload(%s): %s", job_id, err.code().name)
