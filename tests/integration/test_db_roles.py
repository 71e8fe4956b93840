"""Who may do what in Postgres: the services' roles cannot rewrite the ledger.

Each service connects as its own role (kestrel.pgroles): not a superuser, not the
tables' owner, not a member of the owner. These tests log in as those roles, with
their passwords, exactly as the services do, and try every way around the
append-only triggers that a table's owner or a superuser would have.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from kestrel.config import Stores
from kestrel.db import migrate, migrate_component
from kestrel.migrate import directory as migrations_of
from kestrel.pgroles import (
    LOGIN_ROLES,
    OWNER_ROLE,
    READER_ROLE,
    SERVICE_ROLES,
    adopt_database_sql,
)
from kestrel_tools.devstack import Stack
from services.admission.store import MIGRATIONS as ADMISSION_MIGRATIONS
from services.gateway.store import MIGRATIONS as GATEWAY_MIGRATIONS
from services.meter.domain import Event, EventType
from services.meter.store import MIGRATIONS as METER_MIGRATIONS
from services.meter.store import Mark, MeterStore

pytestmark = pytest.mark.integration
T0 = 1_700_000_000_000_000
COMPONENTS = [("meter", METER_MIGRATIONS), ("gateway", GATEWAY_MIGRATIONS),
              ("admission", ADMISSION_MIGRATIONS)]


async def migrate_all(conn: asyncpg.Connection) -> None:
    for component, directory in COMPONENTS:
        await migrate(conn, component, directory)


@pytest.fixture
async def schema(database: str, role_dsn: Callable[[str], str]) -> AsyncIterator[str]:
    """Every component migrated by kestrel_owner; one ledger row written by the meter's
    own role, through the meter's store. Yields the superuser's DSN."""
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        await migrate_all(owner)
    finally:
        await owner.close()
    pool = await asyncpg.create_pool(role_dsn(SERVICE_ROLES["meter"]), min_size=1, max_size=2)
    try:
        store = MeterStore(pool)
        assert await store.migrate() == []  # a service checks its schema with a SELECT
        await store.ensure_tenant("acme", T0)
        async with store.write(Mark()) as w:
            await store.top_up(w, "acme", Decimal("10"), "t1", "", T0)
            await store.set_price(w, "gpu-h100", Decimal("0.001"), T0)
            await store.apply_batch(w, [
                Event("a", "acme", "w1", 1, EventType.ADMITTED, T0, "gpu-h100", 1),
                Event("f", "acme", "w1", 1, EventType.FINISHED, T0 + 1_000_000, "gpu-h100", 1)],
                {"gpu-h100": Decimal("0.001")}, T0)
    finally:
        await pool.close()
    yield database


async def ledger_state(dsn: str) -> tuple[int, Decimal]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT count(*) n, coalesce(sum(cost), 0) c FROM ledger")
        return int(row["n"]), row["c"]
    finally:
        await conn.close()


async def test_every_kestrel_role_logs_in_and_none_is_a_superuser_or_the_owners_member(
        stack: Stack, schema: str) -> None:
    conn = await asyncpg.connect(schema)
    try:
        rows = {r["rolname"]: r for r in await conn.fetch("""
            SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication,
                   rolbypassrls, rolcanlogin,
                   pg_has_role(rolname, 'kestrel_owner', 'MEMBER') AS in_owner
            FROM pg_roles WHERE rolname = ANY($1::text[])""", list(LOGIN_ROLES))}
        owners = {r["relname"]: r["owner"] for r in await conn.fetch("""
            SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S')""")}
    finally:
        await conn.close()
    assert set(rows) == set(LOGIN_ROLES)
    for name, r in rows.items():
        assert r["rolcanlogin"], name
        assert not any(r[k] for k in ("rolsuper", "rolcreaterole", "rolcreatedb",
                                      "rolreplication", "rolbypassrls")), name
        assert r["in_owner"] == (name == OWNER_ROLE), name
    assert "ledger" in owners and set(owners.values()) == {OWNER_ROLE}
    for role in (*SERVICE_ROLES.values(), READER_ROLE):  # each logs in with its password
        c = await asyncpg.connect(stack.dsn(role, schema.rsplit("/", 1)[1]))
        assert await c.fetchval("SELECT current_user") == role
        await c.close()


async def test_a_role_without_its_password_is_refused_over_tcp(stack: Stack, schema: str) -> None:
    db = schema.rsplit("/", 1)[1]
    for role in ("postgres", SERVICE_ROLES["meter"]):
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            await asyncpg.connect(f"postgresql://{role}@127.0.0.1:{stack.pg_port}/{db}")
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(f"postgresql://{role}:wrong@127.0.0.1:{stack.pg_port}/{db}")


