"""Postgres, read-only, through what each owner publishes: tenant quotas (the gateway's
`tenant_policies`), prices (the meter's `current_prices`), job states (admission's
`job_status`). The placer owns no table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import asyncpg

from kestrel.db import Published
from kestrel.jobs import JobState


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

    async def cancelled(self, job_id: str) -> bool:
        """Admission cancelled the job (a JobAdmitted may still be queued for it)."""
        if not await self.published.exists("job_status"):
            return False
        state = await self.pool.fetchval("SELECT state FROM job_status WHERE job_id = $1", job_id)
        return state is not None and int(state) == int(JobState.CANCELLED)
