"""The NATS JetStream bus: subjects, streams, typed publish and decode.

Every message is a protobuf body with headers `Kestrel-Type:
kestrel.v1.<Message>` and `Nats-Msg-Id: <stable id>` (JetStream drops
duplicates inside the stream's duplicate window).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import nats
from google.protobuf import json_format
from google.protobuf.message import Message
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from kestrel import natsauth
from kestrel.service import pause_unless_stopped
from kestrel.validation import string_violations
from kestrel.workloads import EventType
from kestrel_sdk.v1 import admission_pb2, common_pb2, events_pb2, meter_pb2

log = logging.getLogger("kestrel.bus")

TYPE_HEADER = "Kestrel-Type"
MSG_ID_HEADER = "Nats-Msg-Id"


# Subjects (ARCHITECTURE.md, Contracts).
def subject_job_admitted(tenant: str) -> str:
    return f"kestrel.jobs.admitted.{tenant}"


def subject_job_state(tenant: str) -> str:
    return f"kestrel.jobs.state.{tenant}"


def subject_workload(tenant: str, event: str | int) -> str:
    name = EventType(event).word if isinstance(event, int) else event
    return f"kestrel.workload.{tenant}.{name}"


def subject_runway(tenant: str) -> str:
    return f"kestrel.runway.{tenant}"


def subject_endpoint_scaled(tenant: str, endpoint: str) -> str:
    return f"kestrel.endpoint.{tenant}.{endpoint}.scaled"


def subject_deadletter(service: str) -> str:
    return f"kestrel.deadletter.{service}"


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    retention: RetentionPolicy
    max_msgs_per_subject: int = -1
    max_age_s: float = 0.0
    duplicate_window_s: float = 120.0

    def config(self, replicas: int = 1) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=self.subjects,
            retention=self.retention,
            storage=StorageType.FILE,
            num_replicas=replicas,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_age=self.max_age_s or None,
            duplicate_window=self.duplicate_window_s,
        )


STREAMS = [
    StreamSpec("KESTREL_JOBS", ["kestrel.jobs.admitted.>"], RetentionPolicy.WORK_QUEUE),
    StreamSpec("KESTREL_JOB_STATES", ["kestrel.jobs.state.>"], RetentionPolicy.LIMITS,
               max_age_s=7 * 86400),
    StreamSpec("KESTREL_WORKLOADS", ["kestrel.workload.>"], RetentionPolicy.LIMITS,
               max_age_s=7 * 86400),
    StreamSpec("KESTREL_RUNWAY", ["kestrel.runway.>"], RetentionPolicy.LIMITS,
               max_msgs_per_subject=1),
    StreamSpec("KESTREL_ENDPOINTS", ["kestrel.endpoint.>"], RetentionPolicy.LIMITS,
               max_age_s=7 * 86400),
    # Messages a durable consumer could not use, parked for an operator (`park`).
    StreamSpec("KESTREL_DEADLETTER", ["kestrel.deadletter.>"], RetentionPolicy.LIMITS,
               max_age_s=30 * 86400),
]


async def connect(url: str, name: str) -> NATS:
    """Connect with unlimited reconnects: the services ride out a NATS restart. A URL
    with a user (kestrel.natsauth) gets that user's own reply inbox prefix, the only
    inbox its permissions let it subscribe to."""

    last = ""

    async def on_error(exc: Exception) -> None:
        nonlocal last
        if str(exc) != last:  # a reconnect loop repeats itself: say it once
            last = str(exc)
            log.warning("nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        log.warning("nats %s: disconnected", name)

    async def on_reconnect() -> None:
        nonlocal last
        last = ""
        log.info("nats %s: reconnected", name)
        for puller in list(_PULLERS):
            if puller.nc is nc:
                puller.wake()

    user = natsauth.user_of(url)
    extra: dict[str, Any] = {"inbox_prefix": natsauth.inbox_prefix(user)} if user else {}
    nc = await nats.connect(
        natsauth.servers(url), name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024, **extra,
    )
    return nc


def stream_replicas() -> int:
    """How many nodes keep each stream (KESTREL_NATS_REPLICAS): 1 on one server, 3 on a
    three-node cluster (JetStream's Raft: a stream stays writable while a majority of
    its replicas is up)."""
    return max(1, int(os.environ.get("KESTREL_NATS_REPLICAS", "1") or 1))


async def ensure_streams(js: JetStreamContext, replicas: int | None = None) -> None:
    """Create or update every Kestrel stream; idempotent. A stream made with another
    replica count is updated to this one."""
    for spec in STREAMS:
        cfg = spec.config(replicas or stream_replicas())
        try:
            await js.add_stream(cfg)
        except BadRequestError:
            await js.update_stream(cfg)


def type_name(msg: Message) -> str:
    return msg.DESCRIPTOR.full_name


def headers_for(msg: Message, msg_id: str) -> dict[str, str]:
    return {TYPE_HEADER: type_name(msg), MSG_ID_HEADER: msg_id}


async def publish(js: JetStreamContext, subject: str, msg: Message, msg_id: str,
                  ack_timeout_s: float = 5.0) -> Any:
    """Publish to JetStream and wait for the stream's ack (durable once this returns)."""
    return await js.publish(subject, msg.SerializeToString(), timeout=ack_timeout_s,
                            headers=headers_for(msg, msg_id))


