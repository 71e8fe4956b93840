"""python -m kestrel_tools.provision: what an operator applies to existing Postgres and NATS
servers, applied here to the test session's real ones."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import nats
import pytest

from kestrel.pgroles import SERVICE_ROLES, provision_roles_sql
from kestrel_tools.devstack import SUPERUSER, Stack, _nats_bin, _pg_bin, free_ports

pytestmark = pytest.mark.integration


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


async def test_the_sql_makes_roles_a_database_and_the_services_log_in_with_their_own(
        stack: Stack, tmp_path: Path) -> None:
    database = f"prov_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "stores"
    made = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "kestrel_tools.provision", "--postgres-host", "127.0.0.1",
        "--postgres-port", str(stack.pg_port), "--database", database,
        "--nats-host", "127.0.0.1", "--nats-port", str(stack.nats_port),
        "--redis-url", stack.redis_url, "--out", str(out)],
        capture_output=True, text=True, check=True, timeout=60)
    assert "wrote" in made.stdout
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "postgres.sql": 0o600, "nats-users.conf": 0o600, "stores.env": 0o600}
    env = _env_file(out / "stores.env")
    try:
        await asyncio.to_thread(subprocess.run, [
            str(_pg_bin("psql")), stack.dsn(SUPERUSER, "postgres"), "-v", "ON_ERROR_STOP=1",
            "-q", "-f", str(out / "postgres.sql")], capture_output=True, text=True,
            check=True, timeout=60)
        await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "kestrel.migrate"],
                                env={**os.environ, **env}, check=True, timeout=120,
                                capture_output=True)
        for svc in SERVICE_ROLES:
            conn = await asyncpg.connect(env[f"KESTREL_{svc.upper()}_POSTGRES_DSN"])
            try:
                assert await conn.fetchval("SELECT current_user") == SERVICE_ROLES[svc]
                assert await conn.fetchval("SELECT count(*) FROM schema_migrations") > 0
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute("CREATE TABLE mine (x int)")
            finally:
                await conn.close()
    finally:  # the session's other tests log in with the stack's own passwords
        await asyncio.to_thread(subprocess.run, [
            str(_pg_bin("psql")), stack.dsn(SUPERUSER, "postgres"), "-v", "ON_ERROR_STOP=1",
            "-q", "-c", provision_roles_sql(stack.passwords),
            "-c", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"],
            capture_output=True, text=True, check=True, timeout=60)
    again = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "kestrel_tools.provision", "--postgres-host", "h", "--nats-host", "n",
        "--redis-url", "redis://r", "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=60)
    assert again.returncode == 1 and "nothing written" in again.stderr


async def test_a_nats_server_given_the_users_block_lets_each_service_in_as_itself(
        tmp_path: Path) -> None:
    from kestrel_tools import provision

    port, monitor = free_ports(2)
    made = provision.files("db", 5432, "kestrel", "127.0.0.1", port, "redis://r")
    (tmp_path / "nats-users.conf").write_text(made["nats-users.conf"])
    (tmp_path / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n"
        f"jetstream {{ store_dir: {tmp_path / 'js'} }}\ninclude nats-users.conf\n")
    server = await asyncio.create_subprocess_exec(
        str(_nats_bin()), "-c", str(tmp_path / "nats.conf"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = dict(line.split("=", 1) for line in made["stores.env"].splitlines())
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        for _ in range(100):
            try:
                nc = await nats.connect(env["KESTREL_METER_NATS_URL"], error_cb=on_error,
                                        allow_reconnect=False, connect_timeout=1)
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("nats-server did not come up")
        errors.clear()  # the refused attempts while it started
        await nc.publish("kestrel.runway.acme", b"{}")  # the meter's to publish
        await nc.flush()
        assert not errors
        await nc.publish("kestrel.workload.acme.started", b"{}")  # the placer's only
        await nc.flush()
        await asyncio.sleep(0.3)  # the server's -ERR for a refused publish is async
        assert any("permissions violation" in str(e).lower() for e in errors), errors
        await nc.close()
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(env["KESTREL_METER_NATS_URL"].replace("meter:", "placer:"),
                               allow_reconnect=False, connect_timeout=1)
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
