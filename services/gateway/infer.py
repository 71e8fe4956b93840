"""The gateway's half of Infer: enqueue on the endpoint's Redis stream, wait for the reply.

Replies come back on one Redis stream per gateway process, read by one task that
resolves a future per request (`ReplyHub`). Why not a list per request with BLPOP: a
blocked BLPOP holds a connection for the whole wait, so a bounded pool of 32 would cap
the gateway at 32 calls in flight (and starve the rate limiter that shares it); one
XREAD BLOCK per gateway holds one connection whatever the load, and a few hundred
replies per second arrive in batches of XREAD COUNT. A reply for a request no longer
waited for (timed out, or sent twice by a replica that died between reply and ack) is
dropped: each call is answered once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kestrel import endpoints as ep
from kestrel.clock import now_us
from kestrel.errors import DeadlineExceeded, NoReadyReplica, Unavailable
from kestrel_sdk.v1 import worker_pb2

log = logging.getLogger("kestrel.gateway.infer")
# Request streams are capped so that a stopped endpoint cannot fill Redis.
REQUEST_STREAM_MAXLEN = 100_000


@dataclass
class HubStats:
    replies: int = 0
    unclaimed: int = 0  # replies nobody waited for any more (late or duplicate)


class ReplyHub:
    """One reader of this gateway's reply stream; futures by request id."""

    def __init__(self, redis_url: str, gateway_id: str | None = None) -> None:
        self.gateway_id = gateway_id or uuid.uuid4().hex[:16]
        self.stream = ep.reply_stream(self.gateway_id)
        # Its own connection: the blocking read never takes one of the bounded pool's.
        self.redis = aioredis.Redis.from_url(redis_url, socket_connect_timeout=5.0)
        self.waiting: dict[str, asyncio.Future[worker_pb2.WorkerReply]] = {}
        self.stats = HubStats()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            await self.redis.delete(self.stream)
        await self.redis.aclose()

    def expect(self, request_id: str) -> asyncio.Future[worker_pb2.WorkerReply]:
        fut: asyncio.Future[worker_pb2.WorkerReply] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = fut
        return fut

    def forget(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)

    def deliver(self, data: bytes) -> None:
        try:
            reply = worker_pb2.WorkerReply.FromString(data)
        except Exception:
            return
        self.stats.replies += 1
        fut = self.waiting.pop(reply.request_id, None)
        if fut is None or fut.done():
            self.stats.unclaimed += 1
            return
        fut.set_result(reply)

    async def _read(self) -> None:
        last = "$"
        while True:
            try:
                resp: Any = await self.redis.xread({self.stream: last}, count=500, block=1000)
                ids = []
                for _, entries in resp or ():
                    for entry_id, fields in entries:
                        last = entry_id
                        ids.append(entry_id)
                        self.deliver(fields.get(ep.FIELD, b""))
                if ids:
                    await self.redis.xdel(self.stream, *ids)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("reply stream %s: %s; retrying", self.stream, exc)
                await asyncio.sleep(0.2)


async def live_replicas(redis: aioredis.Redis, endpoint_id: str, heartbeat_s: float) -> int:
    return len(await fresh_replicas(redis, endpoint_id, heartbeat_s))


async def fresh_replicas(redis: aioredis.Redis, endpoint_id: str,
                         heartbeat_s: float) -> set[str]:
    """Names of the replicas whose heartbeat is fresh (a placed replica's is its job id)."""
    raw: Any = await redis.hgetall(ep.replicas_key(endpoint_id))
    now = now_us()
    out: set[str] = set()
    for value in raw.values():
        with contextlib.suppress(Exception):
            hb = worker_pb2.WorkerHeartbeat.FromString(value)
            if ep.heartbeat_fresh(hb.time_us, now, heartbeat_s):
                out.add(hb.replica)
    return out


async def infer(redis: aioredis.Redis, hub: ReplyHub, *, tenant: str, endpoint_id: str,
                inputs: list[str], priority: ep.Priority, timeout_s: float,
                heartbeat_s: float) -> worker_pb2.WorkerReply:
    """Queue one request and wait for its reply until timeout_s; a request still queued
    then is skipped by the replicas (its deadline has passed)."""
    request_id = uuid.uuid4().hex
    enqueued = now_us()
    deadline = enqueued + int(timeout_s * 1e6)
    req = worker_pb2.WorkerRequest(
        request_id=request_id, endpoint_id=endpoint_id, inputs=inputs, reply_to=hub.stream,
        enqueued_us=enqueued, deadline_us=deadline, tenant=tenant, priority=int(priority))
    fut = hub.expect(request_id)
    try:
        try:
            await redis.xadd(ep.request_stream(endpoint_id, priority),
                             {ep.FIELD: req.SerializeToString()},
                             maxlen=REQUEST_STREAM_MAXLEN, approximate=True)
        except (RedisError, OSError, TimeoutError) as exc:
            raise Unavailable(f"the endpoint queue is busy or unreachable "
                              f"({type(exc).__name__}); retry", retry_after_s=0.5) from exc
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=timeout_s)
        except TimeoutError:
            pass
    finally:
        hub.forget(request_id)
    try:
        ready = await live_replicas(redis, endpoint_id, heartbeat_s)
    except (RedisError, OSError, TimeoutError):
        ready = 0
    if ready == 0:
        raise NoReadyReplica(f"endpoint {endpoint_id} has no ready replica; the request was "
                             f"not served within {timeout_s:.3g} s", retry_after_s=1.0)
    raise DeadlineExceeded(f"the request waited {timeout_s:.3g} s in endpoint "
                           f"{endpoint_id}'s queue and was not computed")


@dataclass
class InferBackend:
    """What the servicer's Infer needs: the bounded pool (to queue), the hub (to wait)."""

    redis: aioredis.Redis
    hub: ReplyHub
    heartbeat_s: float = 1.0

    async def ready_replicas(self, endpoint_id: str) -> set[str]:
        try:
            return await fresh_replicas(self.redis, endpoint_id, self.heartbeat_s)
        except (RedisError, OSError, TimeoutError):
            return set()

    async def infer(self, tenant: str, endpoint_id: str, inputs: list[str],
                    priority: ep.Priority, timeout_s: float) -> worker_pb2.WorkerReply:
        return await infer(self.redis, self.hub, tenant=tenant, endpoint_id=endpoint_id,
                           inputs=inputs, priority=priority, timeout_s=timeout_s,
                           heartbeat_s=self.heartbeat_s)
