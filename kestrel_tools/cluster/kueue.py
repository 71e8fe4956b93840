"""The Kueue manager: its configuration, its webhook and metrics certificates, its
CRDs, starting and stopping it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from kestrel_tools.cluster.health import kueue_pid
from kestrel_tools.cluster.paths import (
    KUEUE_HEALTH_PORT,
    KUEUE_METRICS_CERT_PATH,
    KUEUE_METRICS_PORT,
    KUEUE_WEBHOOK_PORT,
    PATHS,
    ClusterError,
    Progress,
    binary_paths,
    kueue_crd_dir,
    read_versions,
)
from kestrel_tools.cluster.processes import _run, kubectl, pid_alive, spawn_daemon, wait_until


def _write_kueue_config() -> Path:
    cfg_dir = PATHS.kueue_dir
    cfg_dir.mkdir(parents=True, exist_ok=True)
    certs = cfg_dir / "certs"
    config = f"""\
# Kueue manager configuration for the Kestrel data plane (kestrel_tools/cluster/kueue.py).
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:{KUEUE_HEALTH_PORT}
metrics:
  bindAddress: 127.0.0.1:{KUEUE_METRICS_PORT}
# The webhook server still starts (webhooks.Setup is unconditional) but no webhook
# configuration is registered with the apiserver: Jobs are created suspended with the
# kueue.x-k8s.io/queue-name label, so the mutating webhook is not needed.
webhook:
  host: 127.0.0.1
  port: {KUEUE_WEBHOOK_PORT}
  certDir: {certs}
internalCertManagement:
  enable: false
leaderElection:
  leaderElect: false
manageJobsWithoutQueueName: false
# The on-demand visibility API server is an aggregated apiserver that would bind
# 0.0.0.0:8082 and need an APIService registration; not used here.
featureGates:
  VisibilityOnDemand: false
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 10
    LocalQueue.kueue.x-k8s.io: 5
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 5
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 300
  burst: 500
integrations:
  frameworks:
  - "batch/job"
"""
    path = cfg_dir / "config.yaml"
    path.write_text(config)
    return path


def _ensure_kueue_certs(progress: Progress) -> None:
    """Self-signed serving cert for Kueue's webhook and metrics servers (openssl)."""
    certs = PATHS.kueue_dir / "certs"
    crt, key = certs / "tls.crt", certs / "tls.key"
    if not (crt.exists() and key.exists()):
        certs.mkdir(parents=True, exist_ok=True)
        _run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                "-keyout", str(key), "-out", str(crt), "-days", "3650",
                "-subj", "/CN=kueue-kestrel-local",
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ]
        )  # fmt: skip
        progress(f"  generated self-signed Kueue serving cert in {certs}")
    target = KUEUE_METRICS_CERT_PATH
    if target.is_symlink() and target.resolve() == certs.resolve():
        return
    if target.exists() and not target.is_symlink():
        if (target / "tls.crt").exists() and (target / "tls.key").exists():
            return  # someone provided real certs there; use them
        raise ClusterError(f"{target} exists and has no tls.crt/tls.key")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.symlink_to(certs)
    except OSError as exc:
        raise ClusterError(
            f"Kueue {read_versions()['KUEUE_VERSION']} reads its metrics cert from {target} "
            f"(hard-coded when internal cert management is off) and it could not be created: "
            f"{exc}. Create it as root: ln -s {certs} {target}"
        ) from exc
    progress(f"  {target} -> {certs}")


def _start_kueue(progress: Progress) -> None:
    if kueue_pid() is not None:
        return
    bins = binary_paths()
    config = _write_kueue_config()
    _ensure_kueue_certs(progress)
    PATHS.logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["KUBECONFIG"] = str(PATHS.kubeconfig)
    proc = spawn_daemon([str(bins["kueue"]), f"--config={config}", "--zap-log-level=info"],
                        PATHS.kueue_log, cwd=PATHS.kueue_dir, env=env)
    PATHS.kueue_pidfile.write_text(f"{proc.pid}\n")
    progress(f"  kueue manager started (pid {proc.pid}), log {PATHS.kueue_log}")


def _stop_kueue(progress: Progress) -> None:
    pid = kueue_pid()
    if pid is None:
        PATHS.kueue_pidfile.unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ClusterError):
        wait_until("kueue to exit", lambda: not pid_alive(pid), 20)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        wait_until("kueue to be killed", lambda: not pid_alive(pid), 10)
    # reap it if it was our child (same Python process started it)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    PATHS.kueue_pidfile.unlink(missing_ok=True)
    progress(f"  kueue manager (pid {pid}) stopped")


def _apply_kueue_crds(progress: Progress) -> None:
    crds = kueue_crd_dir()
    have = set(kubectl("get", "crd", "-o", "name", check=False).stdout.split())
    # kueue.x-k8s.io_workloads.yaml -> customresourcedefinition.../workloads.kueue.x-k8s.io
    want = {"customresourcedefinition.apiextensions.k8s.io/"
            + ".".join(reversed(f.stem.split("_", 1))) for f in crds.glob("*.yaml")}
    if want and want <= have:
        return  # a repair: they live in etcd (a version change recreates the cluster)
    progress(f"  applying Kueue CRDs from {crds}")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl("wait", "--for=condition=Established", "--timeout=120s", "-f", str(crds))


def _remove_kueue_metrics_cert_link() -> None:
    """Undo the /etc/kueue/metrics/certs symlink made by up (only if it is ours)."""
    link = KUEUE_METRICS_CERT_PATH
    certs = PATHS.kueue_dir / "certs"
    if link.is_symlink() and Path(os.readlink(link)) == certs:
        link.unlink()
        for parent in (link.parent, link.parent.parent):  # /etc/kueue/metrics, /etc/kueue
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty


def running_kueue_version() -> str | None:
    """gitVersion the running Kueue manager logged at startup."""
    version = None
    try:
        with open(PATHS.kueue_log, errors="replace") as fh:
            for line in fh:
                if '"msg":"Initializing"' in line:
                    with contextlib.suppress(ValueError):
                        version = json.loads(line).get("gitVersion", version)
    except OSError:
        return None
    return version