# Every way around the append-only triggers a role could try. A service's role has
# none of them: the triggers' bypasses belong to the owner and to superusers.
ESCAPES = {
    "replica mode": ("SET session_replication_role = replica", "session_replication_role"),
    "replica mode, local": ("SET LOCAL session_replication_role = replica",
                            "session_replication_role"),
    "disable one trigger": ("ALTER TABLE ledger DISABLE TRIGGER ledger_append_only",
                            "must be owner"),
    "disable user triggers": ("ALTER TABLE ledger DISABLE TRIGGER USER", "must be owner"),
    "disable all triggers": ("ALTER TABLE ledger DISABLE TRIGGER ALL", "must be owner"),
    "drop the trigger": ("DROP TRIGGER ledger_append_only ON ledger", "must be owner"),
    "replace the trigger function": (
        "CREATE OR REPLACE FUNCTION kestrel_reject_change() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$", "permission denied|must be owner"),
    "take the table": ("ALTER TABLE ledger OWNER TO CURRENT_USER", "must be owner"),
    "become the owner": ("SET ROLE kestrel_owner", "permission denied to set role"),
    "join the owner": ("GRANT kestrel_owner TO CURRENT_USER", "permission denied"),
    "grant itself": ("GRANT UPDATE, DELETE ON ledger TO CURRENT_USER", "permission denied"),
    "update": ("UPDATE ledger SET cost = 0, price = 0", "permission denied"),
    "delete": ("DELETE FROM ledger", "permission denied"),
    "truncate": ("TRUNCATE ledger", "permission denied"),
    "update credits": ("UPDATE credits SET amount = 1000000", "permission denied"),
    "delete credits": ("DELETE FROM credits", "permission denied"),
    "shadow table": ("CREATE TABLE ledger2 (i int)", "permission denied for schema public"),
}


@pytest.mark.parametrize("role", sorted(SERVICE_ROLES.values()))
@pytest.mark.parametrize("escape", sorted(ESCAPES))
async def test_a_services_role_cannot_rewrite_the_ledger(
        schema: str, role_dsn: Callable[[str], str], role: str, escape: str) -> None:
    statement, message = ESCAPES[escape]
    before = await ledger_state(schema)
    conn = await asyncpg.connect(role_dsn(role))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=message):
            async with conn.transaction():
                await conn.execute(statement)
                # Had it passed: what it was for.
                await conn.execute("UPDATE ledger SET cost = 0, price = 0")
    finally:
        await conn.close()
    assert await ledger_state(schema) == before


@pytest.mark.parametrize("role", [SERVICE_ROLES["admission"], SERVICE_ROLES["gateway"],
                                  SERVICE_ROLES["placer"], READER_ROLE])
async def test_only_the_meters_role_writes_the_ledger_and_credits(
        schema: str, role_dsn: Callable[[str], str], role: str) -> None:
    conn = await asyncpg.connect(role_dsn(role))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("""INSERT INTO ledger (tenant, workload_id, flavor, gpus,
                start_us, end_us, gpu_us, price, cost, cause_id, kind, recorded_us)
                VALUES ('acme', 'forged', 'gpu-h100', 1, 0, 10, 10, 0, 0, 'x', 'usage', 0)""")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO credits (tenant, top_up_id, amount, recorded_us) "
                               "VALUES ('acme', 'forged', 1000, 0)")
    finally:
        await conn.close()


# What each service reads of another's tables: only what the owner publishes for it
# (meter 0009: meter_budget(), current_prices; gateway 0006: tenant_policies;
# admission 0003: job_status; admission 0004: open_holds for the meter).
READS = {
    "admission": ["meter_budget", "current_prices", "tenant_policies"],
    "placer": ["current_prices", "tenant_policies", "job_status"],
    "gateway": ["current_prices", "tenant_policies", "job_status"],
    "meter": ["current_prices", "open_holds"],
}
PUBLISHED = {  # what each answers over the fixture: one ledger row, 1 GPU-s at 0.001
    "meter_budget": ("SELECT charged FROM meter_budget('acme', 0, '{w1}', true)",
                     Decimal("0.001")),
    "current_prices": ("SELECT price_per_gpu_s FROM current_prices "
                       "WHERE flavor = 'gpu-h100'", Decimal("0.001")),
    "tenant_policies": ("SELECT count(*) FROM tenant_policies", 0),
    "job_status": ("SELECT count(*) FROM job_status", 0),
    "open_holds": ("SELECT count(*) FROM open_holds", 0),
}
OTHERS_TABLES = {
    "admission": ["ledger", "credits", "allocations", "prices", "tenant_profiles"],
    "placer": ["ledger", "credits", "allocations", "prices", "tenant_profiles",
               "reservations", "open_reservations", "jobs", "job_transitions"],
    "gateway": ["ledger", "credits", "allocations", "prices", "reservations",
                "open_reservations", "jobs", "job_transitions"],
    "meter": ["jobs", "job_transitions", "tenant_profiles", "reservations",
              "reservation_releases", "open_reservations"],
}


