"""Transport: the durable JetStream consumer of kestrel.workload.>.

Fetches batches, decodes, hands them to Meter.ingest, and acknowledges only
after ingest returned (the transaction committed). A message that is not a
meterable WorkloadEvent (wrong Kestrel-Type, undecodable, invalid) is parked on
kestrel.deadletter.meter with the reason, then terminated, and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus
from kestrel_sdk.v1 import events_pb2
from services.meter.core import Meter
from services.meter.domain import Event
from services.meter.wire import BadEvent, event_from_wire

log = logging.getLogger("kestrel.meter.consumer")

DURABLE = "meter"
STREAM = "KESTREL_WORKLOADS"


class WorkloadConsumer:
    def __init__(self, nc: NATS, meter: Meter, *, batch: int = 1000, gather_s: float = 0.0,
                 ack_wait_s: int = 30, on_bad: Callable[[], None] = lambda: None) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.meter = meter
        self.batch = batch
        self.gather_s = gather_s
        self.ack_wait_s = ack_wait_s
        self.on_bad = on_bad
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        await bus.pull(self.nc, bus.Durable(STREAM, "kestrel.workload.>", DURABLE, self.batch,
                                            self.ack_wait_s, max_ack_pending=50_000,
                                            gather_s=self.gather_s),
                       self._handle, self._stopping)

    async def _handle(self, msgs: list[Msg]) -> None:
        events: list[Event] = []
        good = []
        for m in msgs:
            try:
                events.append(event_from_wire(bus.parse(m, events_pb2.WorkloadEvent)))
                good.append(m)
            except (bus.Unusable, BadEvent) as exc:
                self.on_bad()
                await bus.park_and_term(self.js, DURABLE, m, f"not a meterable "
                                        f"WorkloadEvent: {exc}", log)
        # In place, not nak'd: the ledger takes a batch in stream order (idempotent by
        # event id), so the next batch waits for this one.
        await bus.until_done("ingest", lambda: self.meter.ingest(events))
        for m in good:
            await m.ack()

    def stop(self) -> None:
        self._stopping.set()
