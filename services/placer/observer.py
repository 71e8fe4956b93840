"""The placer's observer: what Kubernetes says of every Kestrel job, and the events
that implies.

The watch threads feed Workloads, Jobs and Pods into one asyncio queue; one task folds
them into a view per Kestrel job and publishes every event the view implies
(lifecycle.derive) that it has not published yet. A restarted placer starts with no
memory and publishes every implied event again: ids are stable, so JetStream, the
meter and admission drop the repeats. The same Workload watch serves the runway
check's feed to admission (kestrel.checkfeed), in order with the changes, and tells
which Jobs Kueue left without a Workload (requeue_stuck).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kestrel import checkfeed
from kestrel.clock import Clock
from kestrel_sdk.v1 import events_pb2
from services.placer.kube import JOBS, KINDS, PODS, WORKLOADS, Change, Kube
from services.placer.lifecycle import (
    JOB_ID_LABEL,
    NAMESPACE_PREFIX,
    Derived,
    Observed,
    Waiting,
    awaiting_workload,
    created_us,
    derive,
    owner_job,
    requeue_due,
)
from services.placer.standins import StandIns, wanted

log = logging.getLogger("kestrel.placer")

Publish = Callable[[Derived], Awaitable[None]]
PublishChecks = Callable[[list[events_pb2.CheckedWorkloads]], Awaitable[None]]
# On the observer's queue: admission asked for the full set of checked Workloads; the
# time for a numbered empty message to admission (checkfeed.Outbox.beat).
CHECK_SYNC = "check-sync"
CHECK_BEAT = "check-beat"
Key = tuple[str, str]  # (namespace, job name == Kestrel job id)

# How many jobs' events one pass of the observer publishes side by side: enough that a
# busy watch's read goes out in a few NATS writes, few enough that the first list of a
# deep queue (thousands of jobs) does not wait for thousands of acks at once.
PUBLISH_FANOUT = 256


@dataclass
class View:
    job: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    workload_deleted: bool = False
    gone_us: int = 0
    created_stamp: str | None = None  # the Job's creationTimestamp ...
    created_us: int = 0  # ... and that instant, parsed once
    published: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)  # allocations whose close is out
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def empty(self) -> bool:
        return self.job is None and (self.workload is None or self.workload_deleted) and (
            not self.pods)


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def key_of(kind: str, obj: Mapping[str, Any]) -> Key | None:
    meta = metadata_of(obj)
    ns = str(meta.get("namespace", ""))
    if not ns.startswith(NAMESPACE_PREFIX):
        return None
    if kind == WORKLOADS:
        job = owner_job(obj)
        return (ns, job) if job else None
    if kind == JOBS:
        return ns, str(meta.get("name"))
    job_id = (meta.get("labels") or {}).get(JOB_ID_LABEL)
    return (ns, str(job_id)) if job_id else None



class Observer:
    def __init__(self, kube: Kube, publish: Publish, runway_check: str, clock: Clock) -> None:
        self.kube = kube
        self.publish = publish
        self.runway_check = runway_check
        self.clock = clock
        self.views: dict[Key, View] = {}
        self.queue: asyncio.Queue[tuple[str, list[Change]]] = asyncio.Queue()
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        # Host processes answering for simulated GPU replicas (None: not run here).
        self.standins: StandIns | None = None
        self.on_published: Callable[[Derived], None] = lambda e: None
        # Jobs requeued by requeue_stuck: when last, and how many times.
        self.touched: dict[Key, tuple[int, int]] = {}
        # When a Job was last seen to get its Workload: Kueue's progress (requeue_due).
        self.progress_us = 0
        # What requeue_stuck reads, kept as each change is applied rather than found by
        # walking every view each second (that walk parsed every Job's creation stamp:
        # 1.5 CPU-ms a pass with 1,000 jobs held, 9.6 with 4,000). `unserved`: the Jobs
        # without a Workload, with their creation instants; `served_us`: the newest
        # creation among Jobs seen with theirs (requeue_due).
        self.unserved: dict[Key, int] = {}
        self.served_us = 0
        # The runway check's Workload fields, forwarded to admission (kestrel.checkfeed):
        # the placer's Workload watch serves both, one watch stream fewer on the apiserver.
        self.checks = checkfeed.Outbox(runway_check)
        self.publish_checks: PublishChecks | None = None

    def feed(self, loop: asyncio.AbstractEventLoop) -> Callable[[str, list[Change]], None]:
        """A thread-safe callback for the watch threads: one read's events at a time."""

        def emit(kind: str, changes: list[Change]) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, (kind, changes))

        return emit

    def check_sync(self) -> None:
        """Admission asked for every Workload carrying the runway check: sent by the
        observer, in order with the changes it forwards."""
        self.queue.put_nowait((CHECK_SYNC, []))

    async def check_beat(self) -> None:
        """Every few seconds: admission hears the feed's number even when nothing
        changes, so a message lost on a quiet cluster is found missing."""
        self.queue.put_nowait((CHECK_BEAT, []))

    async def run_observer(self, stop: asyncio.Event) -> None:
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if self.queue.empty():
                    getter = asyncio.ensure_future(self.queue.get())
                    await asyncio.wait({getter, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        return
                    reads = [getter.result()]
                else:
                    reads = []
                while not self.queue.empty():  # everything the watches sent meanwhile
                    reads.append(self.queue.get_nowait())
                await self.observe(reads)
        finally:
            stopping.cancel()

    async def observe_now(self, kind: str, etype: str, obj: Any) -> None:
        await self.observe([(kind, [(etype, obj)])])

    async def observe(self, reads: Sequence[tuple[str, Sequence[Change]]]) -> None:
        """Apply the reads' changes in order, deriving each job's events after every
        change (an eviction between two reads of one job is kept); then publish each
        job's new events in its order, the jobs side by side.

        One job at a time, every event waited for its stream ack before the next job's
        went out: one NATS write, one ack read and one wake-up of this loop per event.
        Side by side, the client's flusher carries many jobs' events in one write."""
        due: dict[Key, dict[str, Derived]] = {}
        checks: list[events_pb2.CheckedWorkloads] = []
        beat = False
        for kind, changes in reads:
            if kind == CHECK_SYNC:  # admission asked for every Workload it decides on
                if WORKLOADS in self._listed:  # else the first list sends it
                    checks += self.checks.full()
                continue
            if kind == CHECK_BEAT:
                beat = True
                continue
            for etype, obj in changes:
                try:  # one object the observer cannot read must not stop it
                    if kind == WORKLOADS and self.runway_check:
                        if etype == "RELIST":
                            checks += self.checks.full(obj)
                        else:
                            self.checks.note(obj, etype == "DELETED")
                    for key in self._observed_keys(kind, etype, obj):
                        view = self.views.get(key)
                        if view is None:
                            continue
                        events = due.setdefault(key, {})
                        for event in derive(self.observed(view)):
                            events.setdefault(event.event_id, event)
                except Exception:
                    log.exception("observing %s %s failed", etype, kind)
        if (delta := self.checks.take()) is not None:
            checks.append(delta)
        if beat and not checks and WORKLOADS in self._listed and self.runway_check:
            checks.append(self.checks.beat())
        if checks and self.publish_checks is not None:
            try:  # lost: admission sees the gap in their numbers and asks for a full set
                await self.publish_checks(checks)
            except Exception as exc:
                log.warning("forwarding %d runway-check messages failed: %s", len(checks), exc)
        keys = list(due)
        for at in range(0, len(keys), PUBLISH_FANOUT):
            await asyncio.gather(*(self._settle(key, list(due[key].values()))
                                   for key in keys[at:at + PUBLISH_FANOUT]))

    def _observed_keys(self, kind: str, etype: str, obj: Any) -> list[Key]:
        """Apply one change; the jobs whose events are to be derived now."""
        if etype == "RELIST":
            touched = self._relist(kind, obj)
            self._listed.add(kind)
            if not self.synced.is_set() and self._listed >= set(KINDS):
                self.synced.set()
                touched = set(self.views)
                log.info("initial lists in: %d Kestrel jobs in Kubernetes", len(touched))
            return sorted(touched) if self.synced.is_set() else []
        key = self.apply(kind, etype, obj)
        return [key] if key is not None and self.synced.is_set() else []

    def apply(self, kind: str, etype: str, obj: dict[str, Any]) -> Key | None:
        key = key_of(kind, obj)
        if key is None:
            return None
        view = self.views.setdefault(key, View())
        deleted = etype == "DELETED"
        if kind == WORKLOADS:
            if view.workload is None and not deleted:
                self.progress_us = self.clock()
            view.workload = obj
            view.workload_deleted = deleted
            view.gone_us = self.clock() if deleted else 0
            if deleted:
                # Jobs are not watched (kube.WATCHED): the Workload's deletion is how the
                # placer learns its Job is gone. Kueue's Workload is owned by the Job and
                # the garbage collector deletes it after the Job. (Were the Job still
                # there, Kueue makes it a new Workload, which the watch brings.)
                view.job = None
        elif kind == JOBS:
            view.job = None if deleted else obj
            stamp = metadata_of(obj).get("creationTimestamp") if view.job is not None else None
            if stamp != view.created_stamp:  # parsed once per Job (a new Job: again)
                view.created_stamp, view.created_us = stamp, created_us(view.job)
        elif deleted:
            view.pods.pop(str(metadata_of(obj).get("name")), None)
        else:
            view.pods[str(metadata_of(obj).get("name"))] = obj
        if kind != PODS:
            self._track(key, view)
        return key

    def job_gone(self, key: Key, forget: bool = True) -> None:
        """The Job was deleted (by this placer, or found missing): drop it from the view,
        and with `forget` the view too once nothing else of the job is held in it."""
        view = self.views.get(key)
        if view is None:
            return
        view.job = None
        self._track(key, view)  # out of the requeue set, its touches with it
        if forget and view.empty and not view.lock.locked():
            self.views.pop(key, None)

    def _track(self, key: Key, view: View) -> None:
        """Keep `unserved` and `served_us` true of the view after a change to it."""
        if view.job is not None and view.workload is None:
            self.unserved[key] = view.created_us
            return
        if self.unserved.pop(key, None) is not None:
            self.touched.pop(key, None)
        if view.job is not None:
            self.served_us = max(self.served_us, view.created_us)

    def _relist(self, kind: str, items: Sequence[dict[str, Any]]) -> set[Key]:
        """Apply a full list; what the cache holds but the list lacks was deleted."""
        touched: set[Key] = set()
        present: set[tuple[Key, str]] = set()
        for obj in items:
            added = self.apply(kind, "ADDED", obj)
            if added is not None:
                touched.add(added)
                present.add((added, str(metadata_of(obj).get("name"))))
        for key, view in list(self.views.items()):
            if kind == WORKLOADS and view.workload is not None and not view.workload_deleted:
                if (key, str(metadata_of(view.workload).get("name"))) not in present:
                    self.apply(kind, "DELETED", view.workload)
                    touched.add(key)
            elif kind == JOBS and view.job is not None and (key, key[1]) not in present:
                view.job = None
                self._track(key, view)
                touched.add(key)
            elif kind == PODS:
                for name in [n for n in view.pods if (key, n) not in present]:
                    view.pods.pop(name)
                    touched.add(key)
        return touched

    async def requeue_stuck(self, grace_s: float = 3.0, patience_s: float = 15.0) -> list[Key]:
        """Touch the Jobs Kueue left without a Workload (lifecycle.requeue_due: skipped
        while younger ones got theirs, or Kueue giving no Job a Workload for
        `patience_s`), so Kueue reconciles them now rather than after its backoff."""
        if not self.synced.is_set():
            return []  # not every Workload listed yet: each Job would look stuck
        now = self.clock()
        grace_us = int(grace_s * 1_000_000)
        patience_us = int(patience_s * 1_000_000)
        if not self.unserved:
            return []
        oldest = min(self.unserved.values())
        if oldest + grace_us > self.served_us and now - max(oldest, self.progress_us) < (
                patience_us):
            return []  # none skipped, Kueue not stalled (requeue_due): nothing is due
        waiting: dict[Key, Waiting] = {}
        for key, created in self.unserved.items():
            if now - created < grace_us:
                continue  # not late yet
            view = self.views.get(key)
            if view is not None and awaiting_workload(view.job, view.workload, now, grace_us):
                last, n = self.touched.get(key, (0, 0))
                waiting[key] = Waiting(created, last, n)
        stuck = requeue_due(waiting, self.served_us, now, grace_us, patience_us,
                            progress_us=self.progress_us)
        for key in stuck:
            self.touched[key] = (now, waiting[key].touches + 1)
            try:
                if not await asyncio.to_thread(self.kube.touch_job, key[0], key[1], str(now)):
                    self.job_gone(key)  # deleted meanwhile (not through this placer)
            except ApiException as exc:
                log.warning("requeueing job %s/%s failed: %s", *key, exc.reason)
        for key in [k for k in self.touched if k not in waiting]:
            self.touched.pop(key)
        if stuck:
            log.warning("%d Jobs had no Kueue Workload while younger ones got theirs (or "
                        "Kueue served none for %.0f s): touched them so Kueue reconciles "
                        "them now (%s)",
                        len(stuck), patience_s, ", ".join(k[1] for k in stuck[:5]))
        return stuck

    @staticmethod
    def observed(view: View) -> Observed:
        return Observed(view.job, view.workload, tuple(view.pods.values()),
                        view.workload_deleted, view.gone_us)

    async def _settle(self, key: Key, events: Sequence[Derived]) -> None:
        """Publish a job's derived events not out yet; set its stand-in; forget a job
        gone from Kubernetes once every event of it is out."""
        view = self.views.get(key)
        if view is None:
            return
        try:
            await self.publish_new(view, events)
            if self.standins is not None:
                await self.standins.set(key[1], wanted(view.pods.values()))
        except Exception:
            log.exception("publishing the events of %s/%s failed", *key)
            return
        if view.empty and self.views.get(key) is view:
            self.views.pop(key, None)  # gone from Kubernetes; every event is out

    async def publish_new(self, view: View, events: Sequence[Derived]) -> None:
        """Publish, in order, the events this view has not published yet."""
        async with view.lock:
            for event in events:
                if event.event_id in view.published:
                    continue
                if event.type.closes and event.workload_id in view.closed:
                    continue  # one close per allocation: a cancel already ended it
                await self._publish_retrying(event)
                view.published.add(event.event_id)
                if event.type.closes:
                    view.closed.add(event.workload_id)
                self.on_published(event)

    async def _publish_retrying(self, event: Derived) -> None:
        delay = 0.2
        while True:
            try:
                await self.publish(event)
                return
            except Exception as exc:
                log.warning("publishing %s failed (%s); retrying in %.1fs", event.event_id,
                            exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

