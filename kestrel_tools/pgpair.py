"""A Postgres primary and a synchronous standby with automatic failover, on loopback.

Patroni (from PyPI, in a venv of its own) runs each member and keeps its leader key
in an etcd of the stack's own; Postgres is the stack's embedded build. The standby is
synchronous (`synchronous_mode`): a commit the primary acknowledged is on the standby
too, so the standby Patroni promotes when the primary dies has every acknowledged
ledger row. `primary_start_timeout: 0` makes a crashed primary postmaster a failover
at once rather than a restart in place; the old primary then rejoins as the standby
(pg_rewind, or a fresh base backup if it diverged).

Services reach whichever member is primary with a libpq multi-host URL and
`target_session_attrs=read-write` (`Stack.dsn`).

Why an etcd of the stack's own rather than the cluster's: the stack (`make up`, the
test fixtures) lives without a cluster, and the cluster's etcd is deleted with it.

Postgres refuses to run as root, and Patroni runs Postgres as its own user, so when we
are root Patroni runs as the stack's Postgres user; its venv is therefore built in
the public cache directory with the system's Python (the checkout's interpreter may
sit under a private home).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

PATRONI_VERSION = "4.1.5"
SCOPE = "kestrel"
REPLICATION_ROLE = "kestrel_replicator"
# Patroni's own floor is a TTL of 20 s; loop_wait + 2 x retry_timeout must fit in it.
TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 20, 1, 5


def patroni_venv(public: Path) -> Path:
    """`patroni` from a venv under `public`, built once per version (about 10 s); a
    build cut short (no `.complete`) is started again."""
    venv = public / f"patroni-{PATRONI_VERSION}"
    exe, done = venv / "bin" / "patroni", venv / ".complete"
    if done.exists():
        return exe
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
    shutil.rmtree(venv, ignore_errors=True)
    public.mkdir(parents=True, exist_ok=True)
    os.chmod(public, 0o755)
    subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
    result = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q",
         f"patroni[etcd3,psycopg3]=={PATRONI_VERSION}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip install patroni=={PATRONI_VERSION} failed:\n{result.stderr}")
    done.touch()
    return exe


def member_config(*, name: str, home: Path, pg_port: int, rest_port: int, etcd_port: int,
                  bin_dir: Path, superuser_password: str, replication_password: str,
                  durable: bool) -> dict[str, object]:
    """Patroni's configuration of one member (YAML is a superset of the JSON we write)."""
    data = home / "data"
    parameters: dict[str, object] = {
        "max_connections": 200, "shared_buffers": "128MB", "wal_level": "replica",
        "hot_standby": "on", "max_wal_senders": 6, "max_replication_slots": 6,
        "wal_log_hints": "on", "wal_keep_size": "256MB"}
    if not durable:
        parameters |= {"fsync": "off", "full_page_writes": "off"}
    return {
        "scope": SCOPE, "name": name,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"127.0.0.1:{rest_port}",
                    "connect_address": f"127.0.0.1:{rest_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"]},
        "bootstrap": {
            "dcs": {"ttl": TTL_S, "loop_wait": LOOP_WAIT_S, "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 1048576, "synchronous_mode": True,
                    "primary_start_timeout": 0,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                   "parameters": parameters}},
            "initdb": [{"encoding": "UTF8"}, "data-checksums"]},
        "postgresql": {
            "listen": f"127.0.0.1:{pg_port}", "connect_address": f"127.0.0.1:{pg_port}",
            "data_dir": str(data), "bin_dir": str(bin_dir), "pgpass": str(home / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": superuser_password},
                "replication": {"username": REPLICATION_ROLE,
                                "password": replication_password}},
            "parameters": {"unix_socket_directories": str(data)},
            "pg_hba": ["local all all trust",
                       f"host replication {REPLICATION_ROLE} 127.0.0.1/32 scram-sha-256",
                       "host all all 127.0.0.1/32 scram-sha-256",
                       "host all all ::1/128 scram-sha-256"],
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True},
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def write_config(path: Path, config: dict[str, object], owner: tuple[int, int] | None) -> None:
    """The member's configuration, readable by its Patroni only (it holds passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(config, indent=2))
    if owner:
        os.chown(path, *owner)


def etcd_argv(binary: Path, data: Path, client_port: int, peer_port: int) -> list[str]:
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [str(binary), "--name", "kestrel-pg", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kestrel-pg={peer}", "--log-level", "warn"]


def rest(port: int, path: str, timeout_s: float = 1.0) -> tuple[int, dict[str, object]]:
    """GET a member's REST API: (HTTP status, body); (0, {}) when it does not answer.
    /primary answers 200 on the leader only, /sync on the synchronous standby only."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        return exc.code, body
    except (OSError, ValueError):
        return 0, {}


def postmaster_pid(data: Path) -> int | None:
    """The pid in a data directory's postmaster.pid, if there is one."""
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
