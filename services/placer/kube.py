"""The Kubernetes adapter: synchronous client calls (run them in a thread) and
watch threads that feed raw JSON dicts to the asyncio side.

Objects travel as the apiserver's JSON (camelCase, RFC 3339 times), the form
the pure lifecycle functions read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kestrel import kubeclient, kubewatch
from kestrel.kubeclient import new_api_client as new_api_client
from kestrel.workloads import ENDPOINT_LABEL
from services.placer.lifecycle import JOB_ID_LABEL

log = logging.getLogger("kestrel.placer.kube")

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS, JOBS, PODS = "workload", "job", "pod"
KINDS = (WORKLOADS, JOBS, PODS)
# The kinds watched after their first list. Jobs are listed once, when the placer starts
# (what a placer that restarted finds), and not watched: the placer makes each Job itself
# and keeps what it created (Placer.place), nothing it reads of a Job changes after that
# (labels, flavor annotations, creation instant, activeDeadlineSeconds), and Kueue's
# Workload, owned by the Job, is deleted with it. A Job watch sent the placer about six
# events per job (Kueue's unsuspend, the job controller's status writes, ...), each
# encoded and written by the apiserver and decoded here, none of them read.
WATCHED = (WORKLOADS, PODS)

# (kind, [(event type ADDED|MODIFIED|DELETED|RELIST, object or list of objects), ...]):
# the events of one read of a watch together, so the event loop wakes once for them.
Change = tuple[str, Any]
Emit = Callable[[str, list[Change]], None]

# How long a busy watch lets events gather before it reads them (kestrel.kubewatch):
# the placer's events carry Kubernetes' own timestamps, so a later read moves no figure.
# Each read is a thread wake-up and an observe pass that publishes what it derived;
# 0.1 s against 0.05 s: the placer 6.8-8.0 against 9.1-9.2 CPU-ms per job in bench-jobs'
# plane (with admission's and the meter's longer gathers, README, Benchmarks).
WATCH_LINGER_S = 0.1


def _strip_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj]
    return obj


# The pods the placer watches: not Pending ones. What it reads of a pod is when its
# first container started (STARTED) and whether it runs (a GPU stand-in): a pod has
# neither before it leaves Pending (then a running container makes it Running, and
# a pod that failed or succeeded keeps its containers' start times). A Pending pod's
# events were about a third of the pod events the placer decoded (created, bound,
# ...); the apiserver filters them out before it encodes them, and sends a pod that
# leaves Pending as ADDED.
PODS_SEEN = "status.phase!=Pending"


class Kube:
    """Blocking calls against one apiserver; every method is safe to run in a thread."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.api = new_api_client(kubeconfig)
        self.batch = k8s.BatchV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)

    @staticmethod
    def _raw(resp: Any) -> dict[str, Any]:
        data: dict[str, Any] = kubewatch.loads(resp.data)
        return data

    def _core(self, method: str, path: str, body: Any = None,
              content_type: str = "application/json", **query: Any) -> Any:
        """One call on the core group by its path (kestrel.kubeclient.call): the typed
        CoreV1Api is not used, importing it (its module and models) cost 0.9 s of CPU,
        about a third of a placer's start-up and so of its recovery from a crash."""
        return kubeclient.call(self.api, method, path, body, content_type, **query)

    # --- tenants -------------------------------------------------------------

    def apply_namespace(self, body: Mapping[str, Any]) -> None:
        try:
            kubeclient.send(self.api, "POST", "/api/v1/namespaces", _strip_none(body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            kubeclient.send(self.api, "PATCH", f"/api/v1/namespaces/{body['metadata']['name']}",
                            {"metadata": {"labels": body["metadata"]["labels"]}},
                            "application/merge-patch+json")

    def apply_cluster(self, plural: str, body: Mapping[str, Any]) -> None:
        """Create a cluster-scoped Kueue object, or merge-patch its spec and labels."""
        try:
            self.custom.create_cluster_custom_object(GROUP, VERSION, plural, _strip_none(body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.custom.patch_cluster_custom_object(
                GROUP, VERSION, plural, body["metadata"]["name"],
                {"metadata": {"labels": body["metadata"].get("labels", {})},
                 "spec": body["spec"]})

    def create_cluster_if_missing(self, plural: str, body: Mapping[str, Any]) -> bool:
        try:
            self.custom.create_cluster_custom_object(GROUP, VERSION, plural, _strip_none(body))
            return True
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False

    def apply_local_queue(self, body: Mapping[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues",
                                                        _strip_none(body))
        except ApiException as exc:
            if exc.status != 409:
                raise  # spec.clusterQueue is immutable: an existing queue stays

    # --- jobs ----------------------------------------------------------------

    def create_job(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """(the Job as stored, whether this call created it); AlreadyExists reads it."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            # By its path (kestrel.kubeclient.send): the typed create_namespaced_job
            # validates the dict into a V1Job model and serialises that back, 230-410 us
            # of CPU more per Job (929-1223 against 696-808 us, 200 creates each against
            # the real apiserver), one Job per placement.
            return kubewatch.loads(kubeclient.send(
                self.api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                _strip_none(body))), True
        except ApiException as exc:
            if exc.status != 409:
                raise
        found = self.read_job(ns, name)
        if found is None:  # deleted between the two calls: the caller retries
            raise ApiException(status=409, reason=f"job {ns}/{name} vanished")
        return found, False

    def read_job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self._raw(self.batch.read_namespaced_job(name, ns, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_job(self, ns: str, name: str) -> bool:
        try:
            self.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def touch_job(self, ns: str, name: str, stamp: str) -> bool:
        """Annotate the Job (kestrel.dev/requeued-at): an update Kueue reconciles at once."""
        try:
            self.batch.patch_namespaced_job(
                name, ns, {"metadata": {"annotations": {"kestrel.dev/requeued-at": stamp}}})
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def workload_of(self, ns: str, job_name: str) -> dict[str, Any] | None:
        listing = self._raw(self.custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, "workloads", _preload_content=False))
        items: list[dict[str, Any]] = listing.get("items") or []
        for wl in items:
            for ref in wl["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("name") == job_name:
                    return wl
        return None

    def list_replica_jobs(self) -> list[dict[str, Any]]:
        """Every endpoint replica's Job, in every namespace (the orphan reconcile)."""
        resp = self.batch.list_job_for_all_namespaces(label_selector=ENDPOINT_LABEL,
                                                      _preload_content=False)
        items: list[dict[str, Any]] = self._raw(resp).get("items") or []
        return items

    # --- what operators read ------------------------------------------------

    def list_nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._raw(self._core("GET", "/api/v1/nodes"))["items"]
        return items

    def list_cluster_queues(self, label_selector: str) -> list[dict[str, Any]]:
        resp = self.custom.list_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", label_selector=label_selector,
            _preload_content=False)
        items: list[dict[str, Any]] = self._raw(resp)["items"]
        return items

    # --- listing and watching ------------------------------------------------

    def lister(self, kind: str) -> Callable[..., Any]:
        if kind == WORKLOADS:
            def workloads(**kw: Any) -> Any:
                return self.custom.list_cluster_custom_object(GROUP, VERSION, "workloads", **kw)
            return workloads
        if kind == JOBS:
            def jobs(**kw: Any) -> Any:
                return self.batch.list_job_for_all_namespaces(label_selector=JOB_ID_LABEL, **kw)
            return jobs

        def pods(**kw: Any) -> Any:
            return self._core("GET", "/api/v1/pods", label_selector=JOB_ID_LABEL,
                              field_selector=PODS_SEEN, **kw)
        return pods

    def list_raw(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        data = self._raw(self.lister(kind)(_preload_content=False))
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_raw(self, kind: str, resource_version: str,
                  timeout_s: int) -> Iterator[list[dict[str, Any]]]:
        """The watch's events, in the lists one read of it brought."""
        yield from kubewatch.bursts(self.lister(kind), resource_version=resource_version,
                                    timeout_s=timeout_s, linger_s=WATCH_LINGER_S)


class Watcher(threading.Thread):
    """List, then watch from the list's resourceVersion; relist on 410 Gone (or any
    broken watch that cannot resume). Every list is emitted whole as RELIST.
    With `watch=False`, the thread ends after its first list that succeeds."""

    def __init__(self, connect: Callable[[], Kube], kind: str, emit: Emit,
                 stop: threading.Event, timeout_s: int = 50,
                 on_relist: Callable[[str], None] = lambda k: None,
                 watch: bool = True) -> None:
        super().__init__(name=f"{'watch' if watch else 'list'}-{kind}", daemon=True)
        self.connect = connect  # a client of its own per thread
        self.kind = kind
        self.emit = emit
        self.stop = stop
        self.timeout_s = timeout_s
        self.on_relist = on_relist
        self.watch = watch

    def run(self) -> None:
        kube: Kube | None = None
        delay = 0.2
        while not self.stop.is_set():
            try:
                if kube is None:
                    kube = self.connect()
                items, rv = kube.list_raw(self.kind)
                self.emit(self.kind, [("RELIST", items)])
                self.on_relist(self.kind)
                if not self.watch:
                    return
                delay = 0.2
                while not self.stop.is_set():
                    for burst in kube.watch_raw(self.kind, rv, self.timeout_s):
                        changed, rv = kubewatch.changes(burst, rv)
                        if changed:
                            self.emit(self.kind, changed)
                        if self.stop.is_set():
                            return
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch %s: resourceVersion gone (410); relisting", self.kind)
                    continue
                log.warning("watch %s: %s; relisting in %.1fs", self.kind, exc, delay)
            except Exception as exc:
                log.warning("watch %s failed: %s; relisting in %.1fs", self.kind, exc, delay)
                kube = None
            time.sleep(delay)
            # One apiserver, one watch per kind: retrying each second costs nothing, and
            # a longer cap left the placer blind for up to 5 s after the apiserver was
            # back (bench/chaos.py's kube-apiserver fault).
            delay = min(delay * 2, 1.0)
