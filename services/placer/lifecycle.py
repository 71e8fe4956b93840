"""Workload events implied by Kubernetes objects: a pure function over their dicts.

Input is what the placer last saw of one Kestrel job (its batch/v1 Job, the
Kueue Workload that owns its quota, its pods), as the JSON dicts the
apiserver serves. Output is every event that state implies, in lifecycle
order, each with a stable id, so a restarted placer can publish them all
again and the meter and admission drop the repeats.

Times come from Kubernetes timestamps, never from the placer's clock:

- QUEUED   the Job's creationTimestamp (flavor and reason from its annotations)
- ADMITTED the Workload's Admitted=True transition (metering starts): Kueue
           reserved quota and every admission check said Ready. Without checks
           it is the QuotaReserved=True instant; with the runway check, a job
           held at the check (quota reserved, check Pending) is not metered.
- STARTED  the first container start of a pod of this allocation
- FINISHED the Workload's Finished=True transition when it succeeded
- FAILED   Finished=True otherwise; the Job's Failed condition (as the placer last
           listed the Job: Jobs are not watched) or the Workload's deletion when the
           Workload vanished while it still held quota
- EVICTED  the Workload's Evicted=True transition (e.g. Deactivated); the reason
           is admission's annotation kestrel.dev/eviction-reason when it
           deactivated the Workload ("evicted: tenant acme's budget is spent")

Kueue counts evictions in status.schedulingStats; a Workload that gets quota
again after an eviction is a new allocation, `<job_id>.r2`, `.r3`, ...
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from kestrel.workloads import (
    CPU_FLAVOR,
    EVICTION_REASON_ANNOTATION,
    JOB_ID_LABEL,
    TENANT_LABEL,
    EventType,
)

__all__ = ["JOB_ID_LABEL", "TENANT_LABEL", "EventType"]
FLAVOR_ANNOTATION = "kestrel.dev/flavor"
FLAVOR_REASON_ANNOTATION = "kestrel.dev/flavor-reason"
NAMESPACE_PREFIX = "kestrel-"
FLAVOR_NODE_LABEL = "kestrel.dev/flavor"  # on the GPU nodes (cluster/manifests/nodes.yaml)
GPU = "nvidia.com/gpu"

Obj = Mapping[str, Any]
K = TypeVar("K")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Derived:
    """One WorkloadEvent, in the placer's own terms."""

    type: EventType
    tenant: str
    job_id: str
    workload_id: str
    time_us: int
    flavor: str
    gpus: int
    reason: str
    k8s_namespace: str
    k8s_name: str
    max_duration_s: int = 0  # the Job's activeDeadlineSeconds: the meter's bound

    @property
    def event_id(self) -> str:
        return f"{self.workload_id}:{self.type.word}"


@dataclass(frozen=True)
class Observed:
    """What the placer last saw of one Kestrel job."""

    job: Obj | None = None
    workload: Obj | None = None
    pods: Sequence[Obj] = ()
    # The Workload was deleted (its last state is `workload`); `gone_us` is the
    # instant to use when it carried no deletionTimestamp.
    workload_deleted: bool = False
    gone_us: int = 0


@functools.lru_cache(maxsize=16_384)
def time_us(value: str) -> int:
    """RFC 3339 (what the apiserver writes) to integer microseconds since the epoch.
    Cached: the same stamps (a Job's creation, a condition's transition) are read on
    every event of their job, and the requeue pass reads every Job's creation each
    second."""
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def condition(obj: Obj | None, ctype: str) -> Obj | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def is_true(cond: Obj | None) -> bool:
    return cond is not None and cond.get("status") == "True"


