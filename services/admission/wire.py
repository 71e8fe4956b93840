"""Wire conversions for admission (and the gateway, which reads the same rows)."""

from __future__ import annotations

from kestrel.jobs import JobRow, JobState, job_to_wire
from kestrel_sdk.money import fmt
from kestrel_sdk.v1 import events_pb2


def state_changed(row: JobRow, prev: JobState | None, time_us: int) -> events_pb2.JobStateChanged:
    return events_pb2.JobStateChanged(
        job_id=row.job_id, tenant=row.tenant,
        from_state=int(prev) if prev else 0,  # type: ignore[arg-type]
        to_state=int(row.state),  # type: ignore[arg-type]
        reason=row.reason, time_us=time_us)


def job_admitted(row: JobRow) -> events_pb2.JobAdmitted:
    return events_pb2.JobAdmitted(job=job_to_wire(row), reserved=fmt(row.reserved),
                                  priced_flavor=row.priced_flavor, admitted_us=row.admitted_us)
