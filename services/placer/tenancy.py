"""The placer's tenants in Kubernetes: each one's Namespace, ClusterQueue and
LocalQueue, applied once per process and again whenever its quota changes in
tenant_policies, and the operators' read views of nodes and ClusterQueues."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from decimal import Decimal

from kestrel.errors import FailedPrecondition
from kestrel.workloads import TENANT_LABEL
from kestrel_sdk.v1 import placer_pb2
from services.placer import manifests, views
from services.placer.kube import Kube
from services.placer.lifecycle import NAMESPACE_PREFIX
from services.placer.settings import PlacerSettings
from services.placer.store import PlacerStore, TenantQuota

log = logging.getLogger("kestrel.placer")


class Tenancy:
    def __init__(self, kube: Kube, store: PlacerStore, settings: PlacerSettings) -> None:
        self.kube = kube
        self.store = store
        self.settings = settings
        self.prices: dict[str, Decimal] = {}
        self.tenants: dict[str, TenantQuota] = {}  # as applied to Kubernetes
        # As last read from tenant_policies: a change there is applied by refresh();
        # an explicit EnsureTenant quota stands until the profile changes.
        self.profiles_seen: dict[str, TenantQuota] = {}
        self.tenant_locks: dict[str, asyncio.Lock] = {}

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

def check_tenant_name(tenant: str) -> None:
    """A tenant's namespace `kestrel-<tenant>` must be a valid DNS label (<= 63)."""
    if len(manifests.namespace_of(tenant)) > 63:
        raise FailedPrecondition(
            f"tenant {tenant!r} is too long for its namespace (at most "
            f"{63 - len(NAMESPACE_PREFIX)} characters)")

