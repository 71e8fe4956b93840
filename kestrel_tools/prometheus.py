"""A real Prometheus beside the plane: generated configuration, loopback process.

    python -m kestrel_tools.prometheus config|up|down|status [--dir DIR]

`scrape_config()` writes prometheus.yml from what runs: the /metrics address of
every Kestrel service, the model workers (a file_sd target list, empty until
endpoints exist), and, when the local Kubernetes data plane is up,
kube-apiserver (the kubeconfig's client certificate) and Kueue (a bearer token
of the ServiceAccount `kube-system/kestrel-prometheus`, which may GET /metrics:
Kueue's metrics server authenticates with TokenReview, not client
certificates). Rules are deploy/prometheus/rules/*.yml.

`Prometheus` runs Debian's `prometheus` (installed by `make setup`) on
127.0.0.1 with its own data directory, waits for /-/ready, and keeps its pid
and port in DIR/prometheus.json, like kestrel_tools.devstack does for its servers.
`make up` and `make demo` start one; tests start their own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # PyYAML (pinned in pyproject; the kubernetes client needs it too)

from kestrel_tools.cluster.processes import pid_alive
from kestrel_tools.devstack import HOST, StackError, _wait, free_port
from kestrel_tools.procs import REPO

DEPLOY = REPO / "deploy" / "prometheus"
RULES_DIR = DEPLOY / "rules"
KUBE_RBAC = DEPLOY / "kube-rbac.yaml"
SERVICE_ACCOUNT = ("kube-system", "kestrel-prometheus")
DEFAULT_PORT = int(os.environ.get("KESTREL_PROMETHEUS_PORT", "19090"))
# Where each service serves /metrics when nothing else says (services/*/app.py).
DEFAULT_METRICS_PORTS = {"gateway": 9151, "admission": 9152, "meter": 9153, "placer": 9154,
                         "autoscaler": 9155}
WORKERS_FILE = "model-workers.json"


def prometheus_bin() -> Path:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if not found:
        raise StackError("prometheus not found: run `make setup` (Debian prometheus)")
    return Path(found)


# --- kube credentials ---------------------------------------------------------


@dataclass(frozen=True)
class KubeScrape:
    """How Prometheus reaches the data plane's own /metrics."""

    apiserver: str  # host:port
    ca_file: str
    cert_file: str
    key_file: str
    kueue: str  # host:port
    kueue_ca_file: str
    kueue_token_file: str


def kube_scrape(root: Path, token_hours: int = 48) -> KubeScrape | None:
    """Credentials for kube-apiserver and Kueue, or None when the cluster is not up.

    Applies deploy/prometheus/kube-rbac.yaml (idempotent) and writes a fresh token
    of its ServiceAccount to root/kueue-token (0600)."""
    from kestrel_tools import cluster as kc

    if not kc.apiserver_ready():
        return None
    cfg = yaml.safe_load(kc.PATHS.kubeconfig.read_text())
    cl = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    kc.kubectl("apply", "-f", str(KUBE_RBAC), check=True)
    ns, sa = SERVICE_ACCOUNT
    token = kc.kubectl("create", "token", sa, "-n", ns, f"--duration={token_hours}h",
                       check=True).stdout.strip()
    root.mkdir(parents=True, exist_ok=True)
    token_file = root / "kueue-token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    server = urllib.parse.urlparse(cl["server"])
    return KubeScrape(
        apiserver=server.netloc, ca_file=cl["certificate-authority"],
        cert_file=user["client-certificate"], key_file=user["client-key"],
        kueue=f"127.0.0.1:{kc.KUEUE_METRICS_PORT}",
        # What Kueue serves: it reads (and watches) this fixed path (kestrel_tools.cluster).
        kueue_ca_file=str(kc.KUEUE_METRICS_CERT_PATH / "tls.crt"),
        kueue_token_file=str(token_file))


# --- configuration ------------------------------------------------------------

# kube-apiserver exposes tens of thousands of series; keep the families the
# dashboards and an operator read.
APISERVER_KEEP = ("apiserver_request_total|apiserver_request_duration_seconds_(bucket|sum|count)"
                  "|apiserver_current_inflight_requests|apiserver_storage_objects"
                  "|etcd_request_duration_seconds_(sum|count)|process_.*|up")


def scrape_config(services: Mapping[str, str], root: Path, *, kube: KubeScrape | None,
                  scrape_interval_s: float = 5.0, rules_dir: Path = RULES_DIR) -> dict[str, Any]:
    """prometheus.yml as a dict. `services`: name -> host:port of its /metrics."""
    ms = max(1, round(scrape_interval_s * 1000))
    interval = f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
    jobs: list[dict[str, Any]] = [
        {"job_name": f"kestrel-{name}",
         "static_configs": [{"targets": [addr], "labels": {"service": name}}]}
        for name, addr in sorted(services.items())]
    # The model workers of endpoints (not built yet): a target list the plane rewrites
    # as replicas come and go; Prometheus re-reads it on change.
    jobs.append({"job_name": "kestrel-model-workers",
                 "file_sd_configs": [{"files": [str(root / "targets" / WORKERS_FILE)],
                                      "refresh_interval": "5s"}]})
    if kube is not None:
        jobs.append({
            "job_name": "kube-apiserver", "scheme": "https",
            "scrape_interval": "5s" if scrape_interval_s < 5 else interval,
            "tls_config": {"ca_file": kube.ca_file, "cert_file": kube.cert_file,
                           "key_file": kube.key_file},
            "static_configs": [{"targets": [kube.apiserver]}],
            "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                        "regex": APISERVER_KEEP}]})
        jobs.append({
            "job_name": "kueue", "scheme": "https",
            "tls_config": {"ca_file": kube.kueue_ca_file},
            "authorization": {"type": "Bearer", "credentials_file": kube.kueue_token_file},
            "static_configs": [{"targets": [kube.kueue]}]})
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval,
                   "external_labels": {"plane": "kestrel-local"}},
        "rule_files": [str(rules_dir / "*.yml")],
        "scrape_configs": jobs}


