"""The gateway's Postgres adapter: tenant profiles and API keys (written here),
jobs (read through admission's `job_status` view: admission owns them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from kestrel.db import migrate
from kestrel.jobs import JOB_COLS, TERMINAL, JobRow, job_row
from kestrel_sdk.v1 import common_pb2

MIGRATIONS = Path(__file__).parent / "migrations"


@dataclass(frozen=True)
class Profile:
    tenant: str
    display_name: str
    gpu_quota: dict[str, int]
    rate_per_s: float
    burst: int
    suspended: bool
    created_us: int
    gpu_borrow: dict[str, int] = field(default_factory=dict)  # GPUs beyond the quota


@dataclass(frozen=True)
class KeyRow:
    key_id: str
    tenant: str
    name: str
    secret_hash: str
    created_us: int
    revoked_us: int


def _profile(r: asyncpg.Record) -> Profile:
    return Profile(r["tenant"], r["display_name"], dict(json.loads(r["gpu_quota"])),
                   r["rate_per_s"], r["burst"], r["suspended"], r["created_us"],
                   dict(json.loads(r["gpu_borrow"])))


def _key(r: asyncpg.Record) -> KeyRow:
    return KeyRow(r["key_id"], r["tenant"], r["name"], r["secret_hash"], r["created_us"],
                  r["revoked_us"])


class GatewayStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def migrate(self) -> list[str]:
        async with self.pool.acquire() as conn:
            return await migrate(conn, "gateway", MIGRATIONS)

    async def flavors(self) -> set[str]:
        return {r["flavor"] for r in await self.pool.fetch("SELECT flavor FROM current_prices")}

    # --- tenants -------------------------------------------------------------

    async def insert_profile(self, p: Profile) -> bool:
        status = await self.pool.execute("""
            INSERT INTO tenant_profiles (tenant, display_name, gpu_quota, rate_per_s, burst,
                                         suspended, created_us, gpu_borrow)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT DO NOTHING""", p.tenant, p.display_name, json.dumps(p.gpu_quota),
            p.rate_per_s, p.burst, p.suspended, p.created_us, json.dumps(p.gpu_borrow))
        return bool(status.endswith(" 1"))

    async def profile(self, tenant: str) -> Profile | None:
        r = await self.pool.fetchrow("SELECT * FROM tenant_profiles WHERE tenant = $1", tenant)
        return _profile(r) if r else None

    async def profiles(self, after: str, limit: int) -> list[Profile]:
        rows = await self.pool.fetch(
            "SELECT * FROM tenant_profiles WHERE tenant > $1 ORDER BY tenant LIMIT $2",
            after, limit)
        return [_profile(r) for r in rows]

    async def update_profile(self, p: Profile) -> Profile | None:
        r = await self.pool.fetchrow("""
            UPDATE tenant_profiles SET display_name = $2, gpu_quota = $3, rate_per_s = $4,
                   burst = $5, suspended = $6, gpu_borrow = $7
            WHERE tenant = $1 RETURNING *""", p.tenant, p.display_name, json.dumps(p.gpu_quota),
            p.rate_per_s, p.burst, p.suspended, json.dumps(p.gpu_borrow))
        return _profile(r) if r else None

    # --- keys ----------------------------------------------------------------

    async def insert_key(self, k: KeyRow) -> None:
        await self.pool.execute(
            "INSERT INTO api_keys VALUES ($1, $2, $3, $4, $5, 0)",
            k.key_id, k.tenant, k.name, k.secret_hash, k.created_us)

    async def key(self, key_id: str) -> KeyRow | None:
        r = await self.pool.fetchrow("SELECT * FROM api_keys WHERE key_id = $1", key_id)
        return _key(r) if r else None

    async def revoke_key(self, key_id: str, now_us: int) -> KeyRow | None:
        r = await self.pool.fetchrow("""
            UPDATE api_keys SET revoked_us = CASE WHEN revoked_us = 0 THEN $2 ELSE revoked_us END
            WHERE key_id = $1 RETURNING *""", key_id, now_us)
        return _key(r) if r else None

    # --- jobs (read) ---------------------------------------------------------

    async def job(self, tenant: str, job_id: str) -> JobRow | None:
        r = await self.pool.fetchrow(
            f"SELECT {JOB_COLS} FROM job_status WHERE job_id = $1 AND tenant = $2", job_id, tenant)
        return job_row(r) if r else None

    async def ended(self, job_ids: Sequence[str]) -> set[str]:
        """Those of `job_ids` in a terminal state (an endpoint's replicas that ended)."""
        rows = await self.pool.fetch(
            "SELECT job_id FROM job_status WHERE job_id = ANY($1::text[]) "
            "AND state = ANY($2::smallint[])", list(job_ids), sorted(int(s) for s in TERMINAL))
        return {r["job_id"] for r in rows}

    async def flavors_asked(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The flavor each of `job_ids` asked for (an endpoint's replicas per flavor)."""
        rows = await self.pool.fetch(
            "SELECT job_id, spec FROM job_status WHERE job_id = ANY($1::text[])",
            list(job_ids))
        return {r["job_id"]: common_pb2.JobSpec.FromString(bytes(r["spec"])).flavor
                for r in rows}

    async def jobs(self, tenant: str, states: Sequence[int], after_seq: int,
                   limit: int) -> list[JobRow]:
        """A tenant's jobs ('': every tenant's) after a sequence, in submission order.
        Two statements, not `($1 = '' OR tenant = $1)`: a prepared statement's generic
        plan could not use the (tenant, seq) index for a tenant's listing then."""
        where = "tenant = $4 AND " if tenant else ""
        args: list[object] = [after_seq, list(states), limit, *([tenant] if tenant else [])]
        rows = await self.pool.fetch(f"""
            SELECT {JOB_COLS} FROM job_status
            WHERE {where}seq > $1 AND (cardinality($2::smallint[]) = 0
                                      OR state = ANY($2::smallint[]))
            ORDER BY seq LIMIT $3""", *args)
        return [job_row(r) for r in rows]
