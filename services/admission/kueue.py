"""Transport: the runway AdmissionCheck controller against the real Kueue.

The Workloads that carry our check come from the placer, Kestrel's one watcher of
Workloads, over core NATS (kestrel.checkfeed): only the fields a verdict reads, only
when they change, numbered so that a gap asks for a full set. (A watch of its own here
was one more stream of every Workload event for the apiserver to encode and write,
about 7 CPU-ms of apiserver per job.) Changed Workloads are decided within a few tens
of milliseconds (events are batched); a tenant's are decided again when its runway or
a held job of it changes (`wake`), and all every few seconds. Tenants' money is
cached between those refreshes, and only Workloads that are not `settled` are looked
up and decided, so a busy cluster costs a job-row read per new Workload, not one per
Workload per event. The pure `runway_check` says what each check entry and
`spec.active` should be; only differences are patched. It also keeps the
AdmissionCheck's Active condition True, or Kueue would deactivate the ClusterQueues
that name it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kestrel import checkfeed, kubeclient
from kestrel.checkfeed import WorkloadView
from kestrel.kubeclient import new_api_client
from kestrel.workloads import (
    EVICTION_REASON_ANNOTATION,
    KUEUE_API_VERSION,
    KUEUE_GROUP,
    budget_spent_reason,
)
from kestrel_sdk.v1 import common_pb2, events_pb2
from services.admission.core import Admission
from services.admission.runway_check import (
    CheckAnswer,
    Funds,
    changes,
    decides_alike,
    money_of,
    to_deactivate,
    unsettled,
)

log = logging.getLogger("kestrel.admission.runway_check")

SYNC_EVERY_S = 1.0  # the most often a full set is asked of the placer
PATCH_CONCURRENCY = 4  # check verdicts written at once (and the client's pool size)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kueue:
    """Blocking calls; run them in threads."""

    def __init__(self, kubeconfig: str) -> None:
        self.custom: Any = k8s.CustomObjectsApi(new_api_client(kubeconfig, PATCH_CONCURRENCY))

    def set_check(self, w: WorkloadView, check: str, v: CheckAnswer) -> None:
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
        # The Workloads with our check, as the placer forwards them (kestrel.checkfeed);
        # `sync` asks it for a full set (None: nobody to ask, e.g. in unit tests).
        self.inbox = checkfeed.Inbox()
        self.sync: Callable[[str], Awaitable[None]] | None = None
        self.asked_at = -SYNC_EVERY_S
        # Per tenant: its money as its last runway said (the runway reader starts with
        # every tenant's last, and the meter publishes each change). A tenant with none
        # heard yet reads a ledger snapshot for each pass that decides it (decide()).
        self.money: dict[str, Funds] = {}
        self.dirty: set[str] = set()  # Workloads to decide
        self.stale: set[str] = set()  # tenants whose Workloads to decide again
        self.changed = asyncio.Event()
        self.deactivated: set[str] = set()

    def wake(self, tenant: str, money: Funds | None = None) -> None:
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

    @property
    def views(self) -> dict[str, WorkloadView]:
        return self.inbox.views

    def received(self, msg: events_pb2.CheckedWorkloads) -> bool:
        """On the event loop: one message of the placer's feed into the cache, its
        Workloads to decide (every one after a full set); whether a full set must be
        asked for (a gap in the numbers, or none received yet)."""
        changed, _, ask = self.inbox.accept(msg)
        if msg.reset:
            self.dirty |= set(self.inbox.views)
        else:
            self.dirty |= {v.key for v in changed}
        self.changed.set()
        return ask

    async def ask_full(self, reason: str) -> None:
        """Ask the placer for every Workload it knows with our check, at most once a
        second (a reset may take that long to come back from a busy placer)."""
        now = asyncio.get_running_loop().time()
        if self.sync is None or now - self.asked_at < SYNC_EVERY_S:
            return
        self.asked_at = now
        log.info("asking the placer for the full set of checked Workloads: %s", reason)
        await self.sync(reason)

    async def run(self, stop: asyncio.Event) -> None:
        kueue = await asyncio.to_thread(Kueue, self.kubeconfig)
        loop = asyncio.get_running_loop()
        active_at = full_at = 0.0
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
                    if not self.inbox.whole:  # none yet (the placer not up), or one lost
                        await self.ask_full("no whole set of checked Workloads held")
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
            money: Mapping[str, Funds] = self.money
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
                        money: Mapping[str, Funds] | None = None) -> None:
        if not views:
            return
        jobs = await self.admission.store.get_many(sorted({v.job_id for v in views}))
        money = self.money if money is None else money
        # Patched side by side (the client's pool holds PATCH_CONCURRENCY connections):
        # after an apiserver restart every Workload that arrived meanwhile waits for its
        # verdict at once, and one after another they took seconds on a loaded apiserver.
        slots = asyncio.Semaphore(PATCH_CONCURRENCY)

        async def patch(w: WorkloadView, verdict: CheckAnswer) -> None:
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
