"""Transport: one replica's loop over Redis streams.

Reads its endpoint's three priority streams with the consumer group `workers` (one
consumer per replica), holds what it read (pending under its name), asks the pure
`batching.plan_batch` what to run, runs the model in a thread, and for each request
sends the reply to the gateway's stream, then acknowledges and deletes the entry (in
one MULTI). A replica that dies leaves its entries pending: a live replica claims
those whose owner has stopped heartbeating once they are `claim_idle_ms` idle, so each
request is answered or expires (the gateway answers DEADLINE_EXCEEDED at its deadline).
A reply sent twice (a replica killed between reply and ack) is read once by the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from kestrel import endpoints as ep
from kestrel.clock import now_us as wall_us
from kestrel_sdk.v1 import worker_pb2
from services.worker.batching import BatchPolicy, Queued, plan_batch, ready, wait_left_us
from services.worker.metrics import WorkerMetrics
from services.worker.model import Embedded

log = logging.getLogger("kestrel.worker")
Item = Queued[worker_pb2.WorkerRequest]
EmbedFn = Callable[[list[str]], Embedded]


@dataclass(frozen=True)
class ReplicaSettings:
    tenant: str
    endpoint_id: str
    replica: str
    policy: BatchPolicy
    claim_idle_ms: int = 2_000
    heartbeat_s: float = 1.0
    # A host process standing in for a simulated (KWOK) GPU replica: says so in every
    # reply and heartbeat.
    simulated: bool = False


@dataclass
class Stats:
    served: int = 0
    batches: int = 0
    expired: int = 0
    texts: int = 0
    last_batch: int = 0
    latencies_ms: list[float] | None = None
    busy_s: float = 0.0  # seconds in the model (batches that answered)


class Replica:
    def __init__(self, redis: aioredis.Redis, settings: ReplicaSettings, embed: EmbedFn,
                 metrics: WorkerMetrics, clock: Callable[[], int] = wall_us) -> None:
        self.redis = redis
        self.s = settings
        self.embed = embed
        self.metrics = metrics
        self.clock = clock
        self.streams = {p: ep.request_stream(settings.endpoint_id, p) for p in ep.PRIORITIES}
        self.held: dict[str, Item] = {}  # "<stream> <entry id>" -> request
        self.stats = Stats(latencies_ms=[])

    # --- set-up --------------------------------------------------------------

    async def ensure_groups(self) -> None:
        for stream in self.streams.values():
            try:
                await self.redis.xgroup_create(stream, ep.GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # --- reading -------------------------------------------------------------

    def _hold(self, stream: str, entries: Any, priority: ep.Priority) -> int:
        n = 0
        now = self.clock()
        for entry_id, fields in entries:
            key = f"{stream} {entry_id.decode()}"
            if key in self.held or fields is None:
                continue
            try:
                req = worker_pb2.WorkerRequest.FromString(fields.get(ep.FIELD, b""))
            except Exception:
                req = worker_pb2.WorkerRequest()
            self.held[key] = Queued(key, priority, req.enqueued_us or now, req.deadline_us,
                                    max(1, len(req.inputs)), now, req)
            n += 1
        return n

    def _held_of(self, priority: ep.Priority) -> int:
        return sum(1 for q in self.held.values() if q.priority == priority)

    async def fill(self, block_ms: int) -> int:
        """Read what each priority's share of the buffer allows, highest first; block up to
        block_ms on all streams when nothing came."""
        got = 0
        cap = self.s.policy.max_batch
        for p, stream in self.streams.items():
            want = cap - self._held_of(p)
            if want <= 0:
                continue
            resp: Any = await self.redis.xreadgroup(ep.GROUP, self.s.replica, {stream: ">"},
                                                    count=want)
            for _, entries in resp or ():
                got += self._hold(stream, entries, p)
        if got or block_ms <= 0:
            return got
        resp = await self.redis.xreadgroup(
            ep.GROUP, self.s.replica, {s: ">" for s in self.streams.values()}, count=cap,
            block=block_ms)
        by_name = {s: p for p, s in self.streams.items()}
        for name, entries in resp or ():
            stream = name.decode() if isinstance(name, bytes) else name
            got += self._hold(stream, entries, by_name[stream])
        return got

    # --- running -------------------------------------------------------------

    async def step(self) -> bool:
        """Plan and run one batch of what is held; False when nothing was held."""
        now = self.clock()
        plan = plan_batch(list(self.held.values()), now, self.s.policy)
        if plan.expired:
            await self._finish([(q, None) for q in plan.expired])
            self.stats.expired += len(plan.expired)
            self.metrics.requests("expired", len(plan.expired))
        if not plan.batch:
            return bool(plan.expired)
        texts = [t for q in plan.batch for t in q.payload.inputs]
        started = self.clock()
        for q in plan.batch:
            self.metrics.queue_wait(q.priority.label, max(0, started - q.enqueued_us) / 1e6)
        t0 = time.perf_counter()
        try:
            out: Embedded | None = await asyncio.get_running_loop().run_in_executor(
                None, self._embed_chunks, texts)
            error = ""
        except Exception as exc:  # the model failed: each caller gets a clear error
            log.exception("batch of %d texts failed", len(texts))
            out, error = None, f"the model failed on this batch: {type(exc).__name__}"
        took = time.perf_counter() - t0
        self.metrics.inference.observe(took)
        self.metrics.batch_size.observe(len(texts))
        replies: list[tuple[Item, worker_pb2.WorkerReply | None]] = []
        at = 0
        for q in plan.batch:
            n = len(q.payload.inputs)
            reply = worker_pb2.WorkerReply(
                request_id=q.payload.request_id, model=ep.MODEL_NAME, latency_ms=took * 1e3,
                replica=self.s.replica, error=error, max_input_tokens=ep.MAX_INPUT_TOKENS,
                queue_ms=max(0, started - q.enqueued_us) / 1e3, simulated=self.s.simulated)
            if out is not None:
                reply.embeddings.extend(worker_pb2.WorkerEmbedding(values=v.tolist())
                                        for v in out.vectors[at:at + n])
                reply.truncated.extend(i for i in range(n) if out.truncated[at + i])
                reply.input_tokens = sum(out.tokens[at:at + n])
            at += n
            replies.append((q, reply))
        await self._finish(replies)
        self.stats.batches += 1
        self.stats.last_batch = len(texts)
        self.stats.texts += len(texts)
        if error:
            self.metrics.requests("failed", len(plan.batch))
        else:
            self.stats.served += len(plan.batch)
            self.stats.busy_s += took
            self.metrics.requests("served", len(plan.batch))
            self.metrics.embeddings.inc(len(texts))
        lat = self.stats.latencies_ms
        if lat is not None:
            lat.append(took * 1e3)
            del lat[:-200]
        return True

    def _embed_chunks(self, texts: list[str]) -> Embedded:
        """One request larger than max_batch runs as several model calls."""
        size = self.s.policy.max_batch
        if len(texts) <= size:
            return self.embed(texts)
        parts = [self.embed(texts[i:i + size]) for i in range(0, len(texts), size)]
        import numpy as np
        return Embedded(np.concatenate([p.vectors for p in parts]),
                        [t for p in parts for t in p.truncated],
                        [t for p in parts for t in p.tokens])

    async def _finish(self, done: list[tuple[Item, worker_pb2.WorkerReply | None]]) -> None:
        """Replies first, then XACK + XDEL, in one transaction: a crash before it leaves
        the entries pending (claimed later); after it, nothing is left to redo."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for q, reply in done:
                if reply is not None and q.payload.reply_to:
                    pipe.xadd(q.payload.reply_to, {ep.FIELD: reply.SerializeToString()},
                              maxlen=ep.REPLY_STREAM_MAXLEN, approximate=True)
                    pipe.expire(q.payload.reply_to, ep.REPLY_STREAM_TTL_S)
                stream, entry_id = q.key.split(" ", 1)
                pipe.xack(stream, ep.GROUP, entry_id)
                pipe.xdel(stream, entry_id)
            await pipe.execute()
        for q, _ in done:
            self.held.pop(q.key, None)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.fill(block_ms=0 if self.held else 100)
                now = self.clock()
                while self.held and not ready(list(self.held.values()), now, self.s.policy):
                    left_ms = max(1, wait_left_us(list(self.held.values()), now,
                                                  self.s.policy) // 1000)
                    await self.fill(block_ms=int(left_ms))
                    now = self.clock()
                await self.step()
            except (RedisError, OSError) as exc:
                log.warning("redis: %s; retrying", exc)
                await asyncio.sleep(0.5)
        # Drain: what this replica holds is answered before it goes.
        with contextlib.suppress(RedisError, OSError):
            while self.held and await self.step():
                pass

    # --- heartbeats and take-over ---------------------------------------------

    def heartbeat_message(self) -> worker_pb2.WorkerHeartbeat:
        st = self.stats
        lat = sorted(st.latencies_ms or [0.0])
        return worker_pb2.WorkerHeartbeat(
            replica=self.s.replica, endpoint_id=self.s.endpoint_id, tenant=self.s.tenant,
            time_us=self.clock(), batch_size=st.last_batch,
            p95_ms=lat[min(len(lat) - 1, int(0.95 * len(lat)))], served=st.served,
            batches=st.batches, expired=st.expired,
            mean_batch_size=st.texts / st.batches if st.batches else 0.0,
            simulated=self.s.simulated, busy_s=st.busy_s)

    async def beat(self) -> None:
        await self.redis.hset(ep.replicas_key(self.s.endpoint_id), self.s.replica,
                              self.heartbeat_message().SerializeToString())
        self.metrics.heartbeat.set(time.time())

    async def live_replicas(self) -> set[str]:
        raw: Any = await self.redis.hgetall(ep.replicas_key(self.s.endpoint_id))
        now = self.clock()
        live = set()
        for name, value in raw.items():
            with contextlib.suppress(Exception):
                hb = worker_pb2.WorkerHeartbeat.FromString(value)
                if ep.heartbeat_fresh(hb.time_us, now, self.s.heartbeat_s):
                    live.add(name.decode())
        return live

    async def claim_orphans(self) -> int:
        """Take over entries pending under replicas that stopped heartbeating."""
        live = await self.live_replicas() | {self.s.replica}
        taken = 0
        for p, stream in self.streams.items():
            pending: Any = await self.redis.xpending_range(
                stream, ep.GROUP, min="-", max="+", count=500, idle=self.s.claim_idle_ms)
            ids = [e["message_id"] for e in pending
                   if (e["consumer"].decode() if isinstance(e["consumer"], bytes)
                       else e["consumer"]) not in live]
            if not ids:
                continue
            claimed: Any = await self.redis.xclaim(stream, ep.GROUP, self.s.replica,
                                              self.s.claim_idle_ms, ids)
            entries = [(i, f) for i, f in claimed if f is not None]
            gone = [i for i, f in claimed if f is None]  # deleted meanwhile: forget them
            if gone:
                await self.redis.xack(stream, ep.GROUP, *gone)
            n = self._hold(stream, entries, p)
            taken += n
        if taken:
            self.metrics.claimed.inc(taken)
            log.info("claimed %d requests of replicas that stopped heartbeating", taken)
        await self._forget_dead(live)
        return taken

    async def _forget_dead(self, live: set[str]) -> None:
        """Drop group consumers of dead replicas once nothing is pending under them, and
        their heartbeats once a minute old: neither grows with every restart."""
        for stream in self.streams.values():
            consumers: Any = await self.redis.xinfo_consumers(stream, ep.GROUP)
            for c in consumers:
                name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                if name not in live and not c["pending"] and c["idle"] > self.s.claim_idle_ms:
                    await self.redis.xgroup_delconsumer(stream, ep.GROUP, name)
        raw: Any = await self.redis.hgetall(ep.replicas_key(self.s.endpoint_id))
        now = self.clock()
        for name, value in raw.items():
            with contextlib.suppress(Exception):
                if now - worker_pb2.WorkerHeartbeat.FromString(value).time_us > 60_000_000:
                    await self.redis.hdel(ep.replicas_key(self.s.endpoint_id), name)

    async def leave(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.redis.hdel(ep.replicas_key(self.s.endpoint_id), self.s.replica)
