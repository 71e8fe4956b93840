"""Endpoints and Infer in the SDK's own types (kestrel.v1 endpoint messages at the edge)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from kestrel_sdk.v1 import common_pb2, gateway_pb2


class Priority(enum.IntEnum):
    """kestrel.v1.InferPriority: a replica serves HIGH first (with a starvation guard)."""

    LOW = 1
    NORMAL = 2
    HIGH = 3

    @classmethod
    def parse(cls, value: Priority | str | int) -> Priority:
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"unknown priority {value!r}: low, normal or high") from None
        return cls(value)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    endpoint_id: str
    tenant: str
    name: str
    model: str
    flavor: str
    min_replicas: int
    max_replicas: int
    replicas: int
    ready_replicas: int
    reason: str
    created_us: int
    # Replicas are simulated GPU replicas (KWOK pods, each answered by a host stand-in).
    simulated: bool = False
    # Other flavors it may run on (the autoscaler chooses the mix), and replicas and
    # ready replicas per flavor.
    flavors: tuple[str, ...] = ()
    flavor_replicas: Mapping[str, int] = dataclasses.field(default_factory=dict)
    flavor_ready: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def created_at(self) -> datetime | None:
        return datetime.fromtimestamp(self.created_us / 1e6, tz=UTC) if self.created_us else None

    @classmethod
    def from_pb(cls, m: common_pb2.Endpoint) -> Endpoint:
        return cls(m.endpoint_id, m.tenant, m.spec.name, m.spec.model, m.spec.flavor,
                   m.spec.min_replicas, m.spec.max_replicas, m.replicas, m.ready_replicas,
                   m.reason, m.created_us, m.simulated, tuple(m.spec.flavors),
                   dict(sorted(m.flavor_replicas.items())),
                   dict(sorted(m.flavor_ready.items())))


@dataclasses.dataclass(frozen=True)
class InferResult:
    """One vector per input (unit length, 384 floats); `truncated` holds the indexes of
    inputs cut at `max_input_tokens` word pieces."""

    embeddings: list[list[float]]
    model: str
    replica: str
    latency_ms: float
    queue_ms: float
    truncated: list[int]
    max_input_tokens: int
    # Served by a host stand-in for a simulated (KWOK) GPU replica.
    simulated: bool = False

    @classmethod
    def from_pb(cls, m: gateway_pb2.InferResponse) -> InferResult:
        return cls([list(e.values) for e in m.embeddings], m.model, m.replica, m.latency_ms,
                   m.queue_ms, list(m.truncated), m.max_input_tokens, m.simulated)


def create_endpoint_request(name: str, *, min_replicas: int = 0, max_replicas: int = 1,
                            flavor: str = "", model: str = "", horizon_s: int = 0,
                            warm_pool: int = 0, flavors: Sequence[str] = (),
                            target_p95_ms: int = 0, missed_slo_value_per_s: str = ""
                            ) -> gateway_pb2.CreateEndpointRequest:
    if isinstance(flavors, str):
        raise TypeError("flavors is a list of flavor names, not one string")
    return gateway_pb2.CreateEndpointRequest(spec=common_pb2.EndpointSpec(
        name=name, model=model, flavor=flavor, min_replicas=min_replicas,
        max_replicas=max_replicas, reservation_horizon_s=horizon_s, warm_pool=warm_pool,
        flavors=list(flavors), target_p95_ms=target_p95_ms,
        missed_slo_value_per_s=missed_slo_value_per_s))


def infer_request(endpoint_id: str, inputs: Sequence[str], priority: Priority | str | int,
                  timeout_s: float | None) -> gateway_pb2.InferRequest:
    if isinstance(inputs, str):
        raise TypeError("inputs is a list of texts, not one string")
    return gateway_pb2.InferRequest(
        endpoint_id=endpoint_id, inputs=list(inputs),
        priority=gateway_pb2.InferPriority.ValueType(int(Priority.parse(priority))),
        timeout_ms=int(timeout_s * 1000) if timeout_s else 0)


def call_timeout(default_s: float, timeout_s: float | None) -> float:
    """The gRPC deadline of an Infer: a little past the server's own wait, so the server's
    answer (DEADLINE_EXCEEDED or UNAVAILABLE, with its reason) arrives first."""
    return (timeout_s + 1.0) if timeout_s else max(default_s, 11.0)
