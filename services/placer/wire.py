"""Conversions between protobuf wire types and the placer's own types."""

from __future__ import annotations

from kestrel_sdk.v1 import common_pb2, events_pb2
from services.placer.core import AdmittedJob
from services.placer.domain import RunwayView
from services.placer.lifecycle import Derived


def admitted_from_wire(msg: events_pb2.JobAdmitted) -> AdmittedJob:
    job, spec = msg.job, msg.job.spec
    return AdmittedJob(job.job_id, job.tenant, spec.name, spec.gpus, spec.flavor,
                       spec.max_duration_s, spec.sim_duration_s, dict(spec.labels),
                       spec.endpoint_id)


def runway_from_wire(r: common_pb2.Runway) -> RunwayView:
    return RunwayView(r.remaining_bp, r.runway_s, r.unlimited)


def event_to_wire(e: Derived) -> events_pb2.WorkloadEvent:
    return events_pb2.WorkloadEvent(
        event_id=e.event_id, tenant=e.tenant, workload_id=e.workload_id,
        kind=common_pb2.WORKLOAD_KIND_JOB, type=int(e.type),  # type: ignore[arg-type]
        time_us=e.time_us, flavor=e.flavor, gpus=e.gpus, reason=e.reason,
        k8s_namespace=e.k8s_namespace, k8s_name=e.k8s_name, max_duration_s=e.max_duration_s)