# Dead letters: the original bytes, with these headers saying where they came from.
DEADLETTER_SUBJECT_HEADER = "Kestrel-Deadletter-Subject"
DEADLETTER_REASON_HEADER = "Kestrel-Deadletter-Reason"
DEADLETTER_TYPE_HEADER = "Kestrel-Deadletter-Type"  # the original Kestrel-Type, if any
DEADLETTER_SEQ_HEADER = "Kestrel-Deadletter-Seq"  # stream and sequence it was read at


class Unusable(ValueError):
    """A bus message a consumer cannot use as it is: it is parked, never retried."""


M = TypeVar("M", bound=Message)
T = TypeVar("T")


def parse(msg: Any, cls: type[M]) -> M:
    """The body of a consumed message as `cls`, or Unusable saying why not: a
    Kestrel-Type header naming another message, bytes that do not decode (invalid
    UTF-8 included), or strings no store can hold (NUL and other control characters,
    oversized: kestrel.validation, the same check every RPC request gets)."""
    kind = (msg.headers or {}).get(TYPE_HEADER)
    if kind is not None and kind != cls.DESCRIPTOR.full_name:
        raise Unusable(f"Kestrel-Type is {kind[:100]!r}, expected {cls.DESCRIPTOR.full_name}")
    try:
        out = cls.FromString(msg.data)
    except Exception as exc:
        raise Unusable(f"does not decode as {cls.DESCRIPTOR.full_name}: {exc}") from None
    bad = string_violations(out)
    if bad:
        raise Unusable("; ".join(f"{v.field}: {v.description}" for v in bad))
    return out


async def park(js: JetStreamContext, service: str, msg: Any, reason: str) -> None:
    """Publish a message `service` could not use to kestrel.deadletter.<service>: the
    original bytes and headers, plus the subject it came on, the stream sequence, and
    the reason. The original Kestrel-Type moves to Kestrel-Deadletter-Type, so `kestrel
    tap 'kestrel.deadletter.>'` shows the bytes as they are rather than misdecode them.
    Idempotent: a redelivered message is parked once (Nats-Msg-Id from its sequence)."""
    headers = {k: v for k, v in (msg.headers or {}).items()
               if k not in (TYPE_HEADER, MSG_ID_HEADER)}
    original_type = (msg.headers or {}).get(TYPE_HEADER)
    if original_type is not None:
        headers[DEADLETTER_TYPE_HEADER] = original_type
    try:
        meta = msg.metadata
        where = f"{meta.stream}:{meta.sequence.stream}"
    except Exception:  # not a JetStream message
        where = ""
    headers[DEADLETTER_SUBJECT_HEADER] = msg.subject
    headers[DEADLETTER_REASON_HEADER] = " ".join(reason.split())[:500]
    if where:
        headers[DEADLETTER_SEQ_HEADER] = where
        headers[MSG_ID_HEADER] = f"{service}:{where}"
    await js.publish(subject_deadletter(service), msg.data, timeout=5.0, headers=headers)


async def park_and_term(js: JetStreamContext, service: str, msg: Any, reason: str,
                        log_to: logging.Logger = log) -> bool:
    """Park `msg` (see `park`), then terminate it so the consumer moves on. Should the
    park fail (NATS trouble), the message is negatively acknowledged for a later retry
    instead: a bad message is never dropped unseen. Returns whether it was parked."""
    log_to.error("parking a message on %s at %s: %s", msg.subject,
                 subject_deadletter(service), reason)
    try:
        await park(js, service, msg, reason)
    except Exception as exc:
        log_to.warning("parking failed (%s); redelivery in 5s", exc)
        await msg.nak(delay=5.0)
        return False
    await msg.term()
    return True


