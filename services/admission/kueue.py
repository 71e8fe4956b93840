"""Transport: the runway AdmissionCheck controller against the real Kueue.

A level-triggered loop: every half second (sooner when a runway changes) it
lists Workloads, asks the pure `runway_check` what each check entry and each
`spec.active` should be, and patches only what differs. It also keeps the
AdmissionCheck's Active condition True, or Kueue would deactivate the
ClusterQueues that name it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from kestrel.cluster import KUEUE_API_VERSION, KUEUE_GROUP
from services.admission.core import Admission
from services.admission.runway_check import (
    Money,
    Verdict,
    WorkloadView,
    changes,
    to_deactivate,
)

log = logging.getLogger("kestrel.admission.runway_check")
CONTROLLER_NAME = "kestrel.dev/runway"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def view(obj: dict[str, Any], check: str) -> WorkloadView | None:
    """The parts of a Workload the check decides on; None when our check is not on it."""
    status = obj.get("status") or {}
    entry = next((c for c in status.get("admissionChecks") or [] if c.get("name") == check),
                 None)
    if entry is None:
        return None
    meta = obj.get("metadata") or {}
    owner = next((o.get("name", "") for o in meta.get("ownerReferences") or []
                  if o.get("kind") == "Job"), "")
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return WorkloadView(meta.get("namespace", ""), meta.get("name", ""), owner,
                        entry.get("state", ""), entry.get("message", ""),
                        conds.get("Admitted") == "True",
                        (obj.get("spec") or {}).get("active", True) is not False,
                        conds.get("Finished") == "True")


class Kueue:
    """Blocking calls; run them in threads."""

    def __init__(self, kubeconfig: str) -> None:
        new_client = cast(Callable[..., Any], k8s_config.new_client_from_config)
        self.custom: Any = k8s.CustomObjectsApi(new_client(config_file=kubeconfig))

    def workloads(self) -> list[dict[str, Any]]:
        resp = self.custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_API_VERSION,
                                                      "workloads")
        return list(resp.get("items", []))

    def set_check(self, w: WorkloadView, check: str, v: Verdict) -> None:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, w.namespace, "workloads", w.name)
        entries = list((obj.get("status") or {}).get("admissionChecks") or [])
        for i, e in enumerate(entries):
            if e.get("name") == check:
                moved = e.get("state") != v.state.value
                entries[i] = {**e, "state": v.state.value, "message": v.message[:1024],
                              "lastTransitionTime": _now() if moved else e.get(
                                  "lastTransitionTime", _now())}
        self.custom.patch_namespaced_custom_object_status(
            KUEUE_GROUP, KUEUE_API_VERSION, w.namespace, "workloads", w.name,
            {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
             "status": {"admissionChecks": entries}})

    def deactivate(self, w: WorkloadView) -> None:
        self.custom.patch_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, w.namespace, "workloads", w.name,
            {"spec": {"active": False}})

    def keep_active(self, check: str) -> bool:
        try:
            self.custom.patch_cluster_custom_object_status(
                KUEUE_GROUP, KUEUE_API_VERSION, "admissionchecks", check,
                {"status": {"conditions": [{
                    "type": "Active", "status": "True", "reason": "Active",
                    "message": "the Kestrel runway controller is running",
                    "lastTransitionTime": _now()}]}})
            return True
        except ApiException as exc:
            if exc.status == 404:  # the placer creates it; not there yet
                return False
            raise


class RunwayCheckController:
    def __init__(self, admission: Admission, kubeconfig: str, check: str,
                 period_s: float = 0.5) -> None:
        self.admission = admission
        self.kubeconfig = kubeconfig
        self.check = check
        self.period_s = period_s
        self.wake = asyncio.Event()
        self.deactivated: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        kueue = await asyncio.to_thread(Kueue, self.kubeconfig)
        active_at = 0.0
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                if loop.time() - active_at > 10 and await asyncio.to_thread(
                        kueue.keep_active, self.check):
                    active_at = loop.time()
                await self.reconcile(kueue)
            except Exception as exc:
                log.warning("runway check reconcile failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.period_s)
            self.wake.clear()

    async def reconcile(self, kueue: Kueue) -> None:
        views = [v for o in await asyncio.to_thread(kueue.workloads)
                 if (v := view(o, self.check)) is not None]
        if not views:
            return
        jobs = await self.admission.store.get_many(sorted({v.job_id for v in views}))
        money: dict[str, Money] = {}
        for tenant in sorted({j.tenant for j in jobs.values()}):
            m = await self.admission.money(tenant)
            if m is not None:
                money[tenant] = m
        for w, verdict in changes(views, jobs, money):
            log.info("check %s/%s -> %s: %s", w.namespace, w.name, verdict.state.value,
                     verdict.message)
            with contextlib.suppress(ApiException):  # a conflict: the next pass retries
                await asyncio.to_thread(kueue.set_check, w, self.check, verdict)
        for w in to_deactivate(views, jobs, money):
            key = f"{w.namespace}/{w.name}"
            log.warning("deactivating %s: its tenant's budget is spent", key)
            await asyncio.to_thread(kueue.deactivate, w)
            self.deactivated.add(key)
