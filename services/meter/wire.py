"""Conversions between protobuf wire types and the meter's domain types."""

from __future__ import annotations

import math

from kestrel_sdk.money import fmt
from kestrel_sdk.v1 import common_pb2, events_pb2, meter_pb2
from services.meter.domain import Event, EventType, Reason, Row, RunwayFigures


class BadEvent(ValueError):
    """A workload event the meter cannot meter; it is parked, not retried."""


# Bounds of a meterable event: instants between 2001 and 2286 in microseconds (outside
# is a unit mistake: seconds or ns), at most MAX_GPUS GPUs. Together they keep every
# row in range: gpus x (end_us - start_us) < 1024 x 9e15 < 2**63, the ledger's bigint.
# (An ADMITTED event of 2**31-1 GPUs at time_us=1 passed before: its first tick
# overflowed gpu_us, the tick transaction failed, and no tenant's usage was metered
# again.)
MIN_US, MAX_US = 1_000_000_000_000_000, 9_999_999_999_999_999
MAX_GPUS = 1024
MAX_BOUND_S = 10 * 366 * 86_400
_TYPES = frozenset(int(t) for t in EventType)


def event_from_wire(msg: events_pb2.WorkloadEvent) -> Event:
    problems = []
    if not msg.event_id:
        problems.append("event_id is empty")
    if not msg.tenant:
        problems.append("tenant is empty")
    if not msg.workload_id:
        problems.append("workload_id is empty")
    if msg.type not in _TYPES:
        problems.append(f"type {msg.type} is unknown")
    if not MIN_US <= msg.time_us <= MAX_US:
        problems.append("time_us must be microseconds since the epoch (2001..2286)")
    if int(msg.type) == int(EventType.ADMITTED) and msg.gpus <= 0:
        problems.append("an admission needs gpus > 0")
    if not 0 <= msg.gpus <= MAX_GPUS:
        problems.append(f"gpus must be between 0 and {MAX_GPUS}")
    if problems:
        raise BadEvent("; ".join(problems))
    if not 0 <= msg.max_duration_s <= MAX_BOUND_S:
        raise BadEvent(f"max_duration_s must be between 0 and {MAX_BOUND_S}")
    return Event(msg.event_id, msg.tenant, msg.workload_id, int(msg.kind),
                 EventType(msg.type), msg.time_us, msg.flavor, msg.gpus, msg.max_duration_s)


def _finite(seconds: float) -> float:
    return 0.0 if math.isinf(seconds) else seconds


def runway_to_wire(f: RunwayFigures) -> common_pb2.Runway:
    b = f.budget
    return common_pb2.Runway(
        tenant=f.tenant, credits=fmt(b.credits), charged=fmt(b.charged),
        reserved=fmt(b.reserved), remaining=fmt(b.remaining), burn_per_s=fmt(b.burn_per_s),
        runway_s=_finite(b.runway_s), unlimited=b.unlimited,
        running_gpus=f.running_gpus, as_of_us=f.as_of_us, ledger_seq=f.ledger_seq,
        remaining_bp=b.remaining_bp, money_runway_s=_finite(b.money_runway_s),
        free_to_reserve=fmt(b.free_to_reserve), meter_version=f.meter_version)


def runway_changed(f: RunwayFigures, reason: Reason, committed_us: int) -> events_pb2.RunwayChanged:
    return events_pb2.RunwayChanged(runway=runway_to_wire(f), reason=int(reason),  # type: ignore[arg-type]
                                    committed_us=committed_us)


def row_to_wire(row_id: int, r: Row, recorded_us: int) -> meter_pb2.UsageRow:
    return meter_pb2.UsageRow(
        row_id=row_id, tenant=r.tenant, workload_id=r.workload_id, flavor=r.flavor,
        gpus=r.gpus, start_us=r.start_us, end_us=r.end_us, gpu_us=r.gpu_us,
        price_per_gpu_s=fmt(r.price), cost=fmt(r.cost), cause_id=r.cause_id,
        recorded_us=recorded_us)
