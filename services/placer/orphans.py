"""Which endpoint replicas running in Kubernetes nothing will ever stop: a pure decision
over one snapshot (the replica Jobs listed from the apiserver, the endpoints as the
gateway publishes them, the job states as admission does). No I/O.

Kubernetes is the truth: a replica Job that exists is a replica that runs and bills.
The gateway stops a replica when its endpoint shrinks or is deleted, but a stop can be
lost (a deletion that raced a scaling, a gateway killed between admitting a replica and
recording it, a cancel that reached the placer before its Job was created), and then
the tenant pays for as long as it runs. The placer's reconcile ends each one found here;
the ledger follows, since ending it publishes the allocation's close at that instant.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from kestrel.workloads import ENDPOINT_LABEL, TENANT_LABEL
from services.placer.lifecycle import condition, created_us, is_true

# A replica is recorded on its endpoint only after admission admitted it and the rest
# of its batch: up to 16 replicas (an endpoint's max) whose Admit may take up to its
# 10 s timeout each, so a replica younger than this is not yet "unrecorded".
UNRECORDED_GRACE_S = 300.0


class Why(enum.Enum):
    ENDPOINT_DELETED = "endpoint_deleted"  # its endpoint is deleted, or was never there
    CANCELLED = "cancelled"  # admission cancelled its job; the Job outlived the cancel
    UNRECORDED = "unrecorded"  # its live endpoint does not list it as a replica


@dataclass(frozen=True)
class ReplicaJob:
    """A replica's Job as listed: still there, so still running or about to."""

    job_id: str
    namespace: str
    tenant: str
    endpoint_id: str
    created_us: int


@dataclass(frozen=True)
class Owner:
    """An endpoint as the gateway publishes it."""

    deleted: bool
    replicas: frozenset[str]


@dataclass(frozen=True)
class Orphan:
    job: ReplicaJob
    why: Why

    @property
    def reason(self) -> str:
        return {
            Why.ENDPOINT_DELETED: f"its endpoint {self.job.endpoint_id} is deleted",
            Why.CANCELLED: "its job was cancelled but its Job was still running",
            Why.UNRECORDED: f"its endpoint {self.job.endpoint_id} does not record it as a "
                            "replica",
        }[self.why]


def replica_job(job: Mapping[str, Any]) -> ReplicaJob | None:
    """The replica a listed Job is, or None: not a replica, already being deleted, or
    finished (a finished Job holds no quota and its allocation is closed)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    endpoint = labels.get(ENDPOINT_LABEL)
    if not endpoint or meta.get("deletionTimestamp"):
        return None
    if is_true(condition(job, "Complete")) or is_true(condition(job, "Failed")):
        return None
    return ReplicaJob(str(meta.get("name", "")), str(meta.get("namespace", "")),
                      str(labels.get(TENANT_LABEL, "")), str(endpoint), created_us(job))


def orphans(jobs: Iterable[ReplicaJob], owners: Mapping[str, Owner], cancelled: Set[str],
            now_us: int, grace_s: float = UNRECORDED_GRACE_S) -> list[Orphan]:
    """The replicas to end, each with why. `owners`: every endpoint the jobs name that
    the gateway knows (one it does not know counts as deleted); `cancelled`: those of
    the jobs admission cancelled."""
    out: list[Orphan] = []
    for job in jobs:
        owner = owners.get(job.endpoint_id)
        if owner is None or owner.deleted:
            out.append(Orphan(job, Why.ENDPOINT_DELETED))
        elif job.job_id in cancelled:
            out.append(Orphan(job, Why.CANCELLED))
        elif job.job_id not in owner.replicas and now_us - job.created_us > grace_s * 1e6:
            out.append(Orphan(job, Why.UNRECORDED))
    return out
