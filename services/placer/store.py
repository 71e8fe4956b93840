"""Postgres, read-only, through what each owner publishes: tenant quotas (the gateway's
`tenant_policies`), prices (the meter's `current_prices`), job states (admission's
`job_status`), endpoints and their replicas (the gateway's `endpoint_replicas`). The
placer owns no table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import asyncpg

from kestrel.db import Published
from kestrel.jobs import JobState
from services.placer.orphans import Owner


@dataclass(frozen=True)
class TenantQuota:
    quota: dict[str, int]  # GPUs per flavor: the ClusterQueue's nominal quota, a cap
    suspended: bool = False
    borrow: dict[str, int] = field(default_factory=dict)  # GPUs it may borrow beyond

    def limit(self, flavor: str) -> int:
        """The most GPUs of `flavor` the tenant may hold at once."""
        return self.quota.get(flavor, 0) + self.borrow.get(flavor, 0)


def _gpus(column: str) -> dict[str, int]:
    return {k: int(v) for k, v in json.loads(column).items()}


class PlacerStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.published = Published(pool)

    async def prices(self) -> dict[str, Decimal]:
        if not await self.published.exists("current_prices"):
            return {}
        rows = await self.pool.fetch("SELECT flavor, price_per_gpu_s FROM current_prices")
        return {r["flavor"]: r["price_per_gpu_s"] for r in rows}

    async def profiles(self, tenants: Sequence[str]) -> dict[str, TenantQuota]:
        if not await self.published.exists("tenant_policies"):
            return {}
        rows = await self.pool.fetch(
            "SELECT tenant, gpu_quota, gpu_borrow, suspended FROM tenant_policies "
            "WHERE tenant = ANY($1)", list(tenants))
        return {r["tenant"]: TenantQuota(_gpus(r["gpu_quota"]), bool(r["suspended"]),
                                         _gpus(r["gpu_borrow"])) for r in rows}

    async def cancelled(self, job_ids: Sequence[str]) -> set[str]:
        """Those of `job_ids` that admission cancelled (a JobAdmitted may still be queued
        for one). One statement for a whole fetched batch of admitted jobs: it was one
        per job, a tenth of the plane's Postgres commits per job."""
        if not job_ids or not await self.published.exists("job_status"):
            return set()
        rows = await self.pool.fetch(
            "SELECT job_id FROM job_status WHERE job_id = ANY($1::text[]) AND state = $2",
            list(job_ids), int(JobState.CANCELLED))
        return {str(r["job_id"]) for r in rows}

    async def owners(self, endpoint_ids: Sequence[str]) -> dict[str, Owner] | None:
        """The endpoints of `endpoint_ids` the gateway knows, deleted or not, with the
        replicas each records; None while the gateway has not published them yet."""
        if not await self.published.exists("endpoint_replicas"):
            return None
        if not endpoint_ids:
            return {}
        rows = await self.pool.fetch(
            "SELECT endpoint_id, deleted_us, replicas FROM endpoint_replicas "
            "WHERE endpoint_id = ANY($1::text[])", list(endpoint_ids))
        return {str(r["endpoint_id"]): Owner(bool(r["deleted_us"]),
                                             frozenset(r["replicas"] or ())) for r in rows}
