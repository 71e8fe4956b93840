"""The placer's cycle: placement of admitted jobs, cancel, and the end of orphaned
replicas, over its two collaborators: the tenants' queues (tenancy.py) and the
observer of what Kubernetes says (observer.py).

Placement: ensure the tenant (once per process, and whenever its quota changes),
choose the flavor from the tenant's runway, create the Job (AlreadyExists counts as
created), then feed the stored Job to the observer like any watch event, so its QUEUED
event goes out before the caller acks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from kestrel.clock import Clock, now_us
from kestrel.errors import Unavailable
from kestrel.workloads import CPU_FLAVOR
from services.placer import manifests, orphans
from services.placer.domain import FlavorAsk, Placement, RunwayView, choose_flavor
from services.placer.kube import JOBS, Kube
from services.placer.lifecycle import (
    FLAVOR_ANNOTATION,
    FLAVOR_REASON_ANNOTATION,
    EventType,
    Observed,
    derive,
    open_allocation,
)
from services.placer.observer import Observer, Publish, View, key_of, metadata_of
from services.placer.settings import PlacerSettings
from services.placer.store import PlacerStore, TenantQuota
from services.placer.tenancy import Tenancy

log = logging.getLogger("kestrel.placer")


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



class Placer:
    def __init__(self, kube: Kube, store: PlacerStore, publish: Publish,
                 settings: PlacerSettings, clock: Clock = now_us) -> None:
        self.kube = kube
        self.store = store
        self.settings = settings
        self.clock = clock
        self.tenancy = Tenancy(kube, store, settings)
        self.observer = Observer(kube, publish, settings.runway_check, clock)
        self.runways: dict[str, RunwayView] = {}
        self.cancelled: set[str] = set()
        self.on_orphan: Callable[[orphans.Orphan], None] = lambda o: None

    def placement(self, job: AdmittedJob, profile: TenantQuota) -> Placement:
        if job.preference == CPU_FLAVOR:  # the CPU pool is one flavor: nothing to choose
            return Placement(CPU_FLAVOR, "the CPU pool (real kubelet node), as asked")
        quota = {f: profile.limit(f) for f in self.settings.flavors}
        return choose_flavor(FlavorAsk(job.gpus, job.preference, job.max_duration_s), quota,
                             self.tenancy.prices, self.runways.get(job.tenant),
                             self.settings.short_bp)

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
        profile = await self.tenancy.tenant_quota(job.tenant)
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
            self.tenancy.tenants.pop(job.tenant, None)
            profile = await self.tenancy.tenant_quota(job.tenant)
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
            self.observer.apply(JOBS, "ADDED", stored)
            view = self.observer.views[key]
            await self.observer.publish_new(view, derive(self.observer.observed(view)))
        ann = metadata_of(stored).get("annotations") or {}
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
        view = self.observer.views.setdefault((ns, job_id), View())
        async with view.lock:
            at = self.clock()
            still_open = open_allocation(derive(Observed(job, wl)))
            if still_open is not None:
                ended = replace(still_open, type=EventType.CANCELLED, time_us=at,
                                reason=reason)
                if ended.event_id not in view.published:
                    try:
                        await self.observer.publish(ended)
                    except Exception as exc:
                        raise Unavailable(f"could not publish the end of {job_id}: {exc}") from exc
                    view.published.add(ended.event_id)
                    view.closed.add(ended.workload_id)
                    self.observer.on_published(ended)
            deleted = False
            if job is not None:
                try:
                    deleted = await asyncio.to_thread(self.kube.delete_job, ns, job_id)
                except ApiException as exc:
                    raise Unavailable(f"deleting job {job_id} failed: {exc.reason}") from exc
        # With a Workload, the view stays until the watch brings its deletion (and the
        # close published above keeps the deletion from closing the allocation again).
        self.observer.job_gone((ns, job_id), forget=wl is None)
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