def message_class(full_name: str) -> type[Message] | None:
    """The generated class for `kestrel.v1.<Message>` (any file of kestrel_sdk/v1)."""
    if not full_name.startswith("kestrel.v1."):
        return None
    short = full_name.removeprefix("kestrel.v1.")
    for module in (events_pb2, meter_pb2, common_pb2, admission_pb2):
        cls = getattr(module, short, None)
        if isinstance(cls, type) and issubclass(cls, Message):
            return cls
    from kestrel_sdk.v1 import autoscaler_pb2, gateway_pb2, placer_pb2, worker_pb2

    for module in (gateway_pb2, placer_pb2, autoscaler_pb2, worker_pb2):
        cls = getattr(module, short, None)
        if isinstance(cls, type) and issubclass(cls, Message):
            return cls
    return None


def decode(headers: dict[str, str] | None, data: bytes) -> tuple[str, dict[str, Any] | None]:
    """Decode a bus message to (type, JSON-ready dict); dict is None when unknown."""
    kind = (headers or {}).get(TYPE_HEADER, "")
    cls = message_class(kind)
    if cls is None:
        return kind, None
    msg = cls()
    msg.ParseFromString(data)
    return kind, json_format.MessageToDict(msg, preserving_proto_field_name=True)


async def retry_forever(what: str, fn: Callable[[], Awaitable[Any]], *,
                        first_delay: float = 0.2, max_delay: float = 5.0) -> Any:
    """Call fn until it succeeds, with backoff; for start-up connections."""
    delay = first_delay
    while True:
        try:
            return await fn()
        except Exception as exc:
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
        await pause_unless_stopped(delay)
        delay = min(delay * 2, max_delay)


# --- durable consumers ------------------------------------------------------------

FETCH_RETRY_S = 0.5  # a fetch that failed (NATS away, nats-py reconnecting) is retried
WORK_RETRY_S = 1.0  # work that failed on a dependency (a store, the apiserver) is retried


@dataclass(frozen=True)
class Durable:
    """A durable pull consumer: explicit acks, redelivered without limit (a message is
    done when it is acknowledged or parked, never because it was tried N times)."""

    stream: str
    subject: str
    name: str
    batch: int
    ack_wait_s: int = 30
    max_ack_pending: int = 10_000
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    # How long a fetch that got a first message waits for more before it hands out a
    # batch short of `batch`: for a consumer whose cost is per batch rather than per
    # message (the meter: one transaction each), at the price of that much latency.
    gather_s: float = 0.0

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s,
                              max_deliver=-1, max_ack_pending=self.max_ack_pending,
                              deliver_policy=self.deliver_policy)


# How long one pull request waits on the server for messages. An idle consumer keeps
# one waiting: at 0.5 s, the asks of the three services' consumers and their 408
# answers took NATS from 0.5 to 8.5 ms of CPU a second with nothing to deliver (and the
# services 2-3 ms a second each); at 5 s, 4.0-4.5 ms (the plane idle, 20-30 s each).
PULL_EXPIRES_S = 5.0
# A request asked ahead (the batch before was full) expires sooner: closing waits for
# it (see Puller.close), and it is asked only while a backlog lasts.
PULL_AHEAD_EXPIRES_S = 0.5
# How long `pull` waits in one fetch. It is woken sooner by its stop event (Puller.halt),
# by what the server sends (a message, or the 408 that ends a request at its expiry),
# by a reconnect (kestrel.bus.connect) and, should a request be lost, at its lapse: so
# an idle consumer wakes once a PULL_EXPIRES_S. (Looking at the stop event every 0.5 s
# was two wake-ups a second of every idle consumer, a third of admission's timers.)
PULL_WAIT_S = 30.0
# A request neither filled nor answered this long after it expired was lost (NATS
# restarted, the client reconnected): the next fetch asks again. A reconnect is also
# seen at once (the client's reconnect count): the server forgot its requests.
PULL_LOST_S = 1.0
# After a burst, how long a fetch waits for more of the same request before it returns
# what it has: a backlog arrives in socket-sized chunks a few hundred microseconds apart,
# and one transaction per thousand messages is cheaper than one per chunk.
PULL_LINGER_S = 0.002


class Refused(Exception):
    """JetStream ended a pull request with an error status (409 and the like)."""


