"""Which endpoint replicas in Kubernetes nothing would stop (services/placer/orphans.py):
pure, over one snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from kestrel.workloads import ENDPOINT_LABEL, JOB_ID_LABEL, TENANT_LABEL
from services.placer.orphans import Owner, ReplicaJob, Why, orphans, replica_job

NOW = 1_800_000_000_000_000
S = 1_000_000


def job(job_id: str = "job-1", endpoint: str = "ep-1", age_s: float = 600) -> ReplicaJob:
    return ReplicaJob(job_id, "kestrel-acme", "acme", endpoint, NOW - int(age_s * S))


LIVE = Owner(deleted=False, replicas=frozenset({"job-1"}))


@pytest.mark.parametrize(("jobs", "owners", "cancelled", "want"), [
    pytest.param([job()], {"ep-1": LIVE}, set(), [],
                 id="a recorded replica of a live endpoint runs on"),
    pytest.param([job()], {"ep-1": Owner(True, frozenset({"job-1"}))}, set(),
                 [("job-1", Why.ENDPOINT_DELETED)],
                 id="a replica of a deleted endpoint is ended however it is recorded"),
    pytest.param([job(endpoint="ep-9")], {"ep-1": LIVE}, set(),
                 [("job-1", Why.ENDPOINT_DELETED)],
                 id="a replica of an endpoint the gateway never had is ended"),
    pytest.param([job()], {"ep-1": LIVE}, {"job-1"}, [("job-1", Why.CANCELLED)],
                 id="a replica whose job admission cancelled is ended"),
    pytest.param([job("job-2")], {"ep-1": LIVE}, set(), [("job-2", Why.UNRECORDED)],
                 id="an old replica its live endpoint does not record is ended"),
    pytest.param([job("job-2", age_s=30)], {"ep-1": LIVE}, set(), [],
                 id="a young unrecorded replica may still be being recorded and runs on"),
    pytest.param([job("job-1"), job("job-2", endpoint="ep-2")],
                 {"ep-1": LIVE, "ep-2": Owner(True, frozenset())}, set(),
                 [("job-2", Why.ENDPOINT_DELETED)],
                 id="each replica is judged by its own endpoint"),
])
def test_which_replicas_are_orphans(jobs: list[ReplicaJob], owners: dict[str, Owner],
                                    cancelled: set[str], want: list[tuple[str, Why]]) -> None:
    assert [(o.job.job_id, o.why) for o in orphans(jobs, owners, cancelled, NOW)] == want


def _job(labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    meta = {"name": "job-1", "namespace": "kestrel-acme", "labels": labels,
            "creationTimestamp": "2027-01-15T08:00:00Z", **extra.pop("meta", {})}
    return {"metadata": meta, **extra}


REPLICA = {ENDPOINT_LABEL: "ep-1", TENANT_LABEL: "acme", JOB_ID_LABEL: "job-1"}


@pytest.mark.parametrize(("body", "is_replica"), [
    pytest.param(_job(REPLICA), True, id="a replica's Job that runs is judged"),
    pytest.param(_job({TENANT_LABEL: "acme"}), False, id="a job that is no replica is not"),
    pytest.param(_job(REPLICA, meta={"deletionTimestamp": "2027-01-15T08:01:00Z"}), False,
                 id="one already being deleted is not"),
    pytest.param(_job(REPLICA, status={"conditions": [{"type": "Failed", "status": "True"}]}),
                 False, id="one that finished holds nothing and is not"),
])
def test_which_listed_jobs_are_replicas_to_judge(body: dict[str, Any], is_replica: bool) -> None:
    got = replica_job(body)
    assert (got is not None) == is_replica
    if got is not None:
        assert (got.job_id, got.tenant, got.endpoint_id) == ("job-1", "acme", "ep-1")
        assert got.created_us > 0


def test_an_orphan_says_why_in_words() -> None:
    [o] = orphans([job()], {}, set(), NOW)
    assert o.reason == "its endpoint ep-1 is deleted"
