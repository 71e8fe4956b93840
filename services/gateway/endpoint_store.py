"""The gateway's endpoints table (its own; migration 0004). Tenant-scoped: every query
names the tenant, so another tenant's endpoint is exactly one that does not exist."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from google.protobuf.message import DecodeError

from kestrel.v1 import common_pb2


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

    async def set_replicas(self, tenant: str, endpoint_id: str,
                           replicas: tuple[str, ...]) -> None:
        await self.pool.execute(
            "UPDATE endpoints SET replicas = $3 WHERE endpoint_id = $1 AND tenant = $2",
            endpoint_id, tenant, list(replicas))

    async def delete(self, tenant: str, endpoint_id: str, now_us: int) -> bool:
        """True when this call deleted it (False: not there, or deleted before)."""
        status = await self.pool.execute("""
            UPDATE endpoints SET deleted_us = $3
            WHERE endpoint_id = $1 AND tenant = $2 AND deleted_us = 0""", endpoint_id, tenant,
            now_us)
        return bool(status.endswith(" 1"))