class Puller:
    """The fetches of one durable pull consumer, gathered by a callback on one inbox.

    nats-py's `fetch` takes every message off its queue with a task and a timeout of its
    own, about 25 us a message of CPU here (bench-meter, 1,000-message batches: 35 us
    a message fetched and acknowledged, against 10 us this way). The pull protocol is
    JetStream's own: a request on $JS.API.CONSUMER.MSG.NEXT.<stream>.<durable> for up to
    `batch` messages, which the server answers on the reply inbox with messages (their
    reply subject is their $JS.ACK) until the batch is full, or with a status (408 when
    it expired unfilled). At most one request is in flight; what it delivers stays in
    `ready` until a fetch takes it, so nothing delivered is dropped."""

    def __init__(self, nc: NATS, durable: Durable) -> None:
        self.nc = nc
        self.durable = durable
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{durable.stream}.{durable.name}"
        self.inbox = nc.new_inbox()
        self.ready: deque[Msg] = deque()
        self.arrived = asyncio.Event()
        self.owed = 0  # messages the request in flight may still deliver
        self.lapses = 0.0  # monotonic time after which that request is lost in any case
        self.asked_in = -1  # the connection (its reconnect count) that request went on
        self.refused: str | None = None
        self.prefetching = False  # the request in flight was sent ahead (see fetch)
        self.was_full = False  # the last batch handed out was full: a backlog
        self.halted = False  # halt(): fetches return what is here, at once
        self.sub: Any = None

    @classmethod
    async def open(cls, nc: NATS, durable: Durable) -> Puller:
        """Create the durable consumer unless it exists (an existing one keeps its
        configuration, as with nats-py's pull_subscribe), then listen on the inbox."""
        js = nc.jetstream()
        try:
            await js.consumer_info(durable.stream, durable.name)
        except NotFoundError:
            config = durable.config()
            config.filter_subject = durable.subject
            config.name = config.durable_name = durable.name
            await js.add_consumer(durable.stream, config=config)
        return await cls.attach(nc, durable)

    @classmethod
    async def attach(cls, nc: NATS, durable: Durable) -> Puller:
        """Pull from the consumer named `durable.name`, which exists (an ephemeral one
        made by the caller, kestrel.runway): listen on the inbox."""
        self = cls(nc, durable)
        self.sub = await nc.subscribe(self.inbox, cb=self.on_msg)
        _PULLERS.add(self)
        return self

    def halt(self) -> None:
        """Stop waiting: the fetch in progress, and any after it, returns at once."""
        self.halted = True
        self.arrived.set()

    def wake(self) -> None:
        """Look again now (the connection was re-established: the server forgot the
        request in flight, and the next fetch asks again)."""
        self.arrived.set()

    async def on_msg(self, msg: Msg) -> None:
        if msg.reply and msg.reply.startswith("$JS.ACK."):  # a stream message
            self.ready.append(msg)
            self.owed = max(0, self.owed - 1)
        else:  # a status: the request is over (408, 404) or was refused (409 ...)
            status = (msg.headers or {}).get("Status", "")
            if status == "100":  # a heartbeat or flow control: none are asked for
                return
            self.owed = 0
            if status not in ("404", "408"):
                self.refused = f"{status} {(msg.headers or {}).get('Description', '')}"
        self.arrived.set()

    def in_flight(self) -> bool:
        return (self.owed > 0 and time.monotonic() < self.lapses
                and self.asked_in == self._connection())

    def _connection(self) -> int:
        return int(self.nc.stats.get("reconnects", 0))

    async def _next_arrival(self, within_s: float) -> None:
        """Wait up to `within_s` for the inbox to hear something after `arrived` was
        last cleared (callers clear it before they ask, so nothing heard while a
        request is being sent is missed)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.arrived.wait(), within_s)

    async def _ask(self, batch: int, *, ahead: bool = False) -> None:
        expires = PULL_AHEAD_EXPIRES_S if ahead else PULL_EXPIRES_S
        self.prefetching = ahead
        self.owed = batch
        self.lapses = time.monotonic() + expires + PULL_LOST_S
        self.asked_in = self._connection()
        await self.nc.publish(self.next_subject, json.dumps(
            {"batch": batch, "expires": int(expires * 1e9)}).encode(), reply=self.inbox)

    async def fetch(self, batch: int, timeout: float,  # noqa: ASYNC109
                    gather_s: float = 0.0) -> list[Msg]:
        """Up to `batch` messages: those already here, else the first to arrive within
        `timeout` together with the rest of its burst, and with `gather_s`, whatever
        else comes within that long of the first (unless the batch before was full:
        the tail of a backlog goes at once); [] when none came. Raises Refused when
        JetStream refused the pull."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.ready:
            if self.refused:
                why, self.refused = self.refused, None
                raise Refused(f"{self.durable.name}: pull refused: {why}")
            if self.halted:
                return []
            self.arrived.clear()
            if not self.in_flight():
                await self._ask(batch)
            left = deadline - loop.time()
            if left <= 0:
                return self._take(batch)
            # Until something is heard, or the request in flight lapses unanswered.
            await self._next_arrival(min(left, max(self.lapses - time.monotonic(), 0.01)))
        # A burst (more than one came at once) is likely a backlog: take the rest of
        # the request while it keeps coming.
        while 1 < len(self.ready) < batch and self.in_flight():
            had = len(self.ready)
            self.arrived.clear()
            await self._next_arrival(PULL_LINGER_S)
            if len(self.ready) == had:
                break
        until = loop.time() + (0.0 if self.was_full else gather_s)
        while len(self.ready) < batch and not self.refused and not self.halted and (
                left := until - loop.time()) > 0:
            self.arrived.clear()
            if not self.in_flight():
                await self._ask(batch)
            await self._next_arrival(left)
        out = self._take(batch)
        self.was_full = len(out) == batch
        if len(out) == batch and not self.in_flight() and not self.ready:
            # A full batch: ask for the next one now, so that it arrives while this one
            # is handled (close takes it back if the consumer stops first).
            await self._ask(batch, ahead=True)
        return out

    def _take(self, batch: int) -> list[Msg]:
        return [self.ready.popleft() for _ in range(min(batch, len(self.ready)))]

    async def close(self) -> None:
        """Stop listening; what arrived and was not handled goes back to the stream now
        (nak) rather than after its ack wait. A batch asked for ahead is waited for
        first (it is on its way: unheard, it would wait out its ack wait)."""
        deadline = time.monotonic() + PULL_AHEAD_EXPIRES_S
        while self.prefetching and self.in_flight() and time.monotonic() < deadline:
            self.arrived.clear()
            await self._next_arrival(deadline - time.monotonic())
        with contextlib.suppress(Exception):
            if self.sub is not None:
                await self.sub.unsubscribe()
        while self.ready:
            with contextlib.suppress(Exception):
                await self.ready.popleft().nak()