@pytest.mark.parametrize("service", sorted(READS))
async def test_a_service_reads_another_services_tables_only_through_what_it_publishes(
        schema: str, role_dsn: Callable[[str], str], service: str) -> None:
    conn = await asyncpg.connect(role_dsn(SERVICE_ROLES[service]))
    try:
        for name, (query, expected) in PUBLISHED.items():
            if name in READS[service]:
                assert await conn.fetchval(query) == expected, name
            else:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetchval(query)
        for table in OTHERS_TABLES[service]:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval(f"SELECT count(*) FROM {table}")
    finally:
        await conn.close()


async def test_the_reader_logs_in_with_its_password_reads_and_never_writes(
        stack: Stack, schema: str) -> None:
    conn = await asyncpg.connect(stack.dsn(READER_ROLE, schema.rsplit("/", 1)[1]))
    try:
        assert await conn.fetchval("SELECT count(*) FROM ledger") == 1
        for table in ("credits", "prices", "jobs", "job_transitions", "tenant_profiles",
                      "reservations"):
            await conn.fetchval(f"SELECT count(*) FROM {table}")
        await conn.fetchval("SELECT count(key_id) FROM api_keys")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # no secret hashes
            await conn.fetchval("SELECT count(secret_hash) FROM api_keys")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO credits (tenant, top_up_id, amount, recorded_us) "
                               "VALUES ('acme', 'x', 1, 0)")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SET session_replication_role = replica")
    finally:
        await conn.close()


async def test_a_superuser_can_still_delete_in_replica_mode_and_leaves_a_gap(
        schema: str) -> None:
    """The limit, stated as a test: the triggers do not bind a superuser who turns
    them off. What it leaves behind for an audit is a gap in ledger.row_id."""
    conn = await asyncpg.connect(schema)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("DELETE FROM ledger")
        assert await conn.fetchval("SELECT count(*) FROM ledger") == 0
        # The sequence remembers the row: the next one is not 1.
        assert await conn.fetchval("SELECT last_value FROM ledger_row_id_seq") == 1
    finally:
        await conn.close()


# The budget holds as meter migration 0001 created them until admission's 0004 took
# them over (the append-only triggers included).
OLD_HOLDS_SQL = """
CREATE TABLE reservations (
  reservation_id  text PRIMARY KEY,
  tenant          text NOT NULL,
  workload_id     text NOT NULL,
  amount          numeric(30, 9) NOT NULL CHECK (amount >= 0),
  created_us      bigint NOT NULL);
CREATE INDEX reservations_tenant ON reservations (tenant);
CREATE TABLE reservation_releases (
  reservation_id  text PRIMARY KEY REFERENCES reservations,
  reason          text NOT NULL,
  released_us     bigint NOT NULL);
CREATE TRIGGER reservations_append_only BEFORE UPDATE OR DELETE ON reservations
  FOR EACH ROW EXECUTE FUNCTION kestrel_reject_change();
CREATE TRIGGER reservation_releases_append_only BEFORE UPDATE OR DELETE
  ON reservation_releases FOR EACH ROW EXECUTE FUNCTION kestrel_reject_change();
"""


