"""Batch assembly, pure: which queued requests run next, which are dropped as expired.

A replica holds the requests it has read (pending in Redis under its name) and asks
`plan_batch` for the next batch, the way Ray Serve's `_BatchQueue` or Triton's dynamic
batcher do, with priorities and deadlines added:

- a request whose deadline has passed is dropped, never computed (its caller has
  already been answered DEADLINE_EXCEEDED by the gateway);
- a request that has waited `starve_after_us` or more goes first, oldest first,
  whatever its priority (the starvation guard);
- then higher priority first, first come first within a priority;
- up to `max_batch` texts; a single request larger than that runs alone.

`ready` says when to run: `max_batch` texts are waiting, or the first of them has
waited `max_wait_us` in this replica (Triton's max_queue_delay, Ray Serve's
batch_wait_timeout_s). The clock is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kestrel.endpoints import Priority

P = TypeVar("P")


@dataclass(frozen=True)
class Queued(Generic[P]):
    key: str  # unique per request in this replica (stream entry)
    priority: Priority
    enqueued_us: int  # when the gateway queued it
    deadline_us: int  # 0: none
    texts: int
    seen_us: int  # when this replica read it
    payload: P = field(compare=False, repr=False)


@dataclass(frozen=True)
class BatchPolicy:
    max_batch: int = 32
    max_wait_us: int = 5_000
    starve_after_us: int = 250_000

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_wait_us < 0 or self.starve_after_us < 0:
            raise ValueError(f"invalid batch policy {self}")


@dataclass(frozen=True)
class Plan(Generic[P]):
    batch: list[Queued[P]]
    expired: list[Queued[P]]
    rest: list[Queued[P]]


def expired(q: Queued[P], now_us: int) -> bool:
    return q.deadline_us > 0 and q.deadline_us <= now_us


def order_key(q: Queued[P], now_us: int, policy: BatchPolicy) -> tuple[int, int, int]:
    starving = now_us - q.enqueued_us >= policy.starve_after_us
    return (0, 0, q.enqueued_us) if starving else (1, -int(q.priority), q.enqueued_us)


def plan_batch(queued: Sequence[Queued[P]], now_us: int, policy: BatchPolicy) -> Plan[P]:
    dead = [q for q in queued if expired(q, now_us)]
    live = sorted((q for q in queued if not expired(q, now_us)),
                  key=lambda q: order_key(q, now_us, policy))
    batch: list[Queued[P]] = []
    texts = 0
    for i, q in enumerate(live):
        if batch and texts + q.texts > policy.max_batch:
            return Plan(batch, dead, live[i:])
        batch.append(q)
        texts += q.texts
    return Plan(batch, dead, [])


def ready(queued: Sequence[Queued[P]], now_us: int, policy: BatchPolicy) -> bool:
    """Run now: a full batch waits, or the first request has waited max_wait_us here."""
    if not queued:
        return False
    if sum(q.texts for q in queued) >= policy.max_batch:
        return True
    return now_us - min(q.seen_us for q in queued) >= policy.max_wait_us


def wait_left_us(queued: Sequence[Queued[P]], now_us: int, policy: BatchPolicy) -> int:
    """How much longer to wait for a fuller batch (0: run now)."""
    if not queued or ready(queued, now_us, policy):
        return 0
    return policy.max_wait_us - (now_us - min(q.seen_us for q in queued))
