"""Calls to another service gathered into batches while earlier ones are in flight.

The gateway's submits each cost admission a gRPC call, a ledger snapshot and an insert;
under load, most of that is per call rather than per job. A `Batcher` sends an item at
once when nothing is waiting (no added latency alone), and otherwise sends, as soon as
one of its `max_in_flight` batches comes back, everything that arrived meanwhile, up to
`max_batch` items and `max_bytes` of them (an item larger than that goes alone): the
group commit of databases, applied to a call. How large batches get follows the load
by itself.

With `patience_s`, a batch goes while another is out only once every batch out has
been out that long: one call at a time while calls answer quickly, so that a batch
carries everything that arrived meanwhile and the far side pays its per-call cost
once; more calls (up to `max_in_flight`) when one is slow, so that one slow call (a
tenant's lock held at admission) does not hold every later item behind it.

Each caller gets its own item's result or exception. A caller that goes away (its RPC
cancelled) before its item left takes the item out; once sent, the item is decided all
the same and its result is dropped, exactly as a cancelled single call would leave it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# send(items, timeout_s) -> one result or exception per item, in order.
Send = Callable[[list[T], float], Awaitable[Sequence["R | Exception"]]]


@dataclass
class _Entry(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    deadline: float  # loop time


class Batcher(Generic[T, R]):
    def __init__(self, send: Send[T, R], *, max_batch: int = 128, max_in_flight: int = 2,
                 patience_s: float | None = None,
                 size: Callable[[T], int] = lambda item: 0, max_bytes: int = 0) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        if patience_s is not None and patience_s < 0:
            raise ValueError("patience_s must not be negative")
        self.send = send
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.patience_s = patience_s
        self.size = size  # of an item, in bytes: with max_bytes > 0, bounds a batch
        self.max_bytes = max_bytes
        self.waiting: list[_Entry[T, R]] = []
        self.in_flight = 0
        self._sent_at: list[float] = []  # loop time each batch out was sent at
        self._patience: asyncio.TimerHandle | None = None  # pumps once patience runs out
        self._pump_soon = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, item: T, timeout_s: float) -> R:
        """`item`'s result, sent alone or with others; `timeout_s` bounds the call that
        carries it (a batch waits for the latest deadline among its items)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        entry = _Entry(item, future, loop.time() + timeout_s)
        self.waiting.append(entry)
        if not self._pump_soon:  # items arriving in this turn of the loop go together
            self._pump_soon = True
            loop.call_soon(self._pump)
        try:
            return await future
        except asyncio.CancelledError:
            if entry in self.waiting:  # not sent: it never will be
                self.waiting.remove(entry)
            raise

    def _pump(self) -> None:
        self._pump_soon = False
        loop = asyncio.get_running_loop()
        while self.waiting and self.in_flight < self.max_in_flight:
            if self.patience_s is not None and self._sent_at:
                ready = max(self._sent_at) + self.patience_s
                if loop.time() < ready:  # the batches out may yet answer: wait for them
                    if self._patience is not None:
                        self._patience.cancel()
                    self._patience = loop.call_at(ready, self._pump)
                    return
            n, total = 0, 0
            while n < min(self.max_batch, len(self.waiting)):
                if self.max_bytes > 0:
                    total += self.size(self.waiting[n].item)
                    if total > self.max_bytes and n > 0:
                        break
                n += 1
            batch, self.waiting = self.waiting[:n], self.waiting[n:]
            self.in_flight += 1
            sent_at = loop.time()
            self._sent_at.append(sent_at)
            task = loop.create_task(self._send(batch, sent_at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Entry[T, R]], sent_at: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            timeout = max(e.deadline for e in batch) - loop.time()
            results = await self.send([e.item for e in batch], max(timeout, 0.001))
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} came back with "
                                   f"{len(results)} results")
            for e, r in zip(batch, results, strict=True):
                if e.future.done():  # its caller went away
                    continue
                if isinstance(r, Exception):
                    e.future.set_exception(r)
                else:
                    e.future.set_result(r)
        except Exception as exc:  # the call itself failed: every item with it
            for e in batch:
                if not e.future.done():
                    e.future.set_exception(copy.copy(exc))
        finally:
            for e in batch:  # cancelled mid-call (shutting down): its callers too
                if not e.future.done():
                    e.future.cancel()
            self.in_flight -= 1
            self._sent_at.remove(sent_at)
            self._pump()
