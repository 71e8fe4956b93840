"""What the gateway does across services, on domain values: tenants (a profile here, an
account at the meter, queues in Kubernetes through the placer) and jobs (submitted to
admission, read through admission's job_status view, cancelled at admission and then
in Kubernetes). The servicer checks who calls, validates and converts; this module
orders the calls and decides what a partial failure leaves behind.

Order, and why:
- A tenant is created at the meter first, then its profile here: a profile without
  an account would let its keys submit against no budget, whereas an account without a
  profile is invisible (no key can reach it) and a retry of CreateTenant makes the
  profile (CreateAccount is idempotent). Queues are best effort: the placer also
  ensures them before the tenant's first Job and follows profile changes.
- A job is cancelled at admission first (its hold released, its state CANCELLED), then
  in Kubernetes: should the placer be away, the runway check rejects the cancelled
  job's Workload and Kueue deactivates it, which closes the allocation too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc

from kestrel.batching import Batcher
from kestrel.errors import AlreadyExists, NotFound
from kestrel.jobs import JobRow
from kestrel_sdk.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    common_pb2,
    meter_pb2,
    meter_pb2_grpc,
    placer_pb2,
    placer_pb2_grpc,
)
from services.gateway.store import GatewayStore, Profile
from services.gateway.upstream import call, item_failure

log = logging.getLogger("kestrel.gateway")

FLAVORS_CACHE_S = 10.0
# Submits go to admission in batches of those that arrived while earlier batches were
# out (kestrel.batching): one call at a time while admission answers within
# ADMIT_PATIENCE_S, up to ADMIT_IN_FLIGHT when one is slower (a tenant's lock held),
# so that one slow call does not hold every later submit behind it. make bench-gateway
# (README, Benchmarks): 4 in flight without patience, ratio 0.21-0.25, p99 at half load
# 77-134 ms (six runs); 1 in flight, 0.27-0.33 and 53-100 ms at a higher half-load rate
# (six runs): the batches at half load grow from 1.3 submits to 6, and each costs
# admission its call, snapshot and INSERT once.
ADMIT_IN_FLIGHT = 4
ADMIT_PATIENCE_S = 0.05
ADMIT_BATCH = 128
# Well inside what admission accepts in one call (kestrel.v1.Admission.AdmitBatch):
# a job's spec may be a few hundred KiB, and the answer repeats each job.
ADMIT_BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class ProfileChange:
    """What UpdateTenant asks to change; an empty field keeps the profile's value."""

    display_name: str = ""
    gpu_quota: dict[str, int] | None = None
    gpu_borrow: dict[str, int] | None = None  # merged into the profile's, per flavor
    rate: tuple[float, int] | None = None  # (per second, burst)


def changed(p: Profile, c: ProfileChange) -> Profile:
    """The profile after `c`: quota replaced when given, borrow merged per flavor."""
    return replace(
        p, display_name=c.display_name or p.display_name,
        gpu_quota=dict(c.gpu_quota) if c.gpu_quota else p.gpu_quota,
        gpu_borrow={**p.gpu_borrow, **c.gpu_borrow} if c.gpu_borrow else p.gpu_borrow,
        rate_per_s=c.rate[0] if c.rate else p.rate_per_s,
        burst=c.rate[1] if c.rate else p.burst)


def quota_wire(p: Profile) -> list[placer_pb2.FlavorQuota]:
    return [placer_pb2.FlavorQuota(flavor=f, gpus=p.gpu_quota.get(f, 0),
                                   borrow_gpus=p.gpu_borrow.get(f, 0))
            for f in sorted(set(p.gpu_quota) | set(p.gpu_borrow))]