# The open pullers, woken by their connection's reconnect (connect's on_reconnect).
_PULLERS: weakref.WeakSet[Puller] = weakref.WeakSet()


async def pull(nc: NATS, durable: Durable,
               handle: Callable[[list[Msg]], Awaitable[None]], stop: asyncio.Event) -> None:
    """The loop every durable consumer runs, with one policy for failures:

    1. Fetch up to `durable.batch` messages (a 5 s long poll on the server, asked
       again as each ends, kestrel.bus.Puller; `stop` ends the wait at once). A
       fetch that fails (NATS away while nats-py reconnects, a refused pull) is logged
       and tried again after FETCH_RETRY_S; the stream keeps whatever was not
       acknowledged.
    2. `handle(msgs)` owns the batch. It acknowledges what it has done; it parks what
       it cannot use (`park_and_term`: kestrel.deadletter.<service>, so a bad message
       never blocks the consumer); work that failed on a dependency it either retries
       in place with `until_done` (when later messages must wait for it: the meter's
       ledger, admission's job states) or negatively acknowledges with a WORK_RETRY_S
       delay (messages independent of each other: the placer's jobs).
    3. Should `handle` raise all the same, the error is logged and every message of the
       batch is negatively acknowledged with a WORK_RETRY_S delay (one already
       acknowledged keeps its ack): redelivered, never dropped. Handlers are
       idempotent (by event or job id), so a message handled twice changes nothing.
    """
    puller = await Puller.open(nc, durable)

    async def halt_on_stop() -> None:
        await stop.wait()
        puller.halt()

    halting = asyncio.create_task(halt_on_stop())
    try:
        while not stop.is_set():
            try:
                msgs = await puller.fetch(durable.batch, timeout=PULL_WAIT_S,
                                          gather_s=durable.gather_s)
            except Exception as exc:
                log.warning("%s: fetch failed (%s); again in %.1fs", durable.name, exc,
                            FETCH_RETRY_S)
                await asyncio.sleep(FETCH_RETRY_S)
                continue
            if not msgs:
                continue
            try:
                await handle(msgs)
            except Exception:
                log.exception("%s: a batch of %d failed; redelivery in %.1fs", durable.name,
                              len(msgs), WORK_RETRY_S)
                for m in msgs:
                    with contextlib.suppress(Exception):  # acknowledged ones refuse it
                        await m.nak(delay=WORK_RETRY_S)
    finally:
        halting.cancel()
        await puller.close()


async def until_done(what: str, fn: Callable[[], Awaitable[T]],
                     delay_s: float = WORK_RETRY_S) -> T:
    """Await fn() until it succeeds, every `delay_s`: a durable consumer's work that
    later messages must wait for (see `pull`). fn must be idempotent."""
    while True:
        try:
            return await fn()
        except Exception:
            log.exception("%s failed; retrying in %.1fs", what, delay_s)
            await asyncio.sleep(delay_s)