async def test_provisioning_adopts_a_database_the_superuser_migrated(
        stack: Stack, database: str, role_dsn: Callable[[str], str], tmp_path: Path) -> None:
    """A stack made before the roles: tables owned by the superuser. Adopted, the owner
    runs the remaining migrations (the grants) and the meter's role writes."""
    old = tmp_path / "meter"
    old.mkdir()
    for f in sorted(METER_MIGRATIONS.glob("000[1-4]_*.sql")):
        shutil.copy(f, old / f.name)
    su = await asyncpg.connect(database)
    try:
        await migrate(su, "meter", old)
        assert await su.fetchval(
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'ledger'") \
            == "postgres"
        # Holds as the meter's migrations made them before admission owned them, made
        # before open_reservations existed: admission 0004 adopts them and starts the
        # projection with the open one.
        await su.execute(OLD_HOLDS_SQL)
        await su.execute("""INSERT INTO reservations VALUES ('old-open', 'acme', 'w', 1, 0),
                                                            ('old-done', 'acme', 'v', 1, 0);
                            INSERT INTO reservation_releases VALUES ('old-done', 'x', 1)""")
        await su.execute(adopt_database_sql(database.rsplit("/", 1)[1]))
        await su.execute(adopt_database_sql(database.rsplit("/", 1)[1]))  # idempotent
    finally:
        await su.close()
    owner = await asyncpg.connect(role_dsn(OWNER_ROLE))
    try:
        assert await migrate(owner, "meter", METER_MIGRATIONS) == [
            "0005_roles.sql", "0006_ledger_chain.sql", "0007_rolling_reservations.sql",
            "0008_open_reservations.sql", "0009_reads_for_others.sql",
            "0010_meter_replicas.sql"]
        assert await migrate(owner, "admission", ADMISSION_MIGRATIONS) == [
            "0001_jobs.sql", "0002_roles.sql", "0003_reads_for_others.sql",
            "0004_budget_holds.sql", "0005_open_holds_by_workload.sql",
            "0006_tenant_books.sql"]
        assert await owner.fetchval("SELECT array_agg(reservation_id) FROM open_reservations") \
            == ["old-open"]
        assert await owner.fetchval("SELECT array_agg(workload_id) FROM open_holds") == ["w"]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # still append-only
            await owner.execute("DELETE FROM reservations")
    finally:
        await owner.close()
    meter = await asyncpg.connect(role_dsn(SERVICE_ROLES["meter"]))
    try:
        await meter.execute("INSERT INTO tenants VALUES ('acme', $1)", T0)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await meter.execute("ALTER TABLE ledger DISABLE TRIGGER USER")
    finally:
        await meter.close()


async def test_kestrel_migrate_applies_every_schema_as_the_owner_then_services_need_no_owner(
        database: str, role_dsn: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    """What the Helm chart's init containers run: the services then start with their
    own roles only, find their schema current, and warn about nothing."""
    env = {**os.environ, "KESTREL_POSTGRES_OWNER_DSN": role_dsn(OWNER_ROLE)}
    first = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "kestrel.migrate"], env=env,
        capture_output=True, text=True, check=True, timeout=120)
    assert [line.split(":")[1].strip() for line in first.stdout.splitlines()] == [
        "meter", "gateway", "admission"]
    assert all("applied 0001_" in line for line in first.stdout.splitlines())
    again = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "kestrel.migrate", "meter"], env=env,
        capture_output=True, text=True, check=True, timeout=120)
    assert again.stdout.strip() == "migrate: meter: up to date"
    for component, migrations in COMPONENTS:
        assert migrations_of(component) == migrations
        own = Stores(nats_url="", redis_url="",
                        postgres_dsn=role_dsn(SERVICE_ROLES[component]))
        with caplog.at_level("WARNING", logger="kestrel"):
            assert await migrate_component(own, component, migrations) == []
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_kestrel_migrate_refuses_without_the_owner_or_an_unknown_component() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KESTREL_POSTGRES_OWNER_DSN"}
    none = subprocess.run([sys.executable, "-m", "kestrel.migrate"], env=env,
                          capture_output=True, text=True, check=False, timeout=60)
    assert none.returncode == 2
    assert "KESTREL_POSTGRES_OWNER_DSN is not set" in none.stderr
    bad = subprocess.run([sys.executable, "-m", "kestrel.migrate", "ledger"], env=env,
                         capture_output=True, text=True, check=False, timeout=60)
    assert bad.returncode == 2
    assert "unknown component ledger" in bad.stderr


async def test_admission_holds_and_releases_but_only_the_triggers_write_open_reservations(
        schema: str, role_dsn: Callable[[str], str]) -> None:
    conn = await asyncpg.connect(role_dsn(SERVICE_ROLES["admission"]))
    try:
        await conn.execute("INSERT INTO reservations (reservation_id, tenant, workload_id, "
                           "amount, created_us) VALUES ('h1', 'acme', 'h1', 2, 0)")
        assert await conn.fetchval(
            "SELECT amount FROM open_reservations WHERE reservation_id = 'h1'") == 2
        for statement in ("DELETE FROM open_reservations",
                          "UPDATE open_reservations SET amount = 0",
                          "INSERT INTO open_reservations VALUES ('h2', 'acme', 'h2', 1, false)"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
        await conn.execute("INSERT INTO reservation_releases VALUES ('h1', 'done', 1)")
        assert await conn.fetchval("SELECT count(*) FROM open_reservations") == 0
    finally:
        await conn.close()
    for role in (SERVICE_ROLES["gateway"], SERVICE_ROLES["placer"]):
        other = await asyncpg.connect(role_dsn(role))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await other.fetchval("SELECT count(*) FROM open_reservations")
        finally:
            await other.close()
