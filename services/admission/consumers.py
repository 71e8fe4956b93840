"""Transport: what admission hears on the bus.

- kestrel.runway.> through kestrel.runway (a restarted admission hears every
  tenant's last figure at once): a changed runway may free held jobs, so the tenant
  is re-evaluated when it has held jobs (coalesced: one pending re-evaluation per tenant at a time),
  and the runway check decides the tenant's waiting Workloads again.
- kestrel.workload.> (durable consumer `admission`): job states follow
  Kubernetes; acknowledged after the state change is committed. A message that
  is not a WorkloadEvent is parked on kestrel.deadletter.admission.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus
from kestrel.workloads import EventType
from kestrel_sdk.v1 import common_pb2, events_pb2
from services.admission.core import Admission, WorkloadChange

log = logging.getLogger("kestrel.admission.bus")

CLOSING = frozenset(t.value for t in EventType if t.closes)


class Reevaluator:
    """Coalesces re-evaluation requests per tenant: requests within `coalesce_s` of
    the first are served by one ledger snapshot (a busy tenant finishes many jobs a
    second)."""

    def __init__(self, admission: Admission, coalesce_s: float = 0.05) -> None:
        self.admission = admission
        self.coalesce_s = coalesce_s
        self.pending: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def request(self, tenant: str) -> None:
        if tenant in self.pending:
            return
        self.pending.add(tenant)
        task = asyncio.create_task(self._run(tenant))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, tenant: str) -> None:
        try:
            await asyncio.sleep(self.coalesce_s)  # let a burst of messages coalesce
            self.pending.discard(tenant)
            await self.admission.reevaluate(tenant)
        except Exception:
            log.exception("re-evaluating %s failed", tenant)


def wants_decision(admission: Admission, tenant: str) -> bool:
    """Whether a tenant has held jobs that a change may free. Holds whose allocation
    the meter closed need no decision of their own: the meter's reserved figure already
    counts them as nothing, the tenant's next decision spends them from its snapshot
    and the 5 s sweep spends the rest. (Re-evaluating every tenant with open holds on
    each of its runways cost one ledger snapshot per admission: the admission moves the
    meter's reserved figure, whose runway woke admission again.)"""
    book = admission.books.get(tenant)
    return book is not None and bool(book.held)


def on_runway(reeval: Reevaluator,
              wake: Callable[[common_pb2.Runway], None] | None = None
              ) -> Callable[[common_pb2.Runway], None]:
    """What a tenant's new runway (kestrel.runway.Runways' listener) sets going: its
    held jobs are decided again, and so are its waiting Workloads."""
    def listener(runway: common_pb2.Runway) -> None:
        if wake is not None:
            wake(runway)
        if wants_decision(reeval.admission, runway.tenant):
            reeval.request(runway.tenant)
    return listener


async def follow_workloads(nc: NATS, admission: Admission, reeval: Reevaluator,
                           stop: asyncio.Event, gather_s: float = 0.0) -> None:
    """With `gather_s`, a fetch that got a first event waits that long for company: a
    job's next state shows that much later, and a trickle of events costs one
    statement and one write of announcements per batch instead of one per event."""
    js = nc.jetstream()

    async def handle(msgs: list[Msg]) -> None:
        done: list[Msg] = []
        changes: list[WorkloadChange] = []
        for m in msgs:
            try:
                e = bus.parse(m, events_pb2.WorkloadEvent)
            except bus.Unusable as exc:
                await bus.park_and_term(js, "admission", m, f"not a WorkloadEvent: {exc}", log)
                continue
            done.append(m)
            if e.kind == common_pb2.WORKLOAD_KIND_JOB:
                changes.append(WorkloadChange(e.tenant, e.workload_id, e.type, e.time_us,
                                              e.reason, e.flavor))
        if changes:
            # Applied in place, never nak'd: a job's states must follow stream order. The
            # batch goes as one statement per wave (admission.workload_events).
            await bus.until_done(f"job states for {len(changes)} workload events",
                                 functools.partial(admission.workload_events, changes))
        for c in changes:
            if c.kind in CLOSING and wants_decision(admission, c.tenant):
                reeval.request(c.tenant)  # its quota and money are free again
        # Each committed; acknowledged together, so they leave in one write.
        for m in done:
            await m.ack()

    await bus.pull(nc, bus.Durable("KESTREL_WORKLOADS", "kestrel.workload.>", "admission", 256,
                                   gather_s=gather_s), handle, stop)
