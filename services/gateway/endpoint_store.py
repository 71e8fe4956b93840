"""The gateway's endpoints table (its own; migration 0004). Tenant-scoped: every query
names the tenant, so another tenant's endpoint is exactly one that does not exist."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
from google.protobuf.message import DecodeError

from kestrel_sdk.v1 import common_pb2


@dataclass(frozen=True)
class EndpointRow:
    endpoint_id: str
    tenant: str
    name: str
    spec: common_pb2.EndpointSpec
    created_us: int
    deleted_us: int
    seq: int
    replicas: tuple[str, ...] = ()  # job ids of its replicas, oldest first


def _row(r: asyncpg.Record) -> EndpointRow:
    try:
        spec = common_pb2.EndpointSpec.FromString(r["spec"])
    except DecodeError:
        spec = common_pb2.EndpointSpec(name=r["name"])
    return EndpointRow(r["endpoint_id"], r["tenant"], r["name"], spec, r["created_us"],
                       r["deleted_us"], r["seq"], tuple(r["replicas"] or ()))


class EndpointStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        # Each endpoint being changed holds one pooled connection for its lock and uses
        # at most one more at a time: with at most half the pool holding locks, the
        # other half is always there for them, so they never wait on each other.
        self._holders = asyncio.Semaphore(max(1, pool.get_max_size() // 2))

    async def insert(self, endpoint_id: str, tenant: str, spec: common_pb2.EndpointSpec,
                     created_us: int) -> EndpointRow | None:
        """None when the tenant already has a live endpoint of that name."""
        r = await self.pool.fetchrow("""
            INSERT INTO endpoints (endpoint_id, tenant, name, spec, created_us)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT DO NOTHING RETURNING *""", endpoint_id, tenant, spec.name,
            spec.SerializeToString(), created_us)
        return _row(r) if r else None

    async def get(self, tenant: str, endpoint_id: str) -> EndpointRow | None:
        r = await self.pool.fetchrow(
            "SELECT * FROM endpoints WHERE endpoint_id = $1 AND tenant = $2", endpoint_id,
            tenant)
        return _row(r) if r else None

    async def named(self, tenant: str, name: str) -> EndpointRow | None:
        """The tenant's live endpoint of that name (names are unique among live ones)."""
        r = await self.pool.fetchrow(
            "SELECT * FROM endpoints WHERE tenant = $1 AND name = $2 AND deleted_us = 0",
            tenant, name)
        return _row(r) if r else None

    async def live(self, tenant: str, after_seq: int, limit: int) -> list[EndpointRow]:
        rows = await self.pool.fetch("""
            SELECT * FROM endpoints WHERE tenant = $1 AND deleted_us = 0 AND seq > $2
            ORDER BY seq LIMIT $3""", tenant, after_seq, limit)
        return [_row(r) for r in rows]

    async def every_live(self, tenant: str, after_seq: int, limit: int) -> list[EndpointRow]:
        """Live endpoints of every tenant ('') or of one, in creation order."""
        rows = await self.pool.fetch("""
            SELECT * FROM endpoints WHERE ($1 = '' OR tenant = $1) AND deleted_us = 0
              AND seq > $2 ORDER BY seq LIMIT $3""", tenant, after_seq, limit)
        return [_row(r) for r in rows]

    @contextlib.asynccontextmanager
    async def changing(self, endpoint_id: str) -> AsyncIterator[None]:
        """Hold the endpoint's lock while its replicas change: one creation, scaling or
        deletion of an endpoint at a time across every gateway. Each reads the row
        inside the lock and records what it did before leaving it, so none writes a
        replica list computed from what another was changing (an autoscaler's scaling
        that read an endpoint still starting its first replica recorded only its own,
        and the first ran unrecorded: never ready, billed, stopped by nothing). A
        transaction-scoped advisory lock on one pooled connection: a gateway that dies
        holding it releases it with its connection."""
        async with self._holders, self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 56))",
                               endpoint_id)
            yield

    async def set_replicas(self, tenant: str, endpoint_id: str,
                           replicas: tuple[str, ...]) -> bool:
        """Record its replicas; False when it was deleted (or never was): then nothing
        is written and the caller stops the replicas it started, since the deletion
        stopped only those recorded before it. One row, one statement: a deletion and a
        scaling of the same endpoint are ordered by the row's lock, whichever gateway
        runs them."""
        status = await self.pool.execute(
            "UPDATE endpoints SET replicas = $3 WHERE endpoint_id = $1 AND tenant = $2 "
            "AND deleted_us = 0", endpoint_id, tenant, list(replicas))
        return bool(status.endswith(" 1"))

    async def delete(self, tenant: str, endpoint_id: str,
                     now_us: int) -> tuple[str, ...] | None:
        """Mark it deleted and return the replicas recorded at that instant (None: not
        there, or deleted before). Read in the same statement as the mark, so a scaling
        that recorded a replica just before is stopped with it, and one just after
        finds the endpoint deleted (set_replicas)."""
        r = await self.pool.fetchrow("""
            UPDATE endpoints SET deleted_us = $3
            WHERE endpoint_id = $1 AND tenant = $2 AND deleted_us = 0
            RETURNING replicas""", endpoint_id, tenant, now_us)
        return None if r is None else tuple(r["replicas"] or ())
