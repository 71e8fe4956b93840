"""Transport: the durable JetStream consumer of kestrel.workload.>.

Fetches batches, decodes, hands them to Meter.ingest, and acknowledges only
after ingest returned (the transaction committed). Undecodable or invalid
events are terminated (never redelivered) and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.protobuf.message import DecodeError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

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
                    events.append(event_from_wire(events_pb2.WorkloadEvent.FromString(m.data)))
                    good.append(m)
                except (DecodeError, BadEvent) as exc:
                    log.error("terminating bad workload event on %s: %s", m.subject, exc)
                    self.on_bad()
                    await m.term()
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