class Gateway:
    def __init__(self, store: GatewayStore, admission: admission_pb2_grpc.AdmissionStub,
                 meter: meter_pb2_grpc.MeterStub,
                 placer: placer_pb2_grpc.PlacerStub | None = None,
                 on_profile_changed: Callable[[str], None] = lambda tenant: None) -> None:
        self.store = store
        self.admission = admission
        self.meter = meter
        self.placer = placer
        self.on_profile_changed = on_profile_changed  # the callers' cache forgets it
        self._flavors: tuple[float, set[str]] = (0.0, set())
        self.admits: Batcher[common_pb2.Job, common_pb2.Job] = Batcher(
            self._admit_batch, max_batch=ADMIT_BATCH, max_in_flight=ADMIT_IN_FLIGHT,
            patience_s=ADMIT_PATIENCE_S,
            size=lambda job: job.ByteSize(), max_bytes=ADMIT_BATCH_BYTES)

    async def flavor_names(self) -> set[str]:
        at, names = self._flavors
        if time.monotonic() - at > FLAVORS_CACHE_S or not names:
            names = await self.store.flavors()
            self._flavors = (time.monotonic(), names)
        return names

    # --- tenants -------------------------------------------------------------

    async def existing(self, tenant: str) -> Profile:
        p = await self.store.profile(tenant)
        if p is None:
            raise NotFound(f"tenant {tenant!r} does not exist")
        return p

    async def create_tenant(self, profile: Profile, initial_credits: str
                            ) -> tuple[Profile, common_pb2.Runway]:
        if await self.store.profile(profile.tenant) is not None:
            raise AlreadyExists(f"tenant {profile.tenant!r} exists")
        account = await call(self.meter.CreateAccount(meter_pb2.CreateAccountRequest(
            tenant=profile.tenant, initial_credits=initial_credits), timeout=10))
        if not await self.store.insert_profile(profile):
            raise AlreadyExists(f"tenant {profile.tenant!r} exists")
        self.on_profile_changed(profile.tenant)
        await self.ensure_queues(profile)
        return profile, account.runway

    async def update_tenant(self, tenant: str, change: ProfileChange) -> Profile:
        p = await self.existing(tenant)
        updated = await self.store.update_profile(changed(p, change))
        if updated is None:  # deleted meanwhile: tenants are never deleted, but say so
            raise NotFound(f"tenant {tenant!r} does not exist")
        self.on_profile_changed(tenant)
        await self.ensure_queues(updated)
        return updated

    async def suspend_tenant(self, tenant: str, suspended: bool) -> Profile:
        p = await self.existing(tenant)
        updated = await self.store.update_profile(replace(p, suspended=suspended))
        if updated is None:
            raise NotFound(f"tenant {tenant!r} does not exist")
        self.on_profile_changed(tenant)
        return updated

    async def ensure_queues(self, p: Profile) -> None:
        """Ask the placer for the tenant's namespace and queues now (best effort)."""
        if self.placer is None:
            return
        try:
            await self.placer.EnsureTenant(placer_pb2.EnsureTenantRequest(
                tenant=p.tenant, quota=quota_wire(p)), timeout=10)
        except grpc.aio.AioRpcError as err:
            log.warning("placer EnsureTenant(%s): %s %s", p.tenant, err.code().name,
                        err.details())

    # --- jobs ----------------------------------------------------------------

    async def submit(self, job: common_pb2.Job, timeout_s: float) -> common_pb2.Job:
        """Admission's decision on `job`, sent with the other submits waiting."""
        return await self.admits.call(job, timeout_s)

    async def _admit_batch(self, jobs: list[common_pb2.Job], timeout_s: float
                           ) -> list[common_pb2.Job | Exception]:
        resp: admission_pb2.AdmitBatchResponse = await call(self.admission.AdmitBatch(
            admission_pb2.AdmitBatchRequest(
                requests=[admission_pb2.AdmitRequest(job=j) for j in jobs]),
            timeout=timeout_s))
        return [r.response.job if r.WhichOneof("result") == "response"
                else item_failure(r.error) for r in resp.results]

    async def job(self, tenant: str, job_id: str) -> JobRow:
        row = await self.store.job(tenant, job_id)
        if row is None:  # another tenant's job is simply not there
            raise NotFound(f"job {job_id} not found")
        return row

    async def cancel(self, tenant: str, job_id: str, reason: str) -> common_pb2.Job:
        await self.job(tenant, job_id)
        resp: admission_pb2.ReleaseResponse = await call(self.admission.Release(
            admission_pb2.ReleaseRequest(
                tenant=tenant, job_id=job_id, reason=reason), timeout=10))
        if self.placer is not None:  # its allocation ends at this instant
            try:
                await self.placer.CancelWorkload(placer_pb2.CancelWorkloadRequest(
                    tenant=tenant, workload_id=job_id,
                    reason=reason or "cancelled by the tenant"), timeout=10)
            except grpc.aio.AioRpcError as err:
                log.warning("placer CancelWorkload(%s): %s", job_id, err.code().name)
        return resp.job
