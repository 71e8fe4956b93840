"""Transport: the runway AdmissionCheck controller against the real Kueue.

A watch keeps a cache of the Workloads that carry our check (list, then watch
from its resourceVersion; a 410 Gone relists). Changed Workloads are decided
within a few tens of milliseconds (events are batched); a tenant's are decided
again when its runway or a held job of it changes (`wake`), and all every few
seconds. Tenants' money is cached between those refreshes, and only Workloads
that are not `settled` are looked up and decided, so a busy cluster costs a
job-row read per new Workload, not one per Workload per event. The pure
`runway_check` says what each check entry and `spec.active` should be; only
differences are patched. It also keeps the AdmissionCheck's Active condition
True, or Kueue would deactivate the ClusterQueues that name it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kestrel import kubeclient, kubewatch
from kestrel.kubeclient import new_api_client
from kestrel.kubework import KUEUE_API_VERSION, KUEUE_GROUP
from kestrel.v1 import common_pb2
from kestrel.workloads import EVICTION_REASON_ANNOTATION, TENANT_LABEL, budget_spent_reason
from services.admission.core import Admission
from services.admission.runway_check import (
    Money,
    Verdict,
    WorkloadView,
    changes,
    decides_alike,
    money_of,
    to_deactivate,
    unsettled,
)

log = logging.getLogger("kestrel.admission.runway_check")

# How long a busy Workload watch lets events gather before it reads them
# (kestrel.kubewatch.bursts): a verdict waits at most this much longer, and only while
# Workloads come faster than this. 0.1 s, as the placer's watches (services.placer.kube).
WATCH_LINGER_S = 0.1
PATCH_CONCURRENCY = 4  # check verdicts written at once (and the client's pool size)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def view(obj: dict[str, Any], check: str) -> WorkloadView | None:
    """The parts of a Workload the check decides on; None when our check is not on it."""
    status = obj.get("status") or {}
    entries = status.get("admissionChecks") or []
    index = next((i for i, c in enumerate(entries) if c.get("name") == check), None)
    if index is None:
        return None
    entry = entries[index]
    meta = obj.get("metadata") or {}
    owner = next((o.get("name", "") for o in meta.get("ownerReferences") or []
                  if o.get("kind") == "Job"), "")
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    spec = obj.get("spec") or {}
    tenant = next((str(labels[TENANT_LABEL]) for ps in spec.get("podSets") or []
                   if TENANT_LABEL in (labels := ((ps.get("template") or {}).get("metadata")
                                                  or {}).get("labels") or {})), "")
    return WorkloadView(meta.get("namespace", ""), meta.get("name", ""), owner,
                        entry.get("state", ""), entry.get("message", ""),
                        conds.get("Admitted") == "True",
                        spec.get("active", True) is not False,
                        conds.get("Finished") == "True", index, tenant)


class Kueue:
    """Blocking calls; run them in threads."""

    def __init__(self, kubeconfig: str) -> None:
        self.custom: Any = k8s.CustomObjectsApi(new_api_client(kubeconfig, PATCH_CONCURRENCY))

    def workloads(self) -> tuple[list[dict[str, Any]], str]:
        resp = kubewatch.loads(self.custom.list_cluster_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, "workloads", _preload_content=False).data)
        return list(resp.get("items") or []), str(resp["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, stop: threading.Event,
              emit: Callable[[list[tuple[str, dict[str, Any]]]], object]) -> str:
        """Stream Workload events from resource_version until stop, the apiserver's
        timeout or an error (an ERROR event, 410 Gone above all, raises its
        ApiException); returns the last resourceVersion seen, bookmarks included, to
        watch on from. `emit` gets the (type, object) of each read's events together.

        Each event is parsed from JSON once, as a dict (kestrel.kubewatch): the client's
        typed path parsed it, wrote it back to JSON and parsed that again, a third of
        this watch's CPU for dicts that come out the same. A busy watch is read every
        WATCH_LINGER_S, not once per event (kestrel.kubewatch.bursts)."""
        rv = resource_version
        for burst in kubewatch.bursts(self.custom.list_cluster_custom_object, KUEUE_GROUP,
                                      KUEUE_API_VERSION, "workloads",
                                      resource_version=rv, timeout_s=60,
                                      linger_s=WATCH_LINGER_S):
            changed, rv = kubewatch.changes(burst, rv)
            if changed:
                emit(changed)
            if stop.is_set():
                return rv
        return rv

    def set_check(self, w: WorkloadView, check: str, v: Verdict) -> None:
        """One JSON Patch on our entry, found at the watched index; its `test` op makes
        the apiserver refuse the patch if the list moved meanwhile."""
        at = f"/status/admissionChecks/{w.check_index}"
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"{at}/name", "value": check},
            {"op": "replace", "path": f"{at}/state", "value": v.state.value},
            {"op": "add", "path": f"{at}/message", "value": v.message[:1024]}]
        if w.check_state != v.state.value:
            ops.append({"op": "add", "path": f"{at}/lastTransitionTime", "value": _now()})
        # By its path (kestrel.kubeclient.call): one per job, and the typed call's
        # validation cost 160 us of CPU more than the request itself.
        kubeclient.send(self.custom.api_client, "PATCH",
                        f"/apis/{KUEUE_GROUP}/{KUEUE_API_VERSION}/namespaces/{w.namespace}"
                        f"/workloads/{w.name}/status", ops, "application/json-patch+json")

    def deactivate(self, w: WorkloadView, reason: str) -> None:
        """spec.active=false, with the reason on the Workload in the same write (Kueue's
        Evicted condition will only say "Deactivated")."""
        self.custom.patch_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_API_VERSION, w.namespace, "workloads", w.name,
            {"metadata": {"annotations": {EVICTION_REASON_ANNOTATION: reason}},
             "spec": {"active": False}})

    def keep_active(self, check: str) -> bool:
        """Active=True on the AdmissionCheck, patched only when it is not so already: each
        write moved lastTransitionTime (a transition that did not happen) and sent Kueue
        an AdmissionCheck change to reconcile every ten seconds."""
        try:
            current = self.custom.get_cluster_custom_object_status(
                KUEUE_GROUP, KUEUE_API_VERSION, "admissionchecks", check)
            if any(c.get("type") == "Active" and c.get("status") == "True"
                   for c in (current.get("status") or {}).get("conditions") or []):
                return True
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


ACTIVE_RENEW_S = 10.0  # how often the AdmissionCheck's Active condition is renewed


def idle_wait_s(now: float, full_at: float, full_pass_s: float, active_at: float,
                retry: bool) -> float:
    """How long the controller sleeps when nothing changes: until its next full pass
    or Active renewal, or a second after a failure or while the AdmissionCheck is not
    there yet (`active_at` 0). Waking every second regardless (and once more after the
    batch sleep) was two wake-ups a second of an idle admission."""
    due = full_at + full_pass_s
    due = min(due, now + 1.0 if retry or not active_at else active_at + ACTIVE_RENEW_S)
    return max(due - now, 0.0)


class RunwayCheckController:
    def __init__(self, admission: Admission, kubeconfig: str, check: str,
                 full_pass_s: float = 5.0, batch_s: float = 0.05) -> None:
        self.admission = admission
        self.kubeconfig = kubeconfig
        self.check = check
        self.full_pass_s = full_pass_s
        self.batch_s = batch_s  # events arriving within this are decided together
        self.views: dict[str, WorkloadView] = {}
        # Per tenant: its money as its last runway said (the runway reader starts with
        # every tenant's last, and the meter publishes each change). A tenant with none
        # heard yet reads a ledger snapshot for each pass that decides it (decide()).
        self.money: dict[str, Money] = {}
        self.dirty: set[str] = set()  # Workloads to decide
        self.stale: set[str] = set()  # tenants whose Workloads to decide again
        self.changed = asyncio.Event()
        self.deactivated: set[str] = set()

    def wake(self, tenant: str, money: Money | None = None) -> None:
        """A held job of the tenant changed, or (with `money`) its runway: decide its
        Workloads again, unless the new money decides them alike (decides_alike)."""
        if money is not None:
            old = self.money.get(tenant)
            self.money[tenant] = money
            if old is not None and decides_alike(old, money):
                return
        self.stale.add(tenant)
        self.changed.set()

    def heard(self, runway: common_pb2.Runway) -> None:
        """A runway the meter published (kestrel.runway's listener): the tenant's money,
        as fresh as a ledger snapshot (the meter publishes every top-up, adjustment and
        allocation change, and every band crossed, spent included) without reading one.
        A snapshot per runway was the most of this controller's Postgres work."""
        self.wake(runway.tenant, money_of(runway))

    def _apply(self, changes: list[tuple[str, dict[str, Any]]]) -> None:
        """On the event loop: one read's watch events into the cache, in order."""
        for kind, obj in changes:
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            v = view(obj, self.check) if kind != "DELETED" else None
            if v is None:
                self.views.pop(key, None)
                continue
            self.views[key] = v
            self.dirty.add(key)
            self.changed.set()

    def _watch_forever(self, kueue: Kueue, loop: asyncio.AbstractEventLoop,
                       stop: threading.Event) -> None:
        """In a thread: list, then watch, on from where each watch ended (the apiserver
        ends one every minute); relist only on 410 Gone or a break, as client-go's
        reflector does. (A relist at every timeout was a LIST of every Workload a
        minute, 3 % of the apiserver's CPU in bench-jobs' plane phase, and then a
        decision on each of them here.)"""
        while not stop.is_set():
            try:
                items, rv = kueue.workloads()
                loop.call_soon_threadsafe(self._replace_all, items)
                while not stop.is_set():
                    rv = kueue.watch(rv, stop, lambda changes: loop.call_soon_threadsafe(
                        self._apply, changes))
            except Exception as exc:  # 410 Gone, apiserver restarts: relist
                log.info("workload watch restarts: %s", exc)
                stop.wait(0.5)

    def _replace_all(self, items: list[dict[str, Any]]) -> None:
        views = {f"{v.namespace}/{v.name}": v for o in items
                 if (v := view(o, self.check)) is not None}
        self.views = views
        self.dirty |= set(views)
        self.changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        kueue = await asyncio.to_thread(Kueue, self.kubeconfig)
        halt = threading.Event()
        watcher = threading.Thread(target=self._watch_forever, name="workload-watch",
                                   args=(kueue, asyncio.get_running_loop(), halt), daemon=True)
        watcher.start()
        loop = asyncio.get_running_loop()
        active_at = full_at = 0.0
        try:
            while not stop.is_set():
                retry = False
                try:
                    if loop.time() - active_at > ACTIVE_RENEW_S and await asyncio.to_thread(
                            kueue.keep_active, self.check):
                        active_at = loop.time()
                    if loop.time() - full_at > self.full_pass_s:  # every tenant still busy
                        full_at = loop.time()
                        busy = {v.tenant for v in self.views.values()
                                if v.tenant and not v.finished and v.active}
                        self.stale |= busy
                    await self.decide(kueue)
                except Exception as exc:
                    log.warning("runway check reconcile failed: %s", exc)
                    retry = True
                waits = [asyncio.create_task(e.wait()) for e in (self.changed, stop)]
                done, _ = await asyncio.wait(
                    waits, timeout=idle_wait_s(loop.time(), full_at, self.full_pass_s,
                                               active_at, retry),
                    return_when=asyncio.FIRST_COMPLETED)
                for t in waits:
                    t.cancel()
                if done and not stop.is_set():
                    await asyncio.sleep(self.batch_s)  # let the rest of a burst arrive
                self.changed.clear()
        finally:
            halt.set()

    async def decide(self, kueue: Kueue) -> None:
        """Decide what is not settled among the changed Workloads and every Workload of
        a woken tenant; a tenant without money (no runway heard yet) reads a snapshot,
        used for this pass only (a runway, once heard, keeps the money current)."""
        keys, self.dirty = self.dirty, set()
        tenants, self.stale = self.stale, set()
        views = [v for k in keys if (v := self.views.get(k)) is not None]
        if tenants:
            views += [v for k, v in self.views.items() if v.tenant in tenants and k not in keys]
        live = [v for v in views if v.tenant and not v.finished and v.active]
        try:
            money: Mapping[str, Money] = self.money
            snapshots = {t: m for t in sorted({v.tenant for v in live if v.tenant not in money})
                         if (m := await self.admission.money(t)) is not None}
            if snapshots:
                money = ChainMap(snapshots, self.money)
            await self.reconcile(kueue, unsettled(live, money), money)
        except Exception:  # e.g. Postgres away: decide them on the next pass
            self.dirty |= keys
            self.stale |= tenants
            raise

    async def reconcile(self, kueue: Kueue, views: list[WorkloadView],
                        money: Mapping[str, Money] | None = None) -> None:
        if not views:
            return
        jobs = await self.admission.store.get_many(sorted({v.job_id for v in views}))
        money = self.money if money is None else money
        # Patched side by side (the client's pool holds PATCH_CONCURRENCY connections):
        # after an apiserver restart every Workload that arrived meanwhile waits for its
        # verdict at once, and one after another they took seconds on a loaded apiserver.
        slots = asyncio.Semaphore(PATCH_CONCURRENCY)

        async def patch(w: WorkloadView, verdict: Verdict) -> None:
            async with slots:
                log.info("check %s/%s -> %s: %s", w.namespace, w.name, verdict.state.value,
                         verdict.message)
                try:
                    await asyncio.to_thread(kueue.set_check, w, self.check, verdict)
                except ApiException as exc:  # the list moved (test op), a conflict: next pass
                    log.info("check patch of %s/%s refused (%s %s); retrying", w.namespace,
                             w.name, exc.status, exc.reason)
                    self.dirty.add(f"{w.namespace}/{w.name}")

        failed = [r for r in await asyncio.gather(
            *(patch(w, v) for w, v in changes(views, jobs, money)), return_exceptions=True)
            if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        for w in to_deactivate(views, jobs, money):
            key = f"{w.namespace}/{w.name}"
            if key in self.deactivated:
                continue
            log.warning("deactivating %s: its tenant's budget is spent", key)
            await asyncio.to_thread(kueue.deactivate, w, budget_spent_reason(w.tenant))
            self.deactivated.add(key)
