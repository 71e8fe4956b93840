"""`make helm-check`: the Helm chart linted, rendered, validated by the live apiserver,
installed on the local cluster's real node, tested, upgraded and rolled back.

    python -m kestrel_tools.helmcheck [--keep] [--namespace kestrel-helm] [--release kestrel]

Steps, each on the real local cluster (kestrel_tools.cluster, brought up if it is not):

1. `helm lint` with the default values and with values-local.yaml;
2. `helm template` of both (--kube-version of the local apiserver);
3. a server-side dry run: `helm install --dry-run=server`, and every rendered object
   sent to the apiserver with dryRun=All (`kubectl apply --dry-run=server`), so the
   real API validates each one, Kueue's CRDs and RBAC's escalation checks included;
4. `helm install --wait` with values-local.yaml: every pod Ready on kestrel-cpu-0,
   from the Kestrel image imported into its containerd; Postgres, NATS JetStream and
   Redis are a devstack of this check's own (.run/helm/devstack), given to the chart
   as an existing Secret, as a production install is given its stores;
5. `helm test`: kestrel_tools.smoke in a pod (every service's gRPC health, one job
   submitted and metered);
6. `helm upgrade --set logLevel=DEBUG`: every pod replaced, the new ones Ready with
   the new value;
7. `helm rollback` to revision 1: every pod replaced again, back to INFO.

Then it uninstalls (unless --keep) and removes what the smoke tenant left in the
cluster. The last line:

    helm: lint=ok dry_run=ok pods_ready=5/5 test=ok upgrade=ok rollback=ok install_s=17.5

install_s runs from `helm install` until every pod is Ready.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kestrel_tools import cluster as kc
from kestrel_tools.devstack import Stack, open_stack

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "kestrel"
LOCAL_VALUES = CHART / "values-local.yaml"
STACK_DIR = REPO / ".run" / "helm" / "devstack"
STORES_SECRET = "kestrel-stores"
# What the chart's pods are given from the stores Secret (values.yaml, `stores`).
STORE_KEYS = ("KESTREL_POSTGRES_OWNER_DSN", "KESTREL_METER_POSTGRES_DSN",
              "KESTREL_ADMISSION_POSTGRES_DSN", "KESTREL_GATEWAY_POSTGRES_DSN",
              "KESTREL_PLACER_POSTGRES_DSN", "KESTREL_METER_NATS_URL",
              "KESTREL_ADMISSION_NATS_URL", "KESTREL_GATEWAY_NATS_URL",
              "KESTREL_PLACER_NATS_URL", "KESTREL_AUTOSCALER_NATS_URL", "KESTREL_REDIS_URL")
LOCAL_RUNWAY_CHECK = "kestrel-runway-helm"  # values-local.yaml: admission.runwayCheck
TIMEOUT = "300s"
Progress = Callable[[str], None]


@dataclass
class Result:
    lint: bool = False
    dry_run: bool = False
    ready: int = 0
    total: int = 0
    test: bool = False
    upgrade: bool = False
    rollback: bool = False
    install_s: float = 0.0
    steps: list[tuple[str, bool, float, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.lint and self.dry_run and self.total > 0 and self.ready == self.total
                and self.test and self.upgrade and self.rollback)

    def line(self) -> str:
        def word(ok: bool) -> str:
            return "ok" if ok else "fail"

        return (f"helm: lint={word(self.lint)} dry_run={word(self.dry_run)} "
                f"pods_ready={self.ready}/{self.total} test={word(self.test)} "
                f"upgrade={word(self.upgrade)} rollback={word(self.rollback)} "
                f"install_s={self.install_s:.1f}")


class StepFailed(RuntimeError):
    pass


def helm_binary(progress: Progress = print) -> Path:
    """The pinned helm (cluster/versions.env HELM_VERSION), built and cached on demand."""
    path = kc.BIN_DIR / f"helm-{kc.read_versions()['HELM_VERSION']}"
    if not path.exists():
        progress(f"building {path.name} from the Go module registry (cached afterwards)")
        kc.build(progress, ["helm"])
    return path


@dataclass
class Helm:
    binary: Path
    namespace: str
    release: str

    def __call__(self, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), "--kubeconfig", str(kc.PATHS.kubeconfig), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              check=False)


def stores_secret(stack: Stack, namespace: str) -> dict[str, Any]:
    env = stack.env()
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": STORES_SECRET, "namespace": namespace},
            "stringData": {k: env[k] for k in STORE_KEYS}}


def release_pods(namespace: str, release: str) -> list[dict[str, Any]]:
    """The release's service pods that are not on their way out (the test pod aside)."""
    proc = kc.kubectl("get", "pods", "-n", namespace, "-o", "json", "-l",
                      f"app.kubernetes.io/instance={release},"
                      "app.kubernetes.io/component!=smoke")
    return [p for p in json.loads(proc.stdout)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def wanted_replicas(namespace: str, release: str) -> int:
    proc = kc.kubectl("get", "deployments", "-n", namespace, "-o", "json", "-l",
                      f"app.kubernetes.io/instance={release}")
    return sum(int(d["spec"].get("replicas", 1)) for d in json.loads(proc.stdout)["items"])


def env_of(pod: dict[str, Any], name: str) -> str:
    for c in pod["spec"]["containers"]:
        for e in c.get("env") or []:
            if e["name"] == name:
                return str(e.get("value", ""))
    return ""


def settled(namespace: str, release: str, log_level: str, timeout_s: float = 120
            ) -> list[dict[str, Any]]:
    """Wait until exactly the wanted number of pods run, all Ready, all at `log_level`
    (helm --wait returns once the Deployments are available; a replaced pod may still
    be terminating)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = release_pods(namespace, release)
        want = wanted_replicas(namespace, release)
        if (len(pods) == want and all(is_ready(p) for p in pods)
                and all(env_of(p, "KESTREL_LOG_LEVEL") == log_level for p in pods)):
            return pods
        if time.monotonic() >= deadline:
            return pods
        time.sleep(1)


def run(namespace: str, release: str, keep: bool, progress: Progress = print) -> Result:
    res = Result()

    def step(name: str, fn: Callable[[], tuple[bool, str]]) -> bool:
        t0 = time.monotonic()
        progress(f"[helm-check] {name} ...")
        try:
            ok, detail = fn()
        except (StepFailed, subprocess.SubprocessError, kc.ClusterError) as exc:
            ok, detail = False, str(exc)
        dt = time.monotonic() - t0
        res.steps.append((name, ok, dt, detail.strip().splitlines()[-1] if detail.strip()
                          else ""))
        progress(f"[helm-check] {name}: {'ok' if ok else 'FAILED'} in {dt:.1f}s")
        if not ok:
            progress(detail[-4000:])
        return ok

    kc.up(progress)
    helm = Helm(helm_binary(progress), namespace, release)
    image = kc.kestrel_image()
    repo, _, tag = image.rpartition(":")
    kube_version = kc.read_versions()["KUBE_VERSION"]
    stack = open_stack(STACK_DIR)
    for line in stack.up().values():
        progress(f"  {line}")
    required = ["--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                "--set", f"stores.existingSecret={STORES_SECRET}"]
    local = ["-f", str(LOCAL_VALUES), *required,
             "--set", f"kubernetes.apiServerPort={kc.APISERVER_PORT}"]
    ns = ["--namespace", namespace]
    rendered: dict[str, str] = {}

    def lint() -> tuple[bool, str]:
        a = helm("lint", str(CHART), *required)
        b = helm("lint", str(CHART), *local)
        return a.returncode == 0 and b.returncode == 0, a.stdout + b.stdout + a.stderr + b.stderr

    def template() -> tuple[bool, str]:
        out = ""
        for label, values in (("default", required), ("local", local)):
            p = helm("template", release, str(CHART), *ns, "--kube-version", kube_version,
                     *values)
            if p.returncode != 0:
                return False, p.stderr
            rendered[label] = p.stdout
            kinds = sorted({line.split(":", 1)[1].strip() for line in p.stdout.splitlines()
                            if line.startswith("kind:")})
            out += f"{label}: {p.stdout.count(chr(10) + 'kind: ')} objects ({', '.join(kinds)}); "
        return True, out

    def dry_run() -> tuple[bool, str]:
        kc.kubectl("create", "namespace", namespace, check=False)
        kc.kubectl("apply", "-f", "-", input_text=json.dumps(stores_secret(stack, namespace)))
        a = helm("install", release, str(CHART), *ns, *local, "--dry-run=server")
        if a.returncode != 0:
            return False, a.stderr
        b = kc.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                       input_text=rendered["local"], check=False)
        return b.returncode == 0, b.stdout + b.stderr

    res.lint = step("lint", lint)
    template_ok = step("template", template)
    res.dry_run = template_ok and step("server-side dry run", dry_run)
    try:
        if not res.dry_run:
            return res
        helm("uninstall", release, *ns, "--wait")  # what a killed earlier run left

        def install() -> tuple[bool, str]:
            t0 = time.monotonic()
            p = helm("install", release, str(CHART), *ns, *local, "--wait", "--timeout",
                     TIMEOUT)
            # helm's --wait settles for replicas - maxUnavailable (0 of 1 here): the
            # figure is until every pod is Ready
            pods = settled(namespace, release, "INFO")
            res.install_s = time.monotonic() - t0
            res.ready, res.total = sum(is_ready(p) for p in pods), wanted_replicas(
                namespace, release)
            nodes = sorted({p["spec"].get("nodeName", "") for p in pods})
            return p.returncode == 0 and res.ready == res.total, (
                p.stderr + f"{res.ready}/{res.total} pods Ready on {', '.join(nodes)}")

        if not step("install", install):
            return res

        def test() -> tuple[bool, str]:
            p = helm("test", release, *ns, "--logs", "--timeout", TIMEOUT)
            progress(p.stdout + p.stderr)
            return p.returncode == 0, p.stdout + p.stderr

        res.test = step("helm test", test)

        def roll(what: str, args: Sequence[str], level: str) -> Callable[[], tuple[bool, str]]:
            def go() -> tuple[bool, str]:
                before = {p["metadata"]["uid"] for p in release_pods(namespace, release)}
                p = helm(*args)
                pods = settled(namespace, release, level)
                after = {q["metadata"]["uid"] for q in pods}
                want = wanted_replicas(namespace, release)
                ok = (p.returncode == 0 and len(pods) == want
                      and all(is_ready(q) for q in pods) and not before & after
                      and all(env_of(q, "KESTREL_LOG_LEVEL") == level for q in pods))
                return ok, (p.stderr + f"{what}: {len(pods)}/{want} pods replaced and "
                            f"Ready at logLevel {level}")
            return go

        res.upgrade = step("upgrade", roll("upgrade", [
            "upgrade", release, str(CHART), *ns, *local, "--set", "logLevel=DEBUG", "--wait",
            "--timeout", TIMEOUT], "DEBUG"))
        res.rollback = step("rollback", roll("rollback", [
            "rollback", release, "1", *ns, "--wait", "--timeout", TIMEOUT], "INFO"))
        history = helm("history", release, *ns, "-o", "json")
        if history.returncode == 0:
            for h in json.loads(history.stdout):
                progress(f"  revision {h['revision']}: {h['status']} {h['description']}")
        return res
    finally:
        if not keep:
            uninstall(namespace, release, progress)


def uninstall(namespace: str, release: str, progress: Progress = print) -> None:
    """Remove the release, its namespace, what its smoke tenant made through the placer
    (a tenant's namespace and queue are not part of the release), and its devstack
    with its data."""
    progress("[helm-check] uninstalling")
    helm = Helm(helm_binary(progress), namespace, release)
    helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", TIMEOUT)
    # one call: the namespace controller empties both namespaces side by side; waiting
    # lets the next check create its namespace again at once
    kc.kubectl("delete", "namespace", namespace, "kestrel-smoke", "--ignore-not-found",
               "--timeout=180s", check=False, timeout=200)
    kc.kubectl("delete", "clusterqueue", "kestrel-smoke", "--ignore-not-found", check=False)
    kc.kubectl("delete", "admissioncheck", LOCAL_RUNWAY_CHECK, "--ignore-not-found",
               check=False)
    open_stack(STACK_DIR).destroy()  # the next check starts from empty stores


def summary(res: Result) -> str:
    rows = [f"{'step':<20} {'ok':<5} {'s':>6}  detail"]
    for name, ok, dt, detail in res.steps:
        rows.append(f"{name:<20} {'ok' if ok else 'FAIL':<5} {dt:>6.1f}  {detail[:90]}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.helmcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespace", default="kestrel-helm")
    ap.add_argument("--release", default="kestrel")
    ap.add_argument("--keep", action="store_true",
                    help="leave the release installed (and its devstack running)")
    args = ap.parse_args(argv)
    res = run(args.namespace, args.release, args.keep,
              progress=lambda s: print(s, flush=True))
    print(summary(res))
    print(res.line())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
