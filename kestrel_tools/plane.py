"""The whole control plane on this machine, for people (tests start their own).

    python -m kestrel_tools.plane up|down|status|env

`up` starts the devstack (Postgres, NATS JetStream, Redis) and the services —
meter, gateway, admission, and the placer and the autoscaler when the Kubernetes
data plane is up — as detached processes on their default loopback ports, with logs and an
operator token under .run/plane, then a Prometheus (kestrel_tools.prometheus) on
127.0.0.1:19090 scraping them, the model workers, and kube-apiserver and Kueue
when the data plane is up. `env` prints the exports the CLI, the SDK
and grpcurl need. Idempotent: `up` starts only what is not running, and says
for each component whether it was reused, started, or found dead and restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from kestrel_tools import prometheus
from kestrel_tools.devstack import Stack, StackError, open_stack
from kestrel_tools.procs import REPO, ServiceProcess, wait_serving

ROOT = REPO / ".run" / "plane"
PORTS = {"meter": 50053, "admission": 50052, "gateway": 50051, "placer": 50054,
         "autoscaler": 50055}
HTTP_PORT = 8080  # the gateway's OpenAI-compatible API (services/gateway/http.py)
REPLICAS_PORT = 50057  # the gateway's internal kestrel.v1.Replicas (the autoscaler's)
WITH_CLUSTER = ("placer", "autoscaler")  # started only when the data plane is up
TOKEN_FILE = ROOT / "operator-token"
METRICS_PORTS = prometheus.DEFAULT_METRICS_PORTS
PROMETHEUS_DIR = ROOT / "prometheus"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _state() -> dict[str, int]:
    path = ROOT / "pids.json"
    return {k: int(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


def _save(pids: dict[str, int]) -> None:
    (ROOT / "pids.json").write_text(json.dumps(pids))


def service_env(stack: Stack) -> dict[str, str]:
    return {**stack.env(), "KESTREL_OPERATOR_TOKEN_FILE": str(TOKEN_FILE),
            "KESTREL_GATEWAY_HTTP_PORT": str(HTTP_PORT),
            "KESTREL_REPLICAS_PORT": str(REPLICAS_PORT),
            "KESTREL_REPLICAS_ADDR": f"127.0.0.1:{REPLICAS_PORT}",
            **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in PORTS.items()},
            **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in PORTS.items()},
            **{f"KESTREL_{n.upper()}_METRICS_PORT": str(p) for n, p in METRICS_PORTS.items()}}


def up(with_placer: bool | None = None) -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    stack = open_stack(ROOT / "devstack")
    for line in stack.up().values():  # what was reused, started or restarted, and why
        print(line)
    pids = _state()
    names = ["meter", "gateway", "admission"]
    if with_placer is None:
        from kestrel_tools import cluster

        with_placer = cluster.is_up()
    if with_placer:
        names += WITH_CLUSTER
    for name in names:
        old = pids.get(name)
        if old and _alive(old):
            print(f"{name} is running (pid {old}): reused")
            continue
        log = ROOT / f"{name}.log"
        proc = ServiceProcess(name, service_env(stack), f"127.0.0.1:{PORTS[name]}", log,
                              detach=True).start()
        pids[name] = proc.pid
        _save(pids)
        what = f"{name} was not running (pid {old} gone): restarted" if old else f"{name} started"
        print(f"{what} as pid {proc.pid} on 127.0.0.1:{PORTS[name]}, log {log}")
    prom = prometheus.Prometheus.open(PROMETHEUS_DIR)
    metrics = {n: f"127.0.0.1:{METRICS_PORTS[n]}" for n in names}
    print(prom.up(prometheus.plane_config(PROMETHEUS_DIR, metrics),
                  port=prometheus.DEFAULT_PORT))
    print(f"prometheus: {prom.url} (alerts {prom.url}/alerts, targets {prom.url}/targets)")
    if TOKEN_FILE.exists():
        print(f"operator token in {TOKEN_FILE}; eval $(python -m kestrel_tools.plane env)")


def down() -> None:
    """SIGTERM every service (they drain), SIGKILL what is still there after 10 s."""
    pids = [pid for pid in _state().values() if _alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    _save({})
    prometheus.Prometheus.open(PROMETHEUS_DIR).down()
    open_stack(ROOT / "devstack").down()
    print("plane down")


def status() -> int:
    pids = _state()
    ok = True
    for name, port in PORTS.items():
        pid = pids.get(name)
        running = bool(pid and _alive(pid))
        if running:
            try:
                wait_serving(f"127.0.0.1:{port}", timeout_s=2)
            except (TimeoutError, RuntimeError):
                running = False
        ok &= running or name in WITH_CLUSTER
        print(f"{name:<10} {'serving' if running else 'stopped':<8} 127.0.0.1:{port}")
    prom = prometheus.Prometheus.open(PROMETHEUS_DIR)
    serving = prom.running() and prom.ready()
    print(f"{'prometheus':<10} {'serving' if serving else 'stopped':<8} {prom.url}")
    return 0 if ok else 3


def env() -> None:
    stack = open_stack(ROOT / "devstack")
    for k, v in {**stack.env(), "KESTREL_GATEWAY_ADDR": f"127.0.0.1:{PORTS['gateway']}",
                 "KESTREL_METER_ADDR": f"127.0.0.1:{PORTS['meter']}"}.items():
        print(f"export {k}={v}")
    if TOKEN_FILE.exists():
        print(f"export KESTREL_OPERATOR_TOKEN={TOKEN_FILE.read_text().strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.plane", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "env"])
    args = ap.parse_args(argv)
    try:
        if args.command == "up":
            up()
            return status()
        if args.command == "down":
            down()
        elif args.command == "env":
            env()
        else:
            return status()
    except (StackError, RuntimeError, TimeoutError, OSError) as exc:
        print(f"plane: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
