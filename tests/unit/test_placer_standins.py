"""Which simulated GPU replicas get a host stand-in (services/placer/standins.py)."""

from __future__ import annotations

from typing import Any

import pytest

from services.placer.standins import StandIn, standin_env, wanted


def pod(phase: str = "Running", gpus: str | None = "1", endpoint: str | None = "ep-1",
        deleting: bool = False, job: str = "job-1") -> dict[str, Any]:
    labels = {"kestrel.dev/job-id": job, "kestrel.dev/tenant": "acme"}
    if endpoint:
        labels["kestrel.dev/endpoint"] = endpoint
    res: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus is not None:
        res["limits"] = {"nvidia.com/gpu": gpus}
    meta: dict[str, Any] = {"name": f"{job}-abcde", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "work", "resources": res}]},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("name", "pods", "want"), [
    ("a running GPU replica gets one, named after its job",
     [pod()], StandIn("job-1", "ep-1", "acme")),
    ("a pending GPU replica waits for Kueue and its KWOK node", [pod(phase="Pending")], None),
    ("a replica that has ended gets none", [pod(phase="Succeeded")], None),
    ("a replica being deleted gets none (the endpoint shrank or its budget is spent)",
     [pod(deleting=True)], None),
    ("a CPU replica runs the worker itself on the real kubelet", [pod(gpus=None)], None),
    ("a replica holding 0 GPUs is not on a KWOK node", [pod(gpus="0")], None),
    ("a plain job is not an endpoint replica", [pod(endpoint=None)], None),
    ("no pod, no stand-in", [], None),
    ("the running pod counts when an old one is still terminating",
     [pod(deleting=True), pod()], StandIn("job-1", "ep-1", "acme")),
])
def test_wanted(name: str, pods: list[dict[str, Any]], want: StandIn | None) -> None:
    assert wanted(pods) == want, name


def test_the_stand_in_gets_the_replica_and_none_of_the_placers_secrets() -> None:
    base = {"PATH": "/usr/bin", "KESTREL_PLACER_POSTGRES_DSN": "postgresql://placer:pw@db/x",
            "KESTREL_NATS_URL": "nats://x", "KESTREL_MODEL_DIR": "/m", "PYTHONPATH": "/extra"}
    env = standin_env(base, StandIn("job-1", "ep-1", "acme"), "redis://127.0.0.1:1/0")
    assert env["PATH"] == "/usr/bin" and env["KESTREL_MODEL_DIR"] == "/m"
    assert "KESTREL_PLACER_POSTGRES_DSN" not in env and "KESTREL_NATS_URL" not in env
    assert env["KESTREL_WORKER_REPLICA"] == "job-1"
    assert env["KESTREL_WORKER_ENDPOINT"] == "ep-1" and env["KESTREL_WORKER_TENANT"] == "acme"
    assert env["KESTREL_REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert env["KESTREL_WORKER_SIMULATED"] == "1"
    assert env["KESTREL_WORKER_PORT"] == "0" and env["KESTREL_WORKER_METRICS_PORT"] == "0"
    assert env["PYTHONPATH"].endswith("/extra")
