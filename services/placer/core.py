"""The placer's cycle: tenants, placement of admitted jobs, observation, cancel.

Placement: ensure the tenant (once per process, and whenever its quota
changes), choose the flavor from the tenant's runway, create the Job
(AlreadyExists counts as created), then feed the stored Job to the observer
like any watch event, so its QUEUED event goes out before the caller acks.

Observation: the watch threads feed Workloads, Jobs and Pods into one
asyncio queue; one task folds them into a view per Kestrel job and publishes
every event the view implies (lifecycle.derive) that it has not published
yet. A restarted placer starts with no memory and publishes every implied
event again: ids are stable, so JetStream, the meter and admission drop the
repeats.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from kestrel import checkfeed
from kestrel.clock import Clock, now_us
from kestrel.errors import FailedPrecondition, Unavailable
from kestrel.workloads import CPU_FLAVOR, TENANT_LABEL
from kestrel_sdk.v1 import events_pb2, placer_pb2
from services.placer import manifests, orphans, views
from services.placer.domain import FlavorAsk, Placement, RunwayView, choose_flavor
from services.placer.kube import JOBS, KINDS, PODS, WORKLOADS, Change, Kube
from services.placer.lifecycle import (
    FLAVOR_ANNOTATION,
    FLAVOR_REASON_ANNOTATION,
    JOB_ID_LABEL,
    NAMESPACE_PREFIX,
    Derived,
    EventType,
    Observed,
    Waiting,
    awaiting_workload,
    created_us,
    derive,
    open_allocation,
    owner_job,
    requeue_due,
)
from services.placer.standins import StandIns, wanted
from services.placer.store import PlacerStore, TenantQuota

log = logging.getLogger("kestrel.placer")

Publish = Callable[[Derived], Awaitable[None]]
PublishChecks = Callable[[list[events_pb2.CheckedWorkloads]], Awaitable[None]]
# On the observer's queue: admission asked for the full set of checked Workloads; the
# time for a numbered empty message to admission (checkfeed.Outbox.beat).
CHECK_SYNC = "check-sync"
CHECK_BEAT = "check-beat"
Key = tuple[str, str]  # (namespace, job name == Kestrel job id)

# How many jobs' events one pass of the observer publishes side by side: enough that a
# busy watch's read goes out in a few NATS writes, few enough that the first list of a
# deep queue (thousands of jobs) does not wait for thousands of acks at once.
PUBLISH_FANOUT = 256


class NoWorkerImage(RuntimeError):
    """Neither KESTREL_WORKER_IMAGE nor a readable image record names the worker image."""


def recorded_image(record: str) -> str:
    """The Kestrel image's ref in an image record ({"kestrel": {"ref": ...}}, as the
    local CPU node writes it when it imports the image)."""
    try:
        return str(json.loads(Path(record).read_text())["kestrel"]["ref"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NoWorkerImage(f"no worker image: KESTREL_WORKER_IMAGE is unset and the image "
                            f"record {record or '(none)'} cannot be read ({exc})") from exc


@dataclass(frozen=True)
class PlacerSettings:
    flavors: tuple[str, ...] = ("gpu-h100", "gpu-a10")
    runway_check: str = "kestrel-runway"
    short_bp: int = 2500
    # Endpoint replicas on the CPU pool: the model worker in the Kestrel image (empty:
    # the one recorded in worker_image_record, read at each placement: the local node
    # records the image it imported there) and the Redis it serves requests from.
    worker_image: str = ""
    worker_image_record: str = ""
    worker_redis_url: str = "redis://127.0.0.1:6379/0"
    # Run a host worker in place of each running simulated (KWOK) GPU replica.
    gpu_standins: bool = True


@dataclass(frozen=True)
class AdmittedJob:
    job_id: str
    tenant: str
    name: str
    gpus: int
    preference: str
    max_duration_s: int
    sim_duration_s: int
    labels: Mapping[str, str]
    endpoint_id: str = ""  # a replica of this endpoint (runs the model worker)


@dataclass
class View:
    job: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    workload_deleted: bool = False
    gone_us: int = 0
    created_stamp: str | None = None  # the Job's creationTimestamp ...
    created_us: int = 0  # ... and that instant, parsed once
    published: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)  # allocations whose close is out
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def empty(self) -> bool:
        return self.job is None and (self.workload is None or self.workload_deleted) and (
            not self.pods)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def key_of(kind: str, obj: Mapping[str, Any]) -> Key | None:
    meta = _meta(obj)
    ns = str(meta.get("namespace", ""))
    if not ns.startswith(NAMESPACE_PREFIX):
        return None
    if kind == WORKLOADS:
        job = owner_job(obj)
        return (ns, job) if job else None
    if kind == JOBS:
        return ns, str(meta.get("name"))
    job_id = (meta.get("labels") or {}).get(JOB_ID_LABEL)
    return (ns, str(job_id)) if job_id else None


class Placer:
    def __init__(self, kube: Kube, store: PlacerStore, publish: Publish,
                 settings: PlacerSettings, clock: Clock = now_us) -> None:
        self.kube = kube
        self.store = store
        self.publish = publish
        self.settings = settings
        self.clock = clock
        self.views: dict[Key, View] = {}
        self.runways: dict[str, RunwayView] = {}
        self.prices: dict[str, Decimal] = {}
        self.tenants: dict[str, TenantQuota] = {}  # as applied to Kubernetes
        # As last read from tenant_policies: a change there is applied by refresh();
        # an explicit EnsureTenant quota stands until the profile changes.
        self.profiles_seen: dict[str, TenantQuota] = {}
        self.tenant_locks: dict[str, asyncio.Lock] = {}
        self.cancelled: set[str] = set()
        self.queue: asyncio.Queue[tuple[str, list[Change]]] = asyncio.Queue()
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        # Host processes answering for simulated GPU replicas (None: not run here).
        self.standins: StandIns | None = None
        self.on_published: Callable[[Derived], None] = lambda e: None
        self.on_relist: Callable[[str], None] = lambda kind: None
        self.on_orphan: Callable[[orphans.Orphan], None] = lambda o: None
        # Jobs requeued by requeue_stuck: when last, and how many times.
        self.touched: dict[Key, tuple[int, int]] = {}
        # When a Job was last seen to get its Workload: Kueue's progress (requeue_due).
        self.progress_us = 0
        # What requeue_stuck reads, kept as each change is applied rather than found by
        # walking every view each second (that walk parsed every Job's creation stamp:
        # 1.5 CPU-ms a pass with 1,000 jobs held, 9.6 with 4,000). `unserved`: the Jobs
        # without a Workload, with their creation instants; `served_us`: the newest
        # creation among Jobs seen with theirs (requeue_due).
        self.unserved: dict[Key, int] = {}
        self.served_us = 0
        # The runway check's Workload fields, forwarded to admission (kestrel.checkfeed):
        # the placer's Workload watch serves both, one watch stream fewer on the apiserver.
        self.checks = checkfeed.Outbox(settings.runway_check)
        self.publish_checks: PublishChecks | None = None

    # --- tenants -------------------------------------------------------------

    def _lock(self, tenant: str) -> asyncio.Lock:
        lock = self.tenant_locks.get(tenant)
        if lock is None:
            lock = self.tenant_locks[tenant] = asyncio.Lock()
        return lock

    async def nodes(self) -> list[placer_pb2.ClusterNode]:
        """Every node, by name: its pool, whether it is simulated, what it offers."""
        items = await asyncio.to_thread(self.kube.list_nodes)
        return sorted((views.node_view(n) for n in items), key=lambda n: n.name)

    async def cluster_queues(self, tenant: str) -> list[placer_pb2.ClusterQueueView]:
        """Kestrel's ClusterQueues (one tenant's when `tenant`), by name."""
        selector = f"{manifests.MANAGED_BY_LABEL}={manifests.MANAGED_BY}"
        if tenant:
            check_tenant_name(tenant)
            selector += f",{TENANT_LABEL}={tenant}"
        items = await asyncio.to_thread(self.kube.list_cluster_queues, selector)
        return sorted((views.queue_view(q) for q in items), key=lambda q: q.name)

    async def ensure_admission_check(self) -> None:
        check = self.settings.runway_check
        if not check:
            return
        body = manifests.admission_check(check)
        if await asyncio.to_thread(self.kube.create_cluster_if_missing, "admissionchecks", body):
            log.info("created AdmissionCheck %s (controller %s)", check,
                     manifests.RUNWAY_CONTROLLER)

    async def ensure_tenant(self, tenant: str, quota: Mapping[str, int] | None = None,
                            borrow: Mapping[str, int] | None = None) -> None:
        """Namespace, ClusterQueue and LocalQueue of a tenant, created or patched.
        Without `quota`, the tenant's profile in Postgres gives it."""
        async with self._lock(tenant):
            await self._ensure_locked(tenant, quota, borrow)

    async def _ensure_locked(self, tenant: str, quota: Mapping[str, int] | None = None,
                             borrow: Mapping[str, int] | None = None) -> None:
        profile = (await self.store.profiles([tenant])).get(tenant, TenantQuota({}))
        self.profiles_seen[tenant] = profile
        if quota is not None:
            profile = TenantQuota(dict(quota), profile.suspended, dict(borrow or {}))
        await self._apply_tenant(tenant, profile)

    async def _apply_tenant(self, tenant: str, profile: TenantQuota) -> None:
        unknown = sorted(set(profile.quota) - set(self.settings.flavors))
        if unknown:
            log.warning("tenant %s: quota for unknown flavors %s ignored", tenant, unknown)
        cq = manifests.cluster_queue(tenant, profile.quota, self.settings.flavors,
                                     self.settings.runway_check, profile.suspended,
                                     profile.borrow)
        await asyncio.to_thread(self.kube.apply_namespace, manifests.namespace(tenant))
        await asyncio.to_thread(self.kube.apply_cluster, "clusterqueues", cq)
        await asyncio.to_thread(self.kube.apply_local_queue, manifests.local_queue(tenant))
        self.tenants[tenant] = profile
        log.info("tenant %s ensured: quota %s, may borrow %s%s", tenant, profile.quota,
                 profile.borrow or "nothing", " (suspended: Hold)" if profile.suspended else "")

    async def tenant_quota(self, tenant: str) -> TenantQuota:
        """The tenant's quota as applied, applying it first when unknown. A fetched batch
        is placed concurrently, so a new tenant's first burst finds it unknown many times
        at once: the first placement applies it, the others wait on its lock and find it
        applied. (Each had applied it again, five apiserver calls apiece: the placer's
        first 1,000-job burst spent 1.2 CPU-s in that, a tenth of its CPU in the run.)"""
        known = self.tenants.get(tenant)
        if known is None:
            async with self._lock(tenant):
                known = self.tenants.get(tenant)
                if known is None:
                    await self._ensure_locked(tenant)
                    known = self.tenants[tenant]
        return known

    async def refresh(self) -> None:
        """Re-read prices and the profiles of known tenants; re-apply changed quotas."""
        self.prices = await self.store.prices()
        if not self.tenants:
            return
        for tenant, profile in (await self.store.profiles(sorted(self.tenants))).items():
            if self.profiles_seen.get(tenant) != profile:
                async with self._lock(tenant):
                    await self._apply_tenant(tenant, profile)
                    self.profiles_seen[tenant] = profile

    # --- placement -----------------------------------------------------------

    def placement(self, job: AdmittedJob, profile: TenantQuota) -> Placement:
        if job.preference == CPU_FLAVOR:  # the CPU pool is one flavor: nothing to choose
            return Placement(CPU_FLAVOR, "the CPU pool (real kubelet node), as asked")
        quota = {f: profile.limit(f) for f in self.settings.flavors}
        return choose_flavor(FlavorAsk(job.gpus, job.preference, job.max_duration_s), quota,
                             self.prices, self.runways.get(job.tenant), self.settings.short_bp)

    async def cancelled_before(self, job_ids: Sequence[str]) -> set[str]:
        """Those of `job_ids` cancelled before their placement: through this placer, or
        by admission while the JobAdmitted waited (one read for all of them)."""
        return {j for j in job_ids if j in self.cancelled} | await self.store.cancelled(job_ids)

    async def place(self, job: AdmittedJob, cancelled: bool) -> Placement | None:
        """Create the Job of an admitted job (idempotent) and publish its QUEUED event.
        None when the job was cancelled before it could be placed: `cancelled` is what
        cancelled_before said of it for its batch, and a Cancel through this placer
        since then is in self.cancelled."""
        if cancelled or job.job_id in self.cancelled:
            log.info("job %s was cancelled before placement; not creating it", job.job_id)
            return None
        profile = await self.tenant_quota(job.tenant)
        chosen = self.placement(job, profile)
        worker = None
        if job.endpoint_id:
            image = self.settings.worker_image or await asyncio.to_thread(
                recorded_image, self.settings.worker_image_record)
            worker = manifests.Worker(job.endpoint_id, image, self.settings.worker_redis_url)
        plan = manifests.JobPlan(job.job_id, job.tenant, job.name, job.gpus, job.max_duration_s,
                                 job.sim_duration_s, chosen.flavor, chosen.reason, job.labels,
                                 worker)
        body = manifests.job(plan)
        try:
            stored, created = await asyncio.to_thread(self.kube.create_job, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            # The namespace went away (deleted by an operator): ensure the tenant again.
            self.tenants.pop(job.tenant, None)
            profile = await self.tenant_quota(job.tenant)
            stored, created = await asyncio.to_thread(self.kube.create_job, body)
        log.info("job %s %s in %s on %s: %s", job.job_id,
                 "created" if created else "already existed", body["metadata"]["namespace"],
                 chosen.flavor, chosen.reason)
        if job.job_id in self.cancelled:
            # A Cancel came while the Job was being created: it may have read no Job and
            # deleted nothing, so the Job just made would run (and bill) with nothing left
            # to stop it. Cancel again, now that the Job exists.
            log.warning("job %s was cancelled while its Job was created; deleting it",
                        job.job_id)
            await self.cancel(job.tenant, job.job_id)
            return None
        key = key_of(JOBS, stored)
        if key is not None:  # QUEUED now, before the ack; the Workload watch brings the rest
            # The Job as created is all the placer keeps of it: Jobs are not watched
            # (kube.WATCHED), and nothing derive() reads of a Job changes after creation.
            self._apply(JOBS, "ADDED", stored)
            view = self.views[key]
            await self._publish_new(view, derive(self._observed(view)))
        ann = _meta(stored).get("annotations") or {}
        return Placement(ann.get(FLAVOR_ANNOTATION, chosen.flavor),
                         ann.get(FLAVOR_REASON_ANNOTATION, chosen.reason),
                         chosen.short)

    # --- cancel --------------------------------------------------------------

    async def cancel(self, tenant: str, job_id: str,
                     reason: str = "cancelled by the tenant") -> tuple[bool, int]:
        """Delete the Job. An allocation still open ends now: CANCELLED at this
        instant is published first, so a crash cannot leave it open. (deleted, instant)"""
        self.cancelled.add(job_id)
        ns = manifests.namespace_of(tenant)
        job = await asyncio.to_thread(self.kube.read_job, ns, job_id)
        wl = await asyncio.to_thread(self.kube.workload_of, ns, job_id)
        view = self.views.setdefault((ns, job_id), View())
        async with view.lock:
            at = self.clock()
            still_open = open_allocation(derive(Observed(job, wl)))
            if still_open is not None:
                ended = replace(still_open, type=EventType.CANCELLED, time_us=at,
                                reason=reason)
                if ended.event_id not in view.published:
                    try:
                        await self.publish(ended)
                    except Exception as exc:
                        raise Unavailable(f"could not publish the end of {job_id}: {exc}") from exc
                    view.published.add(ended.event_id)
                    view.closed.add(ended.workload_id)
                    self.on_published(ended)
            deleted = False
            if job is not None:
                try:
                    deleted = await asyncio.to_thread(self.kube.delete_job, ns, job_id)
                except ApiException as exc:
                    raise Unavailable(f"deleting job {job_id} failed: {exc.reason}") from exc
        # With a Workload, the view stays until the watch brings its deletion (and the
        # close published above keeps the deletion from closing the allocation again).
        self._job_gone((ns, job_id), forget=wl is None)
        if job is None:
            return False, at
        log.info("job %s cancelled at %d (%s)", job_id, at,
                 "allocation ended" if still_open else "held no quota")
        return deleted, at

    # --- orphaned replicas ---------------------------------------------------

    async def reconcile_replicas(self) -> list[orphans.Orphan]:
        """End every endpoint replica in Kubernetes that nothing would stop
        (services/placer/orphans.py): its endpoint deleted, its job cancelled, or not
        recorded on its endpoint. Each is cancelled as a tenant's cancel would be: its
        allocation closes at this instant, then its Job is deleted."""
        listed = await asyncio.to_thread(self.kube.list_replica_jobs)
        jobs = [j for j in map(orphans.replica_job, listed) if j is not None]
        if not jobs:
            return []
        owners = await self.store.owners(sorted({j.endpoint_id for j in jobs}))
        if owners is None:  # the gateway has not migrated yet: nothing to judge by
            return []
        cancelled = await self.store.cancelled([j.job_id for j in jobs])
        found = orphans.orphans(jobs, owners, cancelled, self.clock())
        ended = []
        for o in found:
            log.warning("replica %s of endpoint %s (%s) is orphaned: %s; ending it",
                        o.job.job_id, o.job.endpoint_id, o.job.tenant, o.reason)
            try:  # one that cannot be ended now must not keep the others running
                await self.cancel(o.job.tenant, o.job.job_id, f"orphaned replica: {o.reason}")
            except Exception as exc:
                log.warning("ending orphaned replica %s failed (%s); next pass retries",
                            o.job.job_id, exc)
                continue
            self.on_orphan(o)
            ended.append(o)
        return ended

    # --- observation ---------------------------------------------------------

    def feed(self, loop: asyncio.AbstractEventLoop) -> Callable[[str, list[Change]], None]:
        """A thread-safe callback for the watch threads: one read's events at a time."""

        def emit(kind: str, changes: list[Change]) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, (kind, changes))

        return emit

    def check_sync(self) -> None:
        """Admission asked for every Workload carrying the runway check: sent by the
        observer, in order with the changes it forwards."""
        self.queue.put_nowait((CHECK_SYNC, []))

    async def check_beat(self) -> None:
        """Every few seconds: admission hears the feed's number even when nothing
        changes, so a message lost on a quiet cluster is found missing."""
        self.queue.put_nowait((CHECK_BEAT, []))

    async def run_observer(self, stop: asyncio.Event) -> None:
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if self.queue.empty():
                    getter = asyncio.ensure_future(self.queue.get())
                    await asyncio.wait({getter, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        return
                    reads = [getter.result()]
                else:
                    reads = []
                while not self.queue.empty():  # everything the watches sent meanwhile
                    reads.append(self.queue.get_nowait())
                await self.observe(reads)
        finally:
            stopping.cancel()

    async def observe_now(self, kind: str, etype: str, obj: Any) -> None:
        await self.observe([(kind, [(etype, obj)])])

    async def observe(self, reads: Sequence[tuple[str, Sequence[Change]]]) -> None:
        """Apply the reads' changes in order, deriving each job's events after every
        change (an eviction between two reads of one job is kept); then publish each
        job's new events in its order, the jobs side by side.

        One job at a time, every event waited for its stream ack before the next job's
        went out: one NATS write, one ack read and one wake-up of this loop per event.
        Side by side, the client's flusher carries many jobs' events in one write."""
        due: dict[Key, dict[str, Derived]] = {}
        checks: list[events_pb2.CheckedWorkloads] = []
        beat = False
        for kind, changes in reads:
            if kind == CHECK_SYNC:  # admission asked for every Workload it decides on
                if WORKLOADS in self._listed:  # else the first list sends it
                    checks += self.checks.full()
                continue
            if kind == CHECK_BEAT:
                beat = True
                continue
            for etype, obj in changes:
                try:  # one object the observer cannot read must not stop it
                    if kind == WORKLOADS and self.settings.runway_check:
                        if etype == "RELIST":
                            checks += self.checks.full(obj)
                        else:
                            self.checks.note(obj, etype == "DELETED")
                    for key in self._observed_keys(kind, etype, obj):
                        view = self.views.get(key)
                        if view is None:
                            continue
                        events = due.setdefault(key, {})
                        for event in derive(self._observed(view)):
                            events.setdefault(event.event_id, event)
                except Exception:
                    log.exception("observing %s %s failed", etype, kind)
        if (delta := self.checks.take()) is not None:
            checks.append(delta)
        if beat and not checks and WORKLOADS in self._listed and self.settings.runway_check:
            checks.append(self.checks.beat())
        if checks and self.publish_checks is not None:
            try:  # lost: admission sees the gap in their numbers and asks for a full set
                await self.publish_checks(checks)
            except Exception as exc:
                log.warning("forwarding %d runway-check messages failed: %s", len(checks), exc)
        keys = list(due)
        for at in range(0, len(keys), PUBLISH_FANOUT):
            await asyncio.gather(*(self._settle(key, list(due[key].values()))
                                   for key in keys[at:at + PUBLISH_FANOUT]))

    def _observed_keys(self, kind: str, etype: str, obj: Any) -> list[Key]:
        """Apply one change; the jobs whose events are to be derived now."""
        if etype == "RELIST":
            touched = self._relist(kind, obj)
            self._listed.add(kind)
            if not self.synced.is_set() and self._listed >= set(KINDS):
                self.synced.set()
                touched = set(self.views)
                log.info("initial lists in: %d Kestrel jobs in Kubernetes", len(touched))
            return sorted(touched) if self.synced.is_set() else []
        key = self._apply(kind, etype, obj)
        return [key] if key is not None and self.synced.is_set() else []

    def _apply(self, kind: str, etype: str, obj: dict[str, Any]) -> Key | None:
        key = key_of(kind, obj)
        if key is None:
            return None
        view = self.views.setdefault(key, View())
        deleted = etype == "DELETED"
        if kind == WORKLOADS:
            if view.workload is None and not deleted:
                self.progress_us = self.clock()
            view.workload = obj
            view.workload_deleted = deleted
            view.gone_us = self.clock() if deleted else 0
            if deleted:
                # Jobs are not watched (kube.WATCHED): the Workload's deletion is how the
                # placer learns its Job is gone. Kueue's Workload is owned by the Job and
                # the garbage collector deletes it after the Job. (Were the Job still
                # there, Kueue makes it a new Workload, which the watch brings.)
                view.job = None
        elif kind == JOBS:
            view.job = None if deleted else obj
            stamp = _meta(obj).get("creationTimestamp") if view.job is not None else None
            if stamp != view.created_stamp:  # parsed once per Job (a new Job: again)
                view.created_stamp, view.created_us = stamp, created_us(view.job)
        elif deleted:
            view.pods.pop(str(_meta(obj).get("name")), None)
        else:
            view.pods[str(_meta(obj).get("name"))] = obj
        if kind != PODS:
            self._track(key, view)
        return key

    def _job_gone(self, key: Key, forget: bool = True) -> None:
        """The Job was deleted (by this placer, or found missing): drop it from the view,
        and with `forget` the view too once nothing else of the job is held in it."""
        view = self.views.get(key)
        if view is None:
            return
        view.job = None
        self._track(key, view)  # out of the requeue set, its touches with it
        if forget and view.empty and not view.lock.locked():
            self.views.pop(key, None)

    def _track(self, key: Key, view: View) -> None:
        """Keep `unserved` and `served_us` true of the view after a change to it."""
        if view.job is not None and view.workload is None:
            self.unserved[key] = view.created_us
            return
        if self.unserved.pop(key, None) is not None:
            self.touched.pop(key, None)
        if view.job is not None:
            self.served_us = max(self.served_us, view.created_us)

    def _relist(self, kind: str, items: Sequence[dict[str, Any]]) -> set[Key]:
        """Apply a full list; what the cache holds but the list lacks was deleted."""
        touched: set[Key] = set()
        present: set[tuple[Key, str]] = set()
        for obj in items:
            added = self._apply(kind, "ADDED", obj)
            if added is not None:
                touched.add(added)
                present.add((added, str(_meta(obj).get("name"))))
        for key, view in list(self.views.items()):
            if kind == WORKLOADS and view.workload is not None and not view.workload_deleted:
                if (key, str(_meta(view.workload).get("name"))) not in present:
                    self._apply(kind, "DELETED", view.workload)
                    touched.add(key)
            elif kind == JOBS and view.job is not None and (key, key[1]) not in present:
                view.job = None
                self._track(key, view)
                touched.add(key)
            elif kind == PODS:
                for name in [n for n in view.pods if (key, n) not in present]:
                    view.pods.pop(name)
                    touched.add(key)
        return touched

    async def requeue_stuck(self, grace_s: float = 3.0, patience_s: float = 15.0) -> list[Key]:
        """Touch the Jobs Kueue left without a Workload (lifecycle.requeue_due: skipped
        while younger ones got theirs, or Kueue giving no Job a Workload for
        `patience_s`), so Kueue reconciles them now rather than after its backoff."""
        if not self.synced.is_set():
            return []  # not every Workload listed yet: each Job would look stuck
        now = self.clock()
        grace_us = int(grace_s * 1_000_000)
        patience_us = int(patience_s * 1_000_000)
        if not self.unserved:
            return []
        oldest = min(self.unserved.values())
        if oldest + grace_us > self.served_us and now - max(oldest, self.progress_us) < (
                patience_us):
            return []  # none skipped, Kueue not stalled (requeue_due): nothing is due
        waiting: dict[Key, Waiting] = {}
        for key, created in self.unserved.items():
            if now - created < grace_us:
                continue  # not late yet
            view = self.views.get(key)
            if view is not None and awaiting_workload(view.job, view.workload, now, grace_us):
                last, n = self.touched.get(key, (0, 0))
                waiting[key] = Waiting(created, last, n)
        stuck = requeue_due(waiting, self.served_us, now, grace_us, patience_us,
                            progress_us=self.progress_us)
        for key in stuck:
            self.touched[key] = (now, waiting[key].touches + 1)
            try:
                if not await asyncio.to_thread(self.kube.touch_job, key[0], key[1], str(now)):
                    self._job_gone(key)  # deleted meanwhile (not through this placer)
            except ApiException as exc:
                log.warning("requeueing job %s/%s failed: %s", *key, exc.reason)
        for key in [k for k in self.touched if k not in waiting]:
            self.touched.pop(key)
        if stuck:
            log.warning("%d Jobs had no Kueue Workload while younger ones got theirs (or "
                        "Kueue served none for %.0f s): touched them so Kueue reconciles "
                        "them now (%s)",
                        len(stuck), patience_s, ", ".join(k[1] for k in stuck[:5]))
        return stuck

    @staticmethod
    def _observed(view: View) -> Observed:
        return Observed(view.job, view.workload, tuple(view.pods.values()),
                        view.workload_deleted, view.gone_us)

    async def _settle(self, key: Key, events: Sequence[Derived]) -> None:
        """Publish a job's derived events not out yet; set its stand-in; forget a job
        gone from Kubernetes once every event of it is out."""
        view = self.views.get(key)
        if view is None:
            return
        try:
            await self._publish_new(view, events)
            if self.standins is not None:
                await self.standins.set(key[1], wanted(view.pods.values()))
        except Exception:
            log.exception("publishing the events of %s/%s failed", *key)
            return
        if view.empty and self.views.get(key) is view:
            self.views.pop(key, None)  # gone from Kubernetes; every event is out

    async def _publish_new(self, view: View, events: Sequence[Derived]) -> None:
        """Publish, in order, the events this view has not published yet."""
        async with view.lock:
            for event in events:
                if event.event_id in view.published:
                    continue
                if event.type.closes and event.workload_id in view.closed:
                    continue  # one close per allocation: a cancel already ended it
                await self._publish_retrying(event)
                view.published.add(event.event_id)
                if event.type.closes:
                    view.closed.add(event.workload_id)
                self.on_published(event)

    async def _publish_retrying(self, event: Derived) -> None:
        delay = 0.2
        while True:
            try:
                await self.publish(event)
                return
            except Exception as exc:
                log.warning("publishing %s failed (%s); retrying in %.1fs", event.event_id,
                            exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def check_tenant_name(tenant: str) -> None:
    """A tenant's namespace `kestrel-<tenant>` must be a valid DNS label (<= 63)."""
    if len(manifests.namespace_of(tenant)) > 63:
        raise FailedPrecondition(
            f"tenant {tenant!r} is too long for its namespace (at most "
            f"{63 - len(NAMESPACE_PREFIX)} characters)")

