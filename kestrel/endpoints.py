"""What the gateway and the model workers agree on in Redis: key names, priority classes,
and what makes a replica ready. Payloads are kestrel.v1.Worker* messages (worker.proto).

- `kestrel:ep:<endpoint>:requests:<low|normal|high>`: a stream per endpoint and priority;
  field `m` holds a WorkerRequest. Consumer group `workers`, one consumer per replica.
- `kestrel:gw:<gateway>:replies`: the stream of one gateway process; field `m` holds a
  WorkerReply. One reader task per gateway resolves the waiting calls.
- `kestrel:ep:<endpoint>:replicas`: a hash, field per replica, a WorkerHeartbeat.

And what one replica of an endpoint holds, which the gateway (admitting replicas)
and the autoscaler (pricing them) must agree on: `units_of`, `horizon_of`.
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING

from kestrel.workloads import CPU_FLAVOR

if TYPE_CHECKING:
    from kestrel_sdk.v1 import common_pb2

GROUP = "workers"
FIELD = b"m"
# Replies a gateway has not read within this long are dropped with its stream.
REPLY_STREAM_TTL_S = 120
REPLY_STREAM_MAXLEN = 20_000
# The model's limit (all-MiniLM-L6-v2 was trained on 256 word pieces, [CLS] and [SEP]
# included); longer inputs are cut, and the reply says which.
MAX_INPUT_TOKENS = 256
MAX_TEXTS = 256
# \Z, not $: "$" also matches before a trailing newline (see services/gateway/validation).
ENDPOINT_ID_RE = re.compile(r"^ep-[0-9a-f]{16}\Z")
MODEL_NAME = "all-MiniLM-L6-v2"


class Priority(enum.IntEnum):
    """kestrel.v1.InferPriority without UNSPECIFIED (which is NORMAL)."""

    LOW = 1
    NORMAL = 2
    HIGH = 3

    @classmethod
    def of_wire(cls, value: int) -> Priority:
        return cls.NORMAL if value == 0 else cls(value)

    @property
    def label(self) -> str:
        return self.name.lower()


# Highest first: the order a replica reads its streams in.
PRIORITIES = (Priority.HIGH, Priority.NORMAL, Priority.LOW)


def request_stream(endpoint_id: str, priority: Priority) -> str:
    return f"kestrel:ep:{endpoint_id}:requests:{priority.label}"


def replicas_key(endpoint_id: str) -> str:
    return f"kestrel:ep:{endpoint_id}:replicas"


def reply_stream(gateway_id: str) -> str:
    return f"kestrel:gw:{gateway_id}:replies"


def heartbeat_fresh(time_us: int, now_us: int, heartbeat_s: float) -> bool:
    """A replica is ready while its last heartbeat is under three intervals old."""
    return now_us - time_us <= int(3 * heartbeat_s * 1e6)


# An endpoint that names no horizon reserves ten minutes of its replicas.
DEFAULT_HORIZON_S = 600


def units_of(spec: common_pb2.EndpointSpec) -> int:
    """What one replica holds: a core of the CPU pool, or its GPUs on a GPU flavor."""
    return 1 if spec.flavor == CPU_FLAVOR else max(1, spec.gpus_per_replica)


def horizon_of(spec: common_pb2.EndpointSpec) -> int:
    """Seconds of spend each replica holds as its rolling reservation."""
    return int(spec.reservation_horizon_s or DEFAULT_HORIZON_S)
