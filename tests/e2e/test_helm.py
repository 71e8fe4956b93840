"""End-to-end: the Helm chart (deploy/helm/kestrel) on the local cluster's real node.

kestrel_tools.helmcheck lints and renders the chart, has the live apiserver validate every
object (server-side dry run), installs it on kestrel-cpu-0 with values-local.yaml,
runs `helm test` (every service healthy, one job submitted and metered), upgrades a
value and rolls back. The release is then inspected as installed: least privilege
(each ServiceAccount may do what its service needs and no more) and the pods'
security settings. Needs the pinned helm (cluster/build.sh helm; cached)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from kestrel_tools import cluster as kc
from kestrel_tools import helmcheck

pytestmark = pytest.mark.e2e

NAMESPACE = "kestrel-helm-e2e"
RELEASE = "kestrel"


@pytest.fixture(scope="module")
def installed(cluster_up: kc.ClusterInfo) -> Iterator[helmcheck.Result]:
    lines: list[str] = []
    try:
        yield helmcheck.run(NAMESPACE, RELEASE, keep=True, progress=lines.append)
    finally:
        helmcheck.uninstall(NAMESPACE, RELEASE, progress=lines.append)
        print("\n".join(lines[-80:]))


def can_i(service: str, verb: str, resource: str, namespace: str = "") -> bool:
    sa = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-{service}"
    args = ["auth", "can-i", verb, resource, "--as", sa]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = kc.kubectl(*args, check=False)
    return proc.stdout.strip() == "yes"


def pods() -> list[dict[str, Any]]:
    out = kc.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", "-l",
                     f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component!=smoke")
    return list(json.loads(out.stdout)["items"])


def test_the_chart_installs_passes_its_test_upgrades_and_rolls_back(
        installed: helmcheck.Result) -> None:
    print(helmcheck.summary(installed))
    print(installed.line())
    assert installed.lint
    assert installed.dry_run
    assert (installed.ready, installed.total) == (5, 5)
    assert installed.test, "helm test (kestrel_tools.smoke) failed"
    assert installed.upgrade
    assert installed.rollback
    assert installed.ok


def test_every_pod_runs_on_the_real_node_as_a_non_root_user(
        installed: helmcheck.Result) -> None:
    found = pods()
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in found} == {
        "gateway", "admission", "meter", "placer", "autoscaler"}
    for p in found:
        assert p["spec"]["nodeName"] == kc.NODE_NAME
        assert p["spec"]["securityContext"]["runAsNonRoot"] is True
        for c in p["spec"]["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["readinessProbe"]["grpc"]["port"] == c["ports"][0]["containerPort"]
        # the tables' owner is given to the migration init container only
        main_env = {e["name"] for c in p["spec"]["containers"] for e in c.get("env") or []}
        assert "KESTREL_POSTGRES_OWNER_DSN" not in main_env


def test_only_the_services_that_talk_to_kubernetes_get_a_token(
        installed: helmcheck.Result) -> None:
    mounted = {p["metadata"]["labels"]["app.kubernetes.io/component"]:
               p["spec"].get("automountServiceAccountToken", True) for p in pods()}
    assert mounted == {"gateway": False, "meter": False, "admission": True, "placer": True,
                       "autoscaler": True}


@pytest.mark.parametrize(("service", "verb", "resource", "allowed"), [
    ("placer", "create", "namespaces", True),
    ("placer", "create", "jobs.batch", True),
    ("placer", "create", "clusterqueues.kueue.x-k8s.io", True),
    ("placer", "patch", "workloads.kueue.x-k8s.io/status", False),
    ("placer", "delete", "namespaces", False),
    ("placer", "get", "secrets", False),
    ("admission", "patch", "workloads.kueue.x-k8s.io/status", True),
    ("admission", "patch", "workloads.kueue.x-k8s.io", True),
    ("admission", "create", "jobs.batch", False),
    ("admission", "create", "namespaces", False),
    ("admission", "delete", "workloads.kueue.x-k8s.io", False),
    ("autoscaler", "create", "jobs.batch", False),
    ("autoscaler", "list", "pods", False),
    ("gateway", "list", "pods", False),
    ("meter", "get", "secrets", False),
])
def test_each_service_account_may_do_what_its_service_needs_and_no_more(
        installed: helmcheck.Result, service: str, verb: str, resource: str,
        allowed: bool) -> None:
    assert can_i(service, verb, resource) is allowed


@pytest.mark.parametrize(("service", "lease"), [("autoscaler", "kestrel-autoscaler"),
                                              ("admission", "kestrel-admission")])
def test_a_leader_elected_service_may_hold_only_its_own_lease_in_its_namespace(
        installed: helmcheck.Result, service: str, lease: str) -> None:
    assert can_i(service, "update", f"leases.coordination.k8s.io/{lease}", NAMESPACE)
    assert not can_i(service, "update", "leases.coordination.k8s.io/other", NAMESPACE)
    assert not can_i(service, "create", "leases.coordination.k8s.io", "kube-system")


def test_the_chart_refuses_to_render_without_an_image_tag_or_stores(
        installed: helmcheck.Result) -> None:
    helm = helmcheck.helm_binary()
    for args, message in ((["--set", "stores.existingSecret=s"], "image.tag is required"),
                          (["--set", "image.tag=t"], "stores: name an existing Secret")):
        proc = subprocess.run([str(helm), "template", "x", str(helmcheck.CHART),
                               "--kube-version", "1.34.0", *args],
                              capture_output=True, text=True, check=False)
        assert proc.returncode != 0
        assert message in proc.stderr


def _template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helmcheck.helm_binary()), "template", "x", str(helmcheck.CHART),
                           "--kube-version", "1.34.0", "--set", "image.tag=t",
                           "--set", "stores.existingSecret=s", *args],
                          capture_output=True, text=True, check=False)


def test_a_typo_in_the_values_is_refused_with_its_key_named(
        installed: helmcheck.Result) -> None:
    proc = _template("--set", "gatway.replicas=3")
    assert proc.returncode != 0
    assert "additional properties 'gatway' not allowed" in proc.stderr
    proc = _template("--set", "meter.replicas=two")
    assert proc.returncode != 0 and "replicas" in proc.stderr


def test_the_service_monitor_renders_only_where_the_prometheus_operator_is(
        installed: helmcheck.Result) -> None:
    assert "kind: ServiceMonitor" not in _template().stdout  # off by default
    proc = _template("--set", "serviceMonitor.enabled=true")
    assert proc.returncode != 0 and "Prometheus Operator's CRDs" in proc.stderr
    proc = _template("--set", "serviceMonitor.enabled=true", "--set",
                     "serviceMonitor.labels.release=prom", "--api-versions",
                     "monitoring.coreos.com/v1/ServiceMonitor")
    assert proc.returncode == 0, proc.stderr
    monitor = next(d for d in proc.stdout.split("\n---") if "kind: ServiceMonitor" in d)
    assert "release: prom" in monitor and "port: metrics" in monitor
    # It selects the five Services that carry a metrics port, not the headless ones.
    services = [d for d in proc.stdout.split("\n---") if "kind: Service\n" in d]
    assert sum('kestrel.dev/metrics: "true"' in d for d in services) == 5


def test_the_install_notes_say_how_to_reach_the_gateway_and_act_as_operator(
        installed: helmcheck.Result) -> None:
    notes = subprocess.run([str(helmcheck.helm_binary()), "--kubeconfig",
                            str(kc.PATHS.kubeconfig), "get", "notes", RELEASE, "-n",
                            NAMESPACE], capture_output=True, text=True, check=True).stdout
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    assert "the pods share their node's network" in notes  # values-local: hostNetwork
    assert f"get secret {RELEASE}-operator-token" in notes
