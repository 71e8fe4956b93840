"""Transport: what the placer hears on the bus.

- kestrel.jobs.admitted.> (durable pull consumer `placer`, work queue): each
  admitted job becomes a Kubernetes Job; the message is acknowledged only after
  the Job exists and its QUEUED event is published. Failures are redelivered;
  a message that is not a valid JobAdmitted is parked on kestrel.deadletter.placer.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from kestrel import bus
from kestrel_sdk.v1 import events_pb2
from services.placer.core import AdmittedJob, Placer
from services.placer.wire import admitted_from_wire

log = logging.getLogger("kestrel.placer.bus")

DURABLE = "placer"
STREAM = "KESTREL_JOBS"
ACK_WAIT_S = 30  # a placement not acknowledged by then is delivered again


def _job(msg: Msg) -> AdmittedJob | str:
    """The admitted job a message carries, or why it cannot be placed."""
    try:
        job = admitted_from_wire(bus.parse(msg, events_pb2.JobAdmitted))
    except bus.Unusable as exc:
        return f"not a JobAdmitted: {exc}"
    if not job.job_id or not job.tenant or job.gpus <= 0 or job.max_duration_s <= 0:
        return (f"invalid JobAdmitted {job.job_id[:64]!r}: job_id and tenant are required, "
                "gpus and max_duration_s must be positive")
    return job


async def _place(placer: Placer, msg: Msg, job: AdmittedJob, cancelled: bool) -> None:
    try:
        await placer.place(job, cancelled)
    except Exception as exc:
        log.warning("placing %s failed (%s); redelivery in %.1fs", job.job_id, exc,
                    bus.WORK_RETRY_S)
        await msg.nak(delay=bus.WORK_RETRY_S)
        return
    await msg.ack()


async def handle_admitted(js: JetStreamContext, placer: Placer, msgs: list[Msg]) -> None:
    """One fetched batch: unusable messages parked, one read of which jobs were
    cancelled meanwhile, then every job placed concurrently (jobs are independent),
    each acknowledged or negatively acknowledged on its own."""
    jobs: list[tuple[Msg, AdmittedJob]] = []
    for m in msgs:
        job = _job(m)
        if isinstance(job, str):
            await bus.park_and_term(js, DURABLE, m, job, log)
        else:
            jobs.append((m, job))
    if not jobs:
        return
    try:
        cancelled = await placer.cancelled_before([job.job_id for _, job in jobs])
    except Exception as exc:
        log.warning("reading which of %d admitted jobs were cancelled failed (%s); "
                    "redelivery in %.1fs", len(jobs), exc, bus.WORK_RETRY_S)
        for m, _ in jobs:
            await m.nak(delay=bus.WORK_RETRY_S)
        return
    await asyncio.gather(*(_place(placer, m, job, job.job_id in cancelled) for m, job in jobs))


async def take_over_in_flight(js: JetStreamContext) -> int:
    """Hand out at once what a dead predecessor had fetched and not acknowledged.

    The placer is the one consumer of admitted jobs. After a kill -9 the messages
    the old process had fetched (up to a whole batch) stay pending on the durable
    consumer until their ack wait expires (ACK_WAIT_S), and then come back one
    timer at a time: a restarted placer sat idle for ~16 s, then placed ~7 jobs/s.
    A starting placer that finds acknowledgements pending resets the consumer's
    delivery state (JetStream's consumer reset, ADR-60, nats-server >= 2.14):
    redelivery resumes from its ack floor at once, and the stream still holds
    every unacknowledged job (work-queue retention). Placement is idempotent (one
    Job per job id), so a message placed twice still makes one Job. Returns how
    many were pending."""
    try:
        info = await js.consumer_info(STREAM, DURABLE)
    except NotFoundError:
        return 0
    pending = int(info.num_ack_pending or 0)
    if pending:
        await js.reset_consumer(STREAM, DURABLE)
        log.info("%d admitted jobs were in flight in a previous placer: taken over", pending)
    return pending


async def consume_admitted(nc: NATS, placer: Placer, stop: asyncio.Event,
                           batch: int = 64, ack_wait_s: int = ACK_WAIT_S) -> None:
    js = nc.jetstream()
    await take_over_in_flight(js)

    await bus.pull(nc, bus.Durable(STREAM, "kestrel.jobs.admitted.>", DURABLE, batch,
                                   ack_wait_s=ack_wait_s),
                   functools.partial(handle_admitted, js, placer), stop)
