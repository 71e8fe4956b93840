"""The jobs table as read by every service (admission writes it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from decimal import Decimal

import asyncpg

from kestrel_sdk.money import fmt
from kestrel_sdk.v1 import common_pb2


class JobState(enum.IntEnum):
    # Values match kestrel.v1.JobState.
    HELD = 1
    ADMITTED = 2
    QUEUED = 3
    RUNNING = 4
    SUCCEEDED = 5
    FAILED = 6
    CANCELLED = 7
    EVICTED = 8
    REJECTED = 9

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                      JobState.EVICTED, JobState.REJECTED})


@dataclass(frozen=True)
class JobRow:
    job_id: str
    tenant: str
    spec: bytes
    state: JobState
    reason: str
    reserved: Decimal
    priced_flavor: str
    flavor: str
    flavor_reason: str
    idempotency_key: str
    created_us: int
    admitted_us: int
    started_us: int
    finished_us: int
    seq: int
    priority: int
    gpus: int
    max_duration_s: int


JOB_COLS = ("job_id, tenant, spec, state, reason, reserved, priced_flavor, flavor, "
            "flavor_reason, idempotency_key, created_us, admitted_us, started_us, finished_us, "
            "seq, priority, gpus, max_duration_s")


def job_row(r: asyncpg.Record) -> JobRow:
    return JobRow(r["job_id"], r["tenant"], bytes(r["spec"]), JobState(r["state"]), r["reason"],
                  r["reserved"], r["priced_flavor"], r["flavor"], r["flavor_reason"],
                  r["idempotency_key"], r["created_us"], r["admitted_us"], r["started_us"],
                  r["finished_us"], r["seq"], r["priority"], r["gpus"], r["max_duration_s"])


def job_to_wire(row: JobRow) -> common_pb2.Job:
    return common_pb2.Job(
        job_id=row.job_id, tenant=row.tenant, spec=common_pb2.JobSpec.FromString(row.spec),
        state=int(row.state),  # type: ignore[arg-type]
        reason=row.reason, flavor=row.flavor, flavor_reason=row.flavor_reason,
        reserved=fmt(row.reserved), created_us=row.created_us, admitted_us=row.admitted_us,
        started_us=row.started_us, finished_us=row.finished_us,
        idempotency_key=row.idempotency_key)
