"""Workload event types and allocation statuses, once for every service (event values
match kestrel.v1.WorkloadEventType)."""

from __future__ import annotations

import enum
import re
from typing import Any

# On every Job the placer creates and its pod template (so Kueue's Workload carries
# them in spec.podSets[].template): which Kestrel job and tenant it belongs to.
JOB_ID_LABEL = "kestrel.dev/job-id"
TENANT_LABEL = "kestrel.dev/tenant"
# A tenant id where it may stand in a label value or a NATS subject token: 1-63 of a-z,
# 0-9 and '-', a letter or digit at each end. (The gateway creates tenants under a
# stricter bound, leaving room for the namespace prefix.) \Z, not $: "$" also matches
# before a trailing newline ("w\n" passed, then failed as a NATS subject: INTERNAL;
# found by the issue-17 fuzzer).
TENANT_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
# The Kueue API the services and the tooling speak (Kueue v0.19).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API_VERSION = "v1beta2"
# What puts a Job in a Kueue LocalQueue, and how long KWOK plays a simulated pod.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
KWOK_DURATION_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
# On every node: its pool ("gpu", "cpu", "cpu-sim") and whether it is a KWOK fake.
POOL_LABEL = "kestrel.dev/pool"
SIMULATED_LABEL = "kestrel.dev/simulated"
# On a Workload that admission deactivates (spec.active=false): why, in words a
# person reads in the job's reason ("evicted: tenant acme's budget is spent"),
# where Kueue's own condition says only "Deactivated".
EVICTION_REASON_ANNOTATION = "kestrel.dev/eviction-reason"


# The CPU pool: the real kubelet node, Kueue flavor `cpu`. Its unit is a CPU core (a
# ledger row of flavor `cpu` counts core-seconds, priced per core-second); every other
# flavor's unit is a GPU. Each tenant's ClusterQueue holds CPU_POOL_CORES of it.
CPU_FLAVOR = "cpu"
CPU_POOL_CORES = 2
# The GPU flavors of the local cluster's KWOK nodes: the placer's default
# (KESTREL_GPU_FLAVORS) and the flavors cluster/ creates.
GPU_FLAVORS = ("gpu-h100", "gpu-a10")
# On an endpoint replica's Job and pod: the endpoint it serves.
ENDPOINT_LABEL = "kestrel.dev/endpoint"


def unit_of(flavor: str) -> str:
    """What one unit of a flavor is, in the words a ledger row is shown with."""
    return "core" if flavor == CPU_FLAVOR else "GPU"


def simulated_flavor(flavor: str) -> bool:
    """Work on this flavor runs on simulated hardware: every GPU flavor is a pool of
    KWOK nodes (an empty flavor is one chosen by runway, always a GPU one); only the
    CPU pool is a real kubelet."""
    return flavor != CPU_FLAVOR


def budget_spent_reason(tenant: str) -> str:
    return f"evicted: tenant {tenant}'s budget is spent"


class EventType(enum.IntEnum):
    ADMITTED = 1
    STARTED = 2
    FINISHED = 3
    EVICTED = 4
    FAILED = 5
    QUEUED = 6
    CANCELLED = 7

    @property
    def word(self) -> str:
        """The last token of its subject: kestrel.workload.<tenant>.<word>."""
        return self.name.lower()

    @property
    def informational(self) -> bool:
        """Recorded, never metered: metering runs from Kueue admission to the close."""
        return self in (EventType.STARTED, EventType.QUEUED)

    @property
    def closes(self) -> bool:
        return self in (EventType.FINISHED, EventType.EVICTED, EventType.FAILED,
                        EventType.CANCELLED)


class AllocStatus(enum.IntEnum):
    """allocations.status: the meter writes it; admission reads CLOSED to spend a hold."""

    OPEN = 1
    CLOSED = 2
    # A close arrived before the admission: end known, start not yet.
    PENDING = 3


# Conditions of a Kubernetes object as a dict (a Workload, a Node, a ClusterQueue).
def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def condition_true(obj: dict[str, Any], ctype: str) -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == "True"
