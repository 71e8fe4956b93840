"""The NATS JetStream bus: subjects, streams, typed publish and decode.

Every message is a protobuf body with headers `Kestrel-Type:
kestrel.v1.<Message>` and `Nats-Msg-Id: <stable id>` (JetStream drops
duplicates inside the stream's duplicate window).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
from google.protobuf import json_format
from google.protobuf.message import Message
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from kestrel.service import pause_unless_stopped
from kestrel.v1 import admission_pb2, common_pb2, events_pb2, meter_pb2
from kestrel.workloads import EventType

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


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    retention: RetentionPolicy
    max_msgs_per_subject: int = -1
    max_age_s: float = 0.0
    duplicate_window_s: float = 120.0

    def config(self) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=self.subjects,
            retention=self.retention,
            storage=StorageType.FILE,
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
]


async def connect(url: str, name: str) -> NATS:
    """Connect with unlimited reconnects: the services ride out a NATS restart."""

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

    return await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
    )


async def ensure_streams(js: JetStreamContext) -> None:
    """Create or update every Kestrel stream; idempotent."""
    for spec in STREAMS:
        cfg = spec.config()
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


def message_class(full_name: str) -> type[Message] | None:
    """The generated class for `kestrel.v1.<Message>` (any file in kestrel/v1)."""
    if not full_name.startswith("kestrel.v1."):
        return None
    short = full_name.removeprefix("kestrel.v1.")
    for module in (events_pb2, meter_pb2, common_pb2, admission_pb2):
        cls = getattr(module, short, None)
        if isinstance(cls, type) and issubclass(cls, Message):
            return cls
    from kestrel.v1 import autoscaler_pb2, gateway_pb2, placer_pb2, worker_pb2

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