def write_config(root: Path, config: Mapping[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    targets = root / "targets" / WORKERS_FILE
    targets.parent.mkdir(exist_ok=True)
    if not targets.exists():
        targets.write_text("[]\n")  # no model workers until endpoints exist
    path = root / "prometheus.yml"
    path.write_text("# Generated by kestrel_tools.prometheus; rewritten on every start.\n"
                    + yaml.safe_dump(dict(config), sort_keys=False))
    return path


def write_worker_targets(root: Path, workers: Iterable[tuple[str, Mapping[str, str]]]) -> Path:
    """Replace the model workers' target list (file_sd): each worker's /metrics
    address with its labels (tenant, endpoint, replica). Prometheus re-reads it on
    change; written whole and renamed into place, so it never reads half a list."""
    path = root / "targets" / WORKERS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [{"targets": [addr], "labels": dict(labels)} for addr, labels in workers]
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)
    return path


# --- the process --------------------------------------------------------------


@dataclass
class Prometheus:
    """One Prometheus under one directory (config, data, log, state)."""

    root: Path
    port: int = 0
    pid: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def state_file(self) -> Path:
        return self.root / "prometheus.json"

    @classmethod
    def open(cls, root: Path) -> Prometheus:
        path = root / "prometheus.json"
        if path.exists():
            data = json.loads(path.read_text())
            return cls(root, int(data.get("port", 0)), int(data.get("pid", 0)))
        return cls(root)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"port": self.port, "pid": self.pid}))

    def running(self) -> bool:
        return bool(self.pid) and pid_alive(self.pid)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def up(self, config: Mapping[str, Any], port: int = 0, timeout_s: float = 60.0) -> str:
        """Write the configuration and start Prometheus, or reload the one running.
        Returns a line saying which."""
        path = write_config(self.root, config)
        if self.running():
            req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
            with urllib.request.urlopen(req, timeout=10):
                pass
            return f"prometheus is running (pid {self.pid}): reused, configuration reloaded"
        old = self.pid
        self.port = port or self.port or free_port()
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        log = self.root / "prometheus.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(prometheus_bin()), f"--config.file={path}",
                 f"--storage.tsdb.path={data}", f"--web.listen-address={HOST}:{self.port}",
                 "--web.enable-lifecycle", "--storage.tsdb.retention.time=2d",
                 "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root)
        self.pid = proc.pid
        self.save()
        _wait("prometheus", self.ready, timeout_s, proc, log)
        what = f"was not running (pid {old} gone): restarted" if old else "started"
        return f"prometheus {what} as pid {self.pid} on {self.url}, log {log}"

    def down(self, timeout_s: float = 10.0) -> None:
        if self.running():
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.running() and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, os.WNOHANG)
                time.sleep(0.05)
            if self.running():
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
        self.pid = 0
        if self.root.exists():
            self.save()

    # --- the HTTP API (tests and the CLI below) ---------------------------------

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector (an empty list when no series)."""
        data = self.api("query", query=expr)
        result = data["result"]
        return result if isinstance(result, list) else [result]

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])


def plane_config(root: Path, metrics: Mapping[str, str], scrape_interval_s: float = 5.0,
                 progress: Any = print) -> dict[str, Any]:
    """The configuration for a plane: its services' /metrics, the cluster's when up."""
    try:
        kube = kube_scrape(root)
    except Exception as exc:  # the cluster answered but not as expected
        progress(f"prometheus: not scraping Kubernetes ({exc})")
        kube = None
    if kube is None:
        progress("prometheus: the Kubernetes data plane is not up; scraping Kestrel only")
    return scrape_config(metrics, root, kube=kube, scrape_interval_s=scrape_interval_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.prometheus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["config", "up", "down", "status"])
    ap.add_argument("--dir", type=Path, default=REPO / ".run" / "plane" / "prometheus")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = ap.parse_args(argv)
    prom = Prometheus.open(args.dir)
    metrics = {n: f"{HOST}:{p}" for n, p in DEFAULT_METRICS_PORTS.items()}
    try:
        if args.command == "config":
            print(yaml.safe_dump(plane_config(args.dir, metrics, progress=lambda s: None),
                                 sort_keys=False))
        elif args.command == "up":
            print(prom.up(plane_config(args.dir, metrics), port=args.port))
        elif args.command == "down":
            prom.down()
            print("prometheus down")
        else:
            ok = prom.running() and prom.ready()
            print(f"prometheus {'serving' if ok else 'stopped':<8} {prom.url}")
            return 0 if ok else 3
    except (StackError, OSError, RuntimeError) as exc:
        print(f"prometheus: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
