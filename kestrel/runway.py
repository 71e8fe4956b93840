"""Every tenant's last runway, as the meter published it: one reader for all.

The meter publishes a tenant's complete figure (credits, charged, reserved, burn,
runway, stamped with the ledger row it includes and the instant it was computed) on
kestrel.runway.<tenant>, into KESTREL_RUNWAY, a stream that keeps the last message
per subject. A reader therefore needs no query: `follow()` reads every tenant's last
figure at start (`ready` is set once the stream's backlog is read, or after
`catch_up_s`), then each new one as it is published, into a `Runways`. Admission (its
held jobs and the runway check), the placer (flavor by runway) and the autoscaler
(how far an endpoint may scale) each keep one and subscribe to its changes; the
gateway keeps one for Infer's budget gate (no call to the meter per request).

`Runways.take` is pure: a figure older than the one held (a lower ledger sequence,
or the same one computed earlier) is dropped, so a redelivery after a reconnect
never turns a tenant's view back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping

from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from kestrel.bus import FETCH_RETRY_S, PULL_WAIT_S, Durable, Puller
from kestrel_sdk.v1 import common_pb2, events_pb2

__all__ = ["STREAM", "SUBJECTS", "Runways", "follow"]

log = logging.getLogger("kestrel.runway")

STREAM = "KESTREL_RUNWAY"
SUBJECTS = "kestrel.runway.>"

Listener = Callable[[common_pb2.Runway], None]

BATCH = 256  # runway messages a pull asks for (one per tenant at start)
INACTIVE_S = 120.0  # a consumer nobody pulls from this long is removed by the server


def _order(r: common_pb2.Runway) -> tuple[int, int, int]:
    return (r.meter_version, r.ledger_seq, r.as_of_us)


class Runways(Mapping[str, common_pb2.Runway]):
    """Tenant -> the newest runway heard for it; listeners hear each one taken."""

    def __init__(self) -> None:
        self._last: dict[str, common_pb2.Runway] = {}
        self._listeners: list[Listener] = []

    def __getitem__(self, tenant: str) -> common_pb2.Runway:
        return self._last[tenant]

    def __iter__(self) -> Iterator[str]:
        return iter(self._last)

    def __len__(self) -> int:
        return len(self._last)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def take(self, runway: common_pb2.Runway) -> bool:
        """Keep `runway` unless it is older than the tenant's last; tell the listeners.

        Older: by the meter's write version, then the ledger row, then the instant. Two
        meter replicas publish figures of one tenant, and the later one committed may
        reach the stream first."""
        if not runway.tenant:
            return False
        old = self._last.get(runway.tenant)
        if old is not None and _order(runway) < _order(old):
            return False
        self._last[runway.tenant] = runway
        for listener in self._listeners:
            try:
                listener(runway)
            except Exception:
                log.exception("a runway listener failed for %s", runway.tenant)
        return True


async def follow(nc: NATS, runways: Runways, stop: asyncio.Event,
                 ready: asyncio.Event | None = None, catch_up_s: float = 5.0) -> None:
    """Keep `runways` current until `stop`; set `ready` once the backlog is read.

    One ephemeral pull consumer of the stream (each tenant's last figure first, then
    every new one; no acknowledgements), pulled with kestrel.bus.Puller: idle, one
    long poll every PULL_EXPIRES_S. nats-py's ordered push consumer, used before,
    woke its client every 0.25 s to check flow control (4 wake-ups a second of each
    of admission, the placer and the autoscaler, idle or not) and took heartbeats
    from the server. A consumer the server lost (a restart, or inactive longer than
    INACTIVE_S while the connection was down) refuses the next pull: it is made
    again, from each tenant's last figure, and `Runways.take` keeps only what is
    newer than what it holds."""
    js = nc.jetstream()
    try:
        state = (await js.stream_info(STREAM)).state
        last = state.last_seq if state.messages else 0
    except Exception:  # no stream yet (the meter has not started): nothing to catch up
        last = 0
    caught_up = asyncio.Event()
    if last == 0:
        caught_up.set()

    async def announce() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(caught_up.wait(), timeout=catch_up_s)
        if ready is not None:
            ready.set()
        log.info("runway view: %d tenants", len(runways))

    announcing = asyncio.create_task(announce())
    puller: Puller | None = None

    async def halt_on_stop() -> None:
        await stop.wait()
        if puller is not None:
            puller.halt()

    halting = asyncio.create_task(halt_on_stop())
    try:
        while not stop.is_set():
            try:
                if puller is None:
                    puller = await _open(nc)
                    if stop.is_set():
                        break
                msgs = await puller.fetch(BATCH, timeout=PULL_WAIT_S)
            except Exception as exc:  # NATS away, or the consumer lost: make it again
                log.warning("runway view: pulling failed (%s); again in %.1fs", exc,
                            FETCH_RETRY_S)
                if puller is not None:
                    await _close(nc, puller)
                    puller = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), FETCH_RETRY_S)
                continue
            for msg in msgs:
                try:
                    runways.take(events_pb2.RunwayChanged.FromString(msg.data).runway)
                except Exception:
                    log.error("undecodable runway message on %s", msg.subject)
                if msg.metadata.sequence.stream >= last:
                    caught_up.set()
    finally:
        halting.cancel()
        announcing.cancel()
        if puller is not None:
            await _close(nc, puller)


async def _open(nc: NATS) -> Puller:
    config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                            ack_policy=AckPolicy.NONE, filter_subject=SUBJECTS,
                            inactive_threshold=INACTIVE_S, mem_storage=True, num_replicas=1)
    info = await nc.jetstream().add_consumer(STREAM, config=config)
    return await Puller.attach(nc, Durable(STREAM, SUBJECTS, info.name, BATCH))


async def _close(nc: NATS, puller: Puller) -> None:
    await puller.close()
    with contextlib.suppress(Exception):  # gone already, or NATS away: it expires
        await nc.jetstream().delete_consumer(STREAM, puller.durable.name)