def allocation_id(job_id: str, attempt: int) -> str:
    return job_id if attempt <= 1 else f"{job_id}.r{attempt}"


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _labels(obj: Obj | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _template_labels(workload: Obj) -> Mapping[str, str]:
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        labels = ((ps.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if JOB_ID_LABEL in labels:
            return dict(labels)
    return {}


def owner_job(workload: Obj) -> str | None:
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("apiVersion", "").startswith("batch/"):
            return str(ref.get("name"))
    return None


def identity(job: Obj | None = None, workload: Obj | None = None) -> tuple[str, str] | None:
    """(tenant, job_id) of a Kestrel job, or None for anything else."""
    for labels in (_labels(job), _template_labels(workload) if workload else {}):
        if labels.get(JOB_ID_LABEL) and labels.get(TENANT_LABEL):
            return labels[TENANT_LABEL], labels[JOB_ID_LABEL]
    if workload is not None:
        ns = (workload.get("metadata") or {}).get("namespace", "")
        name = owner_job(workload)
        if name and ns.startswith(NAMESPACE_PREFIX):
            return ns.removeprefix(NAMESPACE_PREFIX), name
    return None


def _cores(value: Any) -> int:
    """Whole CPU cores of a quantity ("2", "2000m"); 0 for anything else."""
    text = str(value or "")
    if text.endswith("m"):
        milli = _quantity(text[:-1])
        return milli // 1000 if milli % 1000 == 0 else 0
    return _quantity(text)


def _on_cpu_pool(template: Obj) -> bool:
    selector = ((template.get("spec") or {}).get("nodeSelector")) or {}
    return bool(selector.get(FLAVOR_NODE_LABEL) == CPU_FLAVOR)


def _pod_gpus(template: Obj) -> int:
    """The units a pod holds: its GPUs, or on the CPU pool its whole cores."""
    total, cpu_pool = 0, _on_cpu_pool(template)
    for c in ((template.get("spec") or {}).get("containers")) or []:
        res = c.get("resources") or {}
        if cpu_pool:
            total += _cores((res.get("requests") or {}).get("cpu") or
                            (res.get("limits") or {}).get("cpu"))
            continue
        total += _quantity((res.get("limits") or {}).get(GPU) or
                           (res.get("requests") or {}).get(GPU) or 0)
    return total


def job_gpus(job: Obj | None) -> int:
    spec = (job or {}).get("spec") or {}
    return _pod_gpus(spec.get("template") or {}) * int(spec.get("parallelism") or 1)


def assignment(workload: Obj) -> tuple[str, int]:
    """(flavor Kueue assigned, units it reserved: GPUs, or cores on the CPU pool);
    ("", 0) before admission."""
    flavor, gpus = "", 0
    for psa in ((workload.get("status") or {}).get("admission") or {}).get(
            "podSetAssignments") or []:
        flavors, usage = psa.get("flavors") or {}, psa.get("resourceUsage") or {}
        if not flavors.get(GPU) and flavors.get("cpu") == CPU_FLAVOR:
            flavor = flavor or CPU_FLAVOR
            gpus += _cores(usage.get("cpu"))
            continue
        flavor = flavor or flavors.get(GPU, "")
        gpus += _quantity(usage.get(GPU) or 0)
    if gpus == 0:
        for ps in (workload.get("spec") or {}).get("podSets") or []:
            gpus += _pod_gpus(ps.get("template") or {}) * int(ps.get("count") or 1)
    return flavor, gpus


def pinned_flavor(workload: Obj) -> str:
    """The flavor the placer pinned the pods to (before or after Kueue's assignment)."""
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        selector = ((ps.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
        if selector.get(FLAVOR_NODE_LABEL):
            return str(selector[FLAVOR_NODE_LABEL])
    return ""


def evictions(workload: Obj) -> int:
    stats = ((workload.get("status") or {}).get("schedulingStats") or {}).get("evictions") or []
    return sum(int(e.get("count") or 0) for e in stats)


def _started_us(workload: Obj, pods: Sequence[Obj], since_us: int) -> int | None:
    starts: list[int] = []
    for pod in pods:
        created = (pod.get("metadata") or {}).get("creationTimestamp")
        if created and time_us(created) < since_us:
            continue  # a pod of an earlier allocation
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            at = (state.get("running") or {}).get("startedAt") or (
                state.get("terminated") or {}).get("startedAt")
            if at:
                starts.append(time_us(at))
    if starts:
        return max(min(starts), since_us)
    ready = condition(workload, "PodsReady")
    if is_true(ready) and ready is not None and time_us(ready["lastTransitionTime"]) >= since_us:
        return time_us(ready["lastTransitionTime"])
    return None


def _words(cond: Obj, default: str) -> str:
    reason, message = cond.get("reason") or "", cond.get("message") or ""
    text = f"{reason}: {message}" if reason and message else reason or message or default
    return text[:200]


@dataclass(frozen=True)
class Waiting:
    """A Job past the grace without its Workload, and how often it was touched."""

    created_us: int
    touched_us: int = 0  # last touch (0: never)
    touches: int = 0


def requeue_due(waiting: Mapping[K, Waiting], served_us: int, now_us: int, grace_us: int,
                patience_us: int, max_backoff_us: int = 60_000_000,
                progress_us: int = 0) -> list[K]:
    """Which waiting Jobs to touch now.

    A Job is worth touching when Kueue has since given a Workload to a Job created a
    grace later (`served_us`, the newest creation among Jobs that have one: Kueue works and
    skipped this one, as a reconcile waiting out its backoff is skipped), or when Kueue
    has made no progress for `patience_us`: neither since the Job's creation nor since
    `progress_us`, the last instant any Job was seen to get its Workload. Kueue merely
    behind (a backlog: on a loaded plane 1,000 Jobs took it minutes, working through
    them oldest first) is left to work: every touch is a Job write, a watch event to
    each Job watcher and a reconcile. (Patience counted from creation alone touched
    838 Jobs of one bench-jobs backlog in one pass.) Touches of one Job back off,
    doubling from `grace_us` up to `max_backoff_us`."""
    due = []
    for key, w in waiting.items():
        # Created at least a grace before one Kueue served (timestamps are whole
        # seconds, and Kueue's reconcilers run side by side: a near twin is no sign).
        skipped = w.created_us + grace_us <= served_us
        if not skipped and now_us - max(w.created_us, progress_us) < patience_us:
            continue
        backoff = min(grace_us * 2 ** w.touches, max_backoff_us) if w.touches else 0
        if now_us - w.touched_us >= backoff:
            due.append(key)
    return due


def created_us(job: Obj | None) -> int:
    stamp = ((job or {}).get("metadata") or {}).get("creationTimestamp")
    return time_us(stamp) if stamp else 0


def awaiting_workload(job: Obj | None, workload: Obj | None, now_us: int,
                      grace_us: int) -> bool:
    """A live Job that Kueue has not given a Workload `grace_us` after its creation.

    Kueue makes the Workload when its job reconciler sees the Job. A Job created while
    the Kueue manager was down or starting is reconciled on its start-up list, and one
    whose reconcile then failed waits out controller-runtime's exponential backoff: after
    a kill -9 of Kueue here, Jobs created in those seconds got their Workload 100 s later
    (bench/chaos.py). Any update to the Job makes Kueue reconcile it at once."""
    if job is None or workload is not None:
        return False
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp") or not meta.get("creationTimestamp"):
        return False
    status = job.get("status") or {}
    if is_true(condition(job, "Complete")) or is_true(condition(job, "Failed")) or (
            status.get("completionTime")):
        return False
    return now_us - time_us(meta["creationTimestamp"]) >= grace_us


def derive(obs: Observed) -> list[Derived]:
    """Every event the observed state implies, in lifecycle order."""
    who = identity(obs.job, obs.workload)
    if who is None:
        return []
    tenant, job_id = who
    out: list[Derived] = []
    job, wl = obs.job, obs.workload
    if job is not None:
        meta = job.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if ann.get(FLAVOR_ANNOTATION) and meta.get("creationTimestamp"):
            out.append(Derived(EventType.QUEUED, tenant, job_id, job_id,
                               time_us(meta["creationTimestamp"]), ann[FLAVOR_ANNOTATION],
                               job_gpus(job), ann.get(FLAVOR_REASON_ANNOTATION, ""),
                               meta.get("namespace", ""), meta.get("name", "")))
    if wl is None:
        return out
    wmeta = wl.get("metadata") or {}
    ns, name = wmeta.get("namespace", ""), wmeta.get("name", "")
    flavor, gpus = assignment(wl)
    flavor = flavor or pinned_flavor(wl)
    gpus = gpus or job_gpus(job)

    bound = int(((job or {}).get("spec") or {}).get("activeDeadlineSeconds") or 0)

    def event(kind: EventType, wid: str, at: int, reason: str) -> Derived:
        return Derived(kind, tenant, job_id, wid, at, flavor, gpus, reason, ns, name, bound)

    admitted = condition(wl, "Admitted")
    evicted = condition(wl, "Evicted")
    why_evicted = ((wmeta.get("annotations") or {}).get(EVICTION_REASON_ANNOTATION)
                   or (_words(evicted, "evicted") if evicted is not None else ""))[:200]
    finished = condition(wl, "Finished")
    n_evicted = evictions(wl)
    if is_true(evicted) and evicted is not None:
        wid = allocation_id(job_id, max(n_evicted, 1))
        at = time_us(evicted["lastTransitionTime"])
        if is_true(admitted) and admitted is not None:
            out.append(event(EventType.ADMITTED, wid, time_us(admitted["lastTransitionTime"]),
                             _words(admitted, "admitted")))
            out.append(event(EventType.EVICTED, wid, at, why_evicted))
        elif admitted is not None and time_us(admitted["lastTransitionTime"]) >= at:
            # Admitted went False with this eviction: the allocation it ends did run.
            out.append(event(EventType.EVICTED, wid, at, why_evicted))
        return out  # evicted while it waited at a check: nothing was metered
    wid = allocation_id(job_id, n_evicted + 1)
    held = is_true(admitted) and admitted is not None
    if held and admitted is not None:
        start = time_us(admitted["lastTransitionTime"])
        out.append(event(EventType.ADMITTED, wid, start, _words(admitted, "admitted")))
        started = _started_us(wl, obs.pods, start)
        if started is not None:
            out.append(event(EventType.STARTED, wid, started, "pod running"))
    if is_true(finished) and finished is not None:
        ok = finished.get("reason") == "Succeeded"
        out.append(event(EventType.FINISHED if ok else EventType.FAILED, wid,
                         time_us(finished["lastTransitionTime"]),
                         _words(finished, "succeeded" if ok else "failed")))
        return out
    if not obs.workload_deleted or not held:
        return out
    failed = condition(job, "Failed")
    if is_true(failed) and failed is not None:
        out.append(event(EventType.FAILED, wid, time_us(failed["lastTransitionTime"]),
                         _words(failed, "failed")))
    else:
        gone = wmeta.get("deletionTimestamp")
        out.append(event(EventType.FAILED, wid, time_us(gone) if gone else obs.gone_us,
                         "deleted from Kubernetes"))
    return out


def open_allocation(events: Sequence[Derived]) -> Derived | None:
    """The ADMITTED event of the allocation still open among `events`, if any."""
    closed = {e.workload_id for e in events if e.type.closes}
    opened = [e for e in events if e.type is EventType.ADMITTED and e.workload_id not in closed]
    return opened[-1] if opened else None
