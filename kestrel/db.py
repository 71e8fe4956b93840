"""Postgres access shared by services: pools with retry, versioned migrations.

Migrations run as the tables' owner (KESTREL_POSTGRES_OWNER_DSN); services connect
as their own roles (kestrel.pgroles).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import asyncpg

from kestrel.bus import retry_forever
from kestrel.config import Stores
from kestrel.errors import PRIMARY_GONE

log = logging.getLogger("kestrel.db")


T = TypeVar("T")

RETRY_WITHIN_S = 4.0  # a Patroni failover of a crashed primary: 2-3 s (docs/ha.md)


async def retrying(what: str, fn: Callable[[], Awaitable[T]], *,
                   within_s: float = RETRY_WITHIN_S) -> T:
    """`fn()` (one transaction, or one statement), run again while the primary is gone
    for at most `within_s`, then the last error (the caller's UNAVAILABLE). Only for
    writes that are safe to repeat: a commit whose answer was lost may have happened, so
    each caller's transaction is keyed (a job's id, a top-up's id) or fenced by a
    version, and a repeat finds what the first did."""
    deadline = time.monotonic() + within_s
    delay = 0.05
    while True:
        try:
            return await fn()
        except PRIMARY_GONE as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.info("%s: the Postgres primary is away (%s: %s); trying again in %.2f s",
                     what, type(exc).__name__, exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Kestrel code leaves no session state (no SET, LISTEN, temp tables or open
    transactions) on a pooled connection, so the default reset, one extra
    round trip per release, is not needed."""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 4) -> asyncpg.Pool:
    """A pool, retried until Postgres answers (services start before it sometimes)."""

    async def make() -> asyncpg.Pool:
        return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                         command_timeout=30, reset=_no_reset)

    pool: asyncpg.Pool = await retry_forever("postgres connect", make)
    return pool


class Published:
    """Whether what another service publishes for this one (a view, in the owner's
    migrations) exists yet: a service may start before the owner has migrated. Asked of
    Postgres until it exists, then known: a relation is not dropped under a running
    service, so the hot path pays one statement, not two."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.known: set[str] = set()

    async def exists(self, relation: str) -> bool:
        if relation in self.known:
            return True
        if await self.pool.fetchval("SELECT to_regclass($1) IS NOT NULL", relation):
            self.known.add(relation)
            return True
        return False


async def migrate(conn: asyncpg.Connection, component: str, directory: Path) -> list[str]:
    """Apply `NNNN_name.sql` files of `directory` not yet applied for `component`.

    Idempotent and safe to run from several processes at once: an advisory
    lock serialises migrators; each file runs in its own transaction with its
    version row.
    """
    files = sorted(p for p in directory.iterdir() if _MIGRATION.match(p.name))  # noqa: ASYNC240
    applied: list[str] = []
    if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        # Nothing to do: answered with a SELECT alone, so a service's own role (which
        # may not create anything) can make sure its schema is current.
        done = {r["version"] for r in await conn.fetch(
            "SELECT version FROM schema_migrations WHERE component = $1", component)}
        if all(p.name[:4] in done for p in files):
            return applied
    await conn.execute("""
        CREATE TABLE IF NOT EXISTS schema_migrations (
          component text NOT NULL, version text NOT NULL, applied_us bigint NOT NULL,
          PRIMARY KEY (component, version))""")
    await conn.execute("SELECT pg_advisory_lock(hashtext('kestrel-migrations'))")
    try:
        done = {r["version"] for r in await conn.fetch(
            "SELECT version FROM schema_migrations WHERE component = $1", component)}
        for path in files:
            version = path.name[:4]
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute(
                    "INSERT INTO schema_migrations VALUES ($1, $2, "
                    "(extract(epoch from clock_timestamp()) * 1e6)::bigint)",
                    component, version)
            applied.append(path.name)
            log.info("migration %s/%s applied", component, path.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(hashtext('kestrel-migrations'))")
    return applied


async def migrate_component(stores: Stores, component: str, directory: Path) -> list[str]:
    """Migrate `component` over the owner's connection (KESTREL_POSTGRES_OWNER_DSN).

    Without one, over the service's own DSN: a schema already current (migrated by
    `python -m kestrel.migrate`, as the Helm chart's init containers do) needs only a
    SELECT, which the service's own role may run. Anything left to apply then fails
    unless the service connects as the tables' owner or a superuser, which is exactly
    what the separate owner exists to avoid: that is warned about."""
    owner = bool(stores.postgres_owner_dsn)
    dsn = stores.postgres_owner_dsn or stores.postgres_dsn

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(dsn, command_timeout=120)

    conn: asyncpg.Connection = await retry_forever(
        f"postgres connect ({'owner' if owner else component})", connect)
    try:
        applied = await migrate(conn, component, directory)
    finally:
        await conn.close()
    if applied and not owner:
        log.warning("KESTREL_POSTGRES_OWNER_DSN is not set: %s migrated over the service's "
                    "own connection; set it (or run python -m kestrel.migrate) so the "
                    "service can run as a role that owns nothing (README: the ledger and "
                    "the runway)", component)
    return applied
