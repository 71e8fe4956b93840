"""Leader election through a Kubernetes Lease (coordination.k8s.io/v1), so that of two
processes doing the same job only one acts (the autoscaler: two would fight over the
replica counts).

The rule is client-go's leaderelection: a candidate takes the Lease when nobody holds
it or its holder has not renewed it within leaseDurationSeconds; the holder renews it
every `renew_s`. Every write carries the resourceVersion it read, so of two
candidates racing for an expired Lease the apiserver lets exactly one win (the other
gets 409 Conflict and stays a follower). A holder that cannot renew before its own
lease would expire stops leading first: it never acts on a Lease another may hold.

`decide` is the pure part (the Lease's fields and the clock in, what to do out);
`Elector` does the calls in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("kestrel.lease")


class Step(enum.Enum):
    TAKE = "take"  # nobody holds it, or its holder let it expire: try to take it
    RENEW = "renew"  # we hold it: renew
    FOLLOW = "follow"  # another holds it and renews it: wait


@dataclass(frozen=True)
class Seen:
    """What a candidate read of the Lease (None fields: not set)."""

    holder: str | None
    renewed_at: float | None  # seconds since the epoch
    duration_s: int | None


def decide(seen: Seen | None, identity: str, now: float) -> Step:
    if seen is None or not seen.holder:
        return Step.TAKE
    if seen.holder == identity:
        return Step.RENEW
    if seen.renewed_at is None or seen.duration_s is None:
        return Step.TAKE
    return Step.TAKE if now > seen.renewed_at + seen.duration_s else Step.FOLLOW


def identity() -> str:
    """A candidate's name in the Lease: host (the pod's name), process, and a nonce (a
    restarted process is another candidate)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """Holds `leading` true while this process holds the Lease `namespace/name`."""

    def __init__(self, api: Any, name: str, namespace: str, identity: str,
                 duration_s: int = 5, renew_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client as k8s

        self.leases: Any = k8s.CoordinationV1Api(api)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.duration_s, self.renew_s, self.clock = duration_s, renew_s, clock
        self.leading = False
        self.renewed_at = 0.0  # our last successful take or renewal (monotonic)
        self.transitions = 0

    def _body(self, now: float, transitions: int, acquired: str | None,
              resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": self.duration_s,
                         "acquireTime": acquired or _micro(now), "renewTime": _micro(now),
                         "leaseTransitions": transitions}}

    def attempt(self) -> bool:
        """One read and at most one write (blocking); True while we lead."""
        from kubernetes.client.exceptions import ApiException

        now = self.clock()
        try:
            lease = self.leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.leases.create_namespaced_lease(
                    self.namespace, self._body(now, 0, None, None))
                return True
            except ApiException as exc2:
                if exc2.status == 409:  # another candidate created it first
                    return False
                raise
        spec = lease.spec
        renewed = spec.renew_time.timestamp() if spec.renew_time else None
        seen = Seen(spec.holder_identity, renewed, spec.lease_duration_seconds)
        step = decide(seen, self.identity, now)
        if step is Step.FOLLOW:
            return False
        transitions = int(spec.lease_transitions or 0) + (step is Step.TAKE)
        acquired = (spec.acquire_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    if step is Step.RENEW and spec.acquire_time else None)
        try:
            self.leases.replace_namespaced_lease(
                self.name, self.namespace,
                self._body(now, transitions, acquired, lease.metadata.resource_version))
        except ApiException as exc:
            if exc.status == 409:  # someone wrote it since we read it: they won
                return False
            raise
        self.transitions = transitions
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            try:
                leading = await asyncio.to_thread(self.attempt)
                if leading:
                    self.renewed_at = now
            except Exception as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                # The apiserver did not answer: lead on only while our last renewal is
                # fresh, stopping a second before another could take the Lease.
                leading = self.leading and now - self.renewed_at < self.duration_s - 1
            if leading != self.leading:
                log.info("lease %s/%s: %s", self.namespace, self.name,
                         "leading" if leading else "following")
            self.leading = leading
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_s)

    def release(self) -> None:
        """On a clean stop: give the Lease up so a follower takes over at once."""
        if not self.leading:
            return
        try:
            lease = self.leases.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                self.leases.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as exc:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, exc)
        self.leading = False


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def while_leading(elector: Elector, stop: asyncio.Event,
                        work: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
                        poll_s: float = 0.1) -> None:
    """Run `work(until)` each time `elector` comes to lead, until `stop`. When it stops
    leading (or on `stop`), `until` is set and the work's end awaited before this
    process may lead again: a standby keeps everything else warm and does only this
    part while it holds the Lease. A work that fails is logged and started again on
    a second while still leading."""
    while not stop.is_set():
        if not elector.leading:
            await _wait(stop, poll_s)
            continue
        until = asyncio.Event()
        task = asyncio.create_task(work(until), name=f"leading-{elector.name}")
        while elector.leading and not stop.is_set() and not task.done():
            await _wait(stop, poll_s)
        until.set()
        try:
            await task
        except Exception:
            log.exception("lease %s/%s: the leader's work failed; again in 1 s",
                          elector.namespace, elector.name)
            await _wait(stop, 1.0)
