"""Kestrel in containers on one machine: what docker-compose.yml runs in each one.

    python -m kestrel_tools.containers provision              the one-shot first container
    python -m kestrel_tools.containers store postgres|nats|redis
    python -m kestrel_tools.containers migrate                every schema, as the tables' owner
    python -m kestrel_tools.containers service meter|admission|gateway|placer|autoscaler
    python -m kestrel_tools.containers prometheus             scraping the services above
    python -m kestrel_tools.containers health NAME            a compose health check
    python -m kestrel_tools.containers env                    the exports a client needs

Every container shares the host's network, as `make up`'s processes do, and binds
127.0.0.1 only: nothing is reachable from another machine, and the placer reaches
the local cluster's apiserver on its loopback address. The ports are a block of
their own (below; each `KESTREL_COMPOSE_*` variable overrides one), so `make up`'s
plane and the tests' on the same machine are left alone.

`provision` makes the secrets once, into the secrets volume: a password per Postgres
role and per NATS user (kestrel.pgroles, kestrel.natsauth) and the operator token;
it keeps them on later runs. `store` runs one store in the foreground with its data
in the data volume, exactly as kestrel_tools.devstack starts it (Postgres also gets the
roles, the database and password authentication), and stops it cleanly on SIGTERM.
`migrate` applies every schema as the tables' owner (kestrel.migrate) and exits: the
only container given the owner's DSN. `service` replaces itself with the service,
given only its own credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import types
import urllib.request
from pathlib import Path
from typing import Any

from kestrel import natsauth
from kestrel.pgroles import LOGIN_ROLES
from kestrel_tools.devstack import HOST, SUPERUSER, Stack, StackError

SECRETS_DIR = Path(os.environ.get("KESTREL_SECRETS_DIR", "/secrets"))
DATA_DIR = Path(os.environ.get("KESTREL_DATA_DIR", "/data"))
SECRETS_FILE = "stack.json"
SERVICE_GROUP = 10001  # the services' user and group in docker-compose.yml


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"KESTREL_COMPOSE_{name}_PORT", default))


PORTS = {"postgres": _port("POSTGRES", 25432), "nats": _port("NATS", 24222),
         "nats_monitor": _port("NATS_MONITOR", 28222), "redis": _port("REDIS", 26379),
         "gateway": _port("GATEWAY", 23051), "admission": _port("ADMISSION", 23052),
         "meter": _port("METER", 23053), "placer": _port("PLACER", 23054),
         "autoscaler": _port("AUTOSCALER", 23055), "prometheus": _port("PROMETHEUS", 29090),
         # the gateway's OpenAI-compatible API (services/gateway/http.py)
         "gateway_http": _port("GATEWAY_HTTP", 28080),
         # the gateway's internal kestrel.v1.Replicas (the autoscaler's)
         "replicas": _port("REPLICAS", 23057)}
METRICS_PORTS = {"gateway": _port("GATEWAY_METRICS", 9351),
                 "admission": _port("ADMISSION_METRICS", 9352),
                 "meter": _port("METER_METRICS", 9353), "placer": _port("PLACER_METRICS", 9354),
                 "autoscaler": _port("AUTOSCALER_METRICS", 9355)}
STORES = ("postgres", "nats", "redis")
SERVICES = ("meter", "admission", "gateway", "placer", "autoscaler")
MIGRATES = ("meter", "gateway", "admission")
# What each service is given of the stores' credentials (the rest stays out of its env).
SERVICE_KEYS = {
    "meter": ("KESTREL_METER_POSTGRES_DSN", "KESTREL_METER_NATS_URL"),
    "admission": ("KESTREL_ADMISSION_POSTGRES_DSN", "KESTREL_ADMISSION_NATS_URL"),
    "gateway": ("KESTREL_GATEWAY_POSTGRES_DSN", "KESTREL_GATEWAY_NATS_URL",
                "KESTREL_REDIS_URL"),
    "placer": ("KESTREL_PLACER_POSTGRES_DSN", "KESTREL_PLACER_NATS_URL", "KESTREL_REDIS_URL"),
    "autoscaler": ("KESTREL_AUTOSCALER_NATS_URL", "KESTREL_REDIS_URL"),
}
NEEDS_TOKEN = ("gateway",)


def provision(secrets_dir: Path = SECRETS_DIR) -> dict[str, Any]:
    """Make (once) and return the passwords and the operator token. The file is the
    root's, readable by the services' group, by nobody else."""
    path = secrets_dir / SECRETS_FILE
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    passwords = data.setdefault("passwords", {})
    for role in (SUPERUSER, *LOGIN_ROLES):
        passwords.setdefault(role, secrets.token_hex(16))
    nats = data.setdefault("nats_passwords", {})
    for user in natsauth.GRANTS:
        nats.setdefault(user, secrets.token_hex(16))
    data.setdefault("operator_token", f"kso_{secrets.token_urlsafe(32)}")
    secrets_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2))
    if os.geteuid() == 0:
        os.chown(tmp, 0, SERVICE_GROUP)
    os.chmod(tmp, 0o640)
    tmp.replace(path)
    return data


def load_secrets(secrets_dir: Path = SECRETS_DIR) -> dict[str, Any]:
    path = secrets_dir / SECRETS_FILE
    try:
        return dict(json.loads(path.read_text()))
    except OSError as exc:
        raise StackError(f"{path}: {exc.strerror} (the provision container makes it)") from exc


def stack_for(root: Path, data: dict[str, Any]) -> Stack:
    """A devstack description of the compose stores: fixed ports, the shared secrets."""
    return Stack(root, pg_port=PORTS["postgres"], nats_port=PORTS["nats"],
                 nats_monitor_port=PORTS["nats_monitor"], redis_port=PORTS["redis"],
                 passwords=dict(data["passwords"]), nats_passwords=dict(data["nats_passwords"]))


def service_env(name: str, data: dict[str, Any]) -> dict[str, str]:
    """The service's own credentials, every service's address, its ports; the owner's
    DSN is not among them (kestrel.migrate gets it, before)."""
    everything = stack_for(Path("/nonexistent"), data).env()
    env = {k: everything[k] for k in SERVICE_KEYS[name]}
    env.update({f"KESTREL_{n.upper()}_ADDR": f"{HOST}:{PORTS[n]}" for n in SERVICES})
    env.update({f"KESTREL_{name.upper()}_PORT": str(PORTS[name]),
                f"KESTREL_{name.upper()}_METRICS_PORT": str(METRICS_PORTS[name]),
                "KESTREL_BIND_HOST": HOST})
    env["KESTREL_REPLICAS_ADDR"] = f"{HOST}:{PORTS['replicas']}"
    if name == "gateway":
        env["KESTREL_GATEWAY_HTTP_PORT"] = str(PORTS["gateway_http"])
        env["KESTREL_REPLICAS_PORT"] = str(PORTS["replicas"])
    if name in NEEDS_TOKEN:
        env["KESTREL_OPERATOR_TOKEN"] = str(data["operator_token"])
    return env


def client_env(data: dict[str, Any]) -> dict[str, str]:
    """What the CLI, the SDK and grpcurl need to reach this stack as its operator."""
    return {"KESTREL_GATEWAY_ADDR": f"{HOST}:{PORTS['gateway']}",
            "KESTREL_OPENAI_BASE_URL": f"http://{HOST}:{PORTS['gateway_http']}/v1",
            "KESTREL_METER_ADDR": f"{HOST}:{PORTS['meter']}",
            "KESTREL_ADMISSION_ADDR": f"{HOST}:{PORTS['admission']}",
            "KESTREL_PLACER_ADDR": f"{HOST}:{PORTS['placer']}",
            "KESTREL_OPERATOR_TOKEN": str(data["operator_token"])}


def run_store(name: str) -> int:
    """Start one store as kestrel_tools.devstack does, then wait on it in the foreground;
    SIGTERM (docker stop) is passed on as the store's own clean-shutdown signal."""
    stack = stack_for(DATA_DIR / name, load_secrets())
    stack.root.mkdir(parents=True, exist_ok=True)
    os.chmod(stack.root, 0o755)
    getattr(stack, f"_start_{name}")(120.0)
    if name == "postgres":
        stack.provision()
    stack.save()
    pid = stack.pids[name]
    print(f"{name} serving on {HOST} (pid {pid}), data in {DATA_DIR / name}", flush=True)

    def stop(signum: int, _frame: types.FrameType | None) -> None:
        os.kill(pid, signal.SIGINT if name == "postgres" else signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _, status = os.waitpid(pid, 0)
    log = stack.root / f"{name}.log"
    if log.exists():  # the store's own log, for `docker compose logs`
        sys.stdout.write(log.read_text(errors="replace")[-4000:])
    return os.waitstatus_to_exitcode(status)


def run_migrate() -> int:
    """Every schema, as the tables' owner, then exit: the one container that holds the
    owner's DSN (the services read one another's tables until issue 11's split, so
    all schemas are current before any service starts)."""
    owner = stack_for(Path("/nonexistent"), load_secrets()).env()["KESTREL_POSTGRES_OWNER_DSN"]
    env = {**os.environ, "KESTREL_POSTGRES_OWNER_DSN": owner}
    return subprocess.run([sys.executable, "-m", "kestrel.migrate", *MIGRATES], env=env,
                          check=False).returncode


def run_service(name: str) -> int:
    data = load_secrets()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KESTREL_POSTGRES")}
    env.update(service_env(name, data))
    os.execvpe(sys.executable, [sys.executable, "-m", f"services.{name}"], env)
    return 127  # not reached


def run_prometheus() -> int:
    """Prometheus in the foreground, scraping this stack's services (kestrel_tools.prometheus
    with the compose ports; the alert rules are deploy/prometheus/rules)."""
    from kestrel_tools import prometheus

    root = DATA_DIR / "prometheus"
    metrics = {n: f"{HOST}:{p}" for n, p in METRICS_PORTS.items()}
    config = prometheus.scrape_config(metrics, root, kube=None)
    path = prometheus.write_config(root, config)
    argv = [str(prometheus.prometheus_bin()), f"--config.file={path}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address={HOST}:{PORTS['prometheus']}",
            "--storage.tsdb.retention.time=2d"]
    os.execv(argv[0], argv)
    return 127  # not reached


def healthy(name: str) -> bool:
    """One check, for compose's healthcheck: the store answers, or the service's
    grpc.health.v1 says SERVING."""
    if name == "postgres":
        import socket

        with socket.create_connection((HOST, PORTS["postgres"]), timeout=2):
            pass
        stack = stack_for(DATA_DIR / name, load_secrets())
        return stack._psql_socket("kestrel", "SELECT 1") == "1"
    if name == "nats":
        url = f"http://{HOST}:{PORTS['nats_monitor']}/healthz?js-enabled-only=true"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    if name == "prometheus":
        with urllib.request.urlopen(f"http://{HOST}:{PORTS['prometheus']}/-/ready",
                                    timeout=2) as resp:
            return bool(resp.status == 200)
    if name == "redis":
        import socket

        with socket.create_connection((HOST, PORTS["redis"]), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from kestrel_sdk.tls import channel as tls_channel

    with tls_channel(f"{HOST}:{PORTS[name]}") as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=3)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.containers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("provision")
    sub.add_parser("store").add_argument("name", choices=STORES)
    sub.add_parser("service").add_argument("name", choices=SERVICES)
    sub.add_parser("migrate")
    sub.add_parser("prometheus")
    sub.add_parser("health").add_argument("name", choices=(*STORES, *SERVICES, "prometheus"))
    sub.add_parser("env")
    args = ap.parse_args(argv)
    try:
        if args.command == "provision":
            data = provision()
            print(f"secrets in {SECRETS_DIR / SECRETS_FILE}: {len(data['passwords'])} "
                  f"Postgres roles, {len(data['nats_passwords'])} NATS users, an operator "
                  "token")
            return 0
        if args.command == "store":
            return run_store(args.name)
        if args.command == "service":
            return run_service(args.name)
        if args.command == "migrate":
            return run_migrate()
        if args.command == "prometheus":
            return run_prometheus()
        if args.command == "env":
            for k, v in client_env(load_secrets()).items():
                print(f"export {k}={v}")
            return 0
        return 0 if healthy(args.name) else 1
    except (StackError, OSError, subprocess.CalledProcessError) as exc:
        print(f"kestrel_tools.containers {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a health check's failure of any kind is "unhealthy"
        if args.command != "health":
            raise
        print(f"{args.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
