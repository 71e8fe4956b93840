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

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from kestrel import bus
from kestrel.v1 import events_pb2
from services.meter.core import Meter
from services.meter.domain import Event
from services.meter.wire import BadEvent, event_from_wire

log = logging.getLogger("kestrel.meter.consumer")

DURABLE = "meter"
STREAM = "KESTREL_WORKLOADS"


class WorkloadConsumer:
    def __init__(self, js: JetStreamContext, meter: Meter, *, batch: int = 1000,
                 on_bad: Callable[[], None] = lambda: None) -> None:
        self.js = js
        self.meter = meter
        self.batch = batch
        self.on_bad = on_bad
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        sub = await self.js.pull_subscribe(
            "kestrel.workload.>", durable=DURABLE, stream=STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
                                  max_ack_pending=50_000, deliver_policy=DeliverPolicy.ALL,
                                  max_deliver=-1))
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(self.batch, timeout=0.5)
            except (TimeoutError, NatsTimeout):
                continue
            except Exception as exc:  # connection trouble: nats-py reconnects
                log.warning("fetch failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
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
            while True:
                try:
                    await self.meter.ingest(events)
                    break
                except Exception:
                    # Not acknowledged: retry the same batch (idempotent by event id).
                    log.exception("ingest failed; retrying the batch")
                    await asyncio.sleep(1.0)
            for m in good:
                await m.ack()

    def stop(self) -> None:
        self._stopping.set()
