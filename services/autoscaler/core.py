"""The live loop: every interval, and at once on every runway message, read each live
endpoint's load and its tenant's budget, decide (domain.decide) and apply a change
through kestrel.v1.Replicas, the gateway's internal service and the one write path for
replicas: each new one is admitted against the budget and placed on Kubernetes by the
placer like any job.

State kept between decisions is the autoscaler's own (windows, panic, last scale
instants); a restarted autoscaler starts its windows afresh, which can only delay a
scale-down (the stable window refills), never overspend: money rules every decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kestrel import endpoints as ep
from kestrel.clock import now_us
from kestrel_sdk.v1 import (
    autoscaler_pb2,
    common_pb2,
    events_pb2,
    meter_pb2,
    meter_pb2_grpc,
    replicas_pb2,
    replicas_pb2_grpc,
    worker_pb2,
)
from services.autoscaler.domain import Decision, Reason, ScaleInputs, ScaleState, decide
from services.autoscaler.inputs import (
    StreamReading,
    Windows,
    arrival_rps,
    flavors_of,
    inputs_for,
    measured_rps,
    mix_inputs_for,
    several_flavors,
    worst_p95,
)
from services.autoscaler.mix import MixDecision, MixState, decide_mix

log = logging.getLogger("kestrel.autoscaler")
Key = tuple[str, str]  # (tenant, endpoint id)
Publish = Callable[[events_pb2.EndpointScaled], Awaitable[None]]


@dataclass
class Track:
    """What the loop keeps of one endpoint."""

    state: ScaleState = field(default_factory=ScaleState)
    streams: Mapping[ep.Priority, StreamReading] | None = None
    read_at: float = 0.0
    last_up: float | None = None
    last_down: float | None = None
    decision: Decision | None = None
    inputs: ScaleInputs | None = None
    decided_us: int = 0
    applied: int = 0  # decisions that changed the replica count
    # An endpoint on several flavors: the cost-aware decision and its state.
    mix_state: MixState = field(default_factory=MixState)
    mix: MixDecision | None = None
    flavor_rps: dict[str, float] = field(default_factory=dict)


async def read_streams(redis: aioredis.Redis, endpoint_id: str
                       ) -> dict[ep.Priority, StreamReading]:
    out: dict[ep.Priority, StreamReading] = {}
    for p in ep.PRIORITIES:
        key = ep.request_stream(endpoint_id, p)
        try:
            info: Any = await redis.xinfo_stream(key)
            groups: Any = await redis.xinfo_groups(key)
        except RedisError:  # no stream yet: nothing ever asked at this priority
            out[p] = StreamReading(0, 0, 0)
            continue
        pending = sum(int(g.get("pending", 0)) for g in groups
                      if g.get("name") in (ep.GROUP, ep.GROUP.encode()))
        out[p] = StreamReading(int(info.get("length", 0)), pending,
                               int(info.get("entries-added", 0)))
    return out


async def read_heartbeats(redis: aioredis.Redis, endpoint_id: str, heartbeat_s: float
                          ) -> list[worker_pb2.WorkerHeartbeat]:
    """The heartbeats of the endpoint's replicas heartbeating now."""
    raw: Any = await redis.hgetall(ep.replicas_key(endpoint_id))
    now = now_us()
    out = []
    for value in raw.values():
        try:
            hb = worker_pb2.WorkerHeartbeat.FromString(value)
        except Exception:
            continue
        if ep.heartbeat_fresh(hb.time_us, now, heartbeat_s):
            out.append(hb)
    return out


async def read_p95(redis: aioredis.Redis, endpoint_id: str, heartbeat_s: float
                   ) -> float | None:
    """The worst p95 among the replicas heartbeating now (None: none served yet)."""
    return worst_p95(await read_heartbeats(redis, endpoint_id, heartbeat_s))


class Autoscaler:
    def __init__(self, replicas: replicas_pb2_grpc.ReplicasStub,
                 meter: meter_pb2_grpc.MeterStub, redis: aioredis.Redis, publish: Publish,
                 windows: Windows, heartbeat_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas = replicas
        self.meter = meter
        self.redis = redis
        self.publish = publish
        self.windows = windows
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.runways: dict[str, common_pb2.Runway] = {}
        self.prices: dict[str, Decimal] = {}
        self.tracks: dict[Key, Track] = {}
        self.wake = asyncio.Event()
        # Whether this process may act (the Lease's holder); always, without election.
        self.leading: Callable[[], bool] = lambda: True
        self.on_decision: Callable[[Key, Decision, bool], None] = lambda k, d, applied: None

    # --- inputs ---------------------------------------------------------------

    def runway_changed(self, runway: common_pb2.Runway) -> None:
        """A kestrel.runway.Runways listener: the tenant's newest figure."""
        self.runways[runway.tenant] = runway
        self.wake.set()

    async def refresh_prices(self) -> None:
        resp = await self.meter.ListPrices(meter_pb2.ListPricesRequest(), timeout=5)
        self.prices = {p.flavor: Decimal(p.price_per_gpu_s) for p in resp.prices}

    async def endpoints(self) -> list[common_pb2.Endpoint]:
        out: list[common_pb2.Endpoint] = []
        token = ""
        while True:
            resp = await self.replicas.ListLiveEndpoints(replicas_pb2.ListLiveEndpointsRequest(
                page_size=500, page_token=token), timeout=10)
            out += resp.endpoints
            token = resp.next_page_token
            if not token:
                return out

    # --- one round ------------------------------------------------------------

    async def round(self) -> int:
        """Decide for every live endpoint; returns how many changed size."""
        if not self.prices:
            await self.refresh_prices()
        live = await self.endpoints()
        seen: set[Key] = set()
        changed = 0
        for e in live:
            key = (e.tenant, e.endpoint_id)
            seen.add(key)
            if e.tenant not in self.runways:  # no budget known yet: never guess
                continue
            try:
                changed += await self.decide_one(key, e)
            except (grpc.aio.AioRpcError, RedisError, OSError) as err:
                log.warning("endpoint %s of %s: %s", e.endpoint_id, e.tenant, err)
        for gone in set(self.tracks) - seen:
            del self.tracks[gone]
        return changed

    async def decide_one(self, key: Key, e: common_pb2.Endpoint) -> int:
        t = self.tracks.setdefault(key, Track())
        now = self.clock()
        streams = await read_streams(self.redis, e.endpoint_id)
        rps = arrival_rps(t.streams, streams, now - t.read_at)
        t.streams, t.read_at = streams, now
        beats = await read_heartbeats(self.redis, e.endpoint_id, self.heartbeat_s)
        p95 = worst_p95(beats)
        if several_flavors(e.spec):
            return await self.decide_mix_one(key, e, t, streams, rps, p95, now,
                                             measured_rps(beats))
        inputs = inputs_for(e, streams, rps, p95, self.runways.get(e.tenant), self.prices,
                            self.windows, t.last_up, t.last_down)
        decision, t.state = decide(inputs, t.state, now)
        t.decision, t.inputs, t.decided_us = decision, inputs, now_us()
        t.mix = None
        applied = False
        if decision.target != inputs.current:
            resp = await self.replicas.ScaleEndpoint(replicas_pb2.ScaleEndpointRequest(
                tenant=e.tenant, endpoint_id=e.endpoint_id, replicas=decision.target,
                reason=str(decision.reason)), timeout=30)
            got = resp.endpoint.replicas
            applied = got != inputs.current
            if got > inputs.current:
                t.last_up = now
            elif got < inputs.current:
                t.last_down = now
            if resp.refusal:
                log.info("%s of %s: %d of %d replicas started: %s", e.endpoint_id, e.tenant,
                         got, decision.target, resp.refusal)
            log.info("%s of %s: %d -> %d replicas (%s)", e.endpoint_id, e.tenant,
                     inputs.current, got, decision.reason)
            t.applied += applied
            if applied:
                await self.publish(events_pb2.EndpointScaled(
                    tenant=e.tenant, endpoint=e.endpoint_id, from_replicas=inputs.current,
                    to_replicas=resp.endpoint.replicas, reason=str(decision.reason),
                    time_us=t.decided_us, runway_s=min(inputs.runway_s, 1e18),
                    projected_cost=str(decision.projected_cost)))
        self.on_decision(key, decision, applied)
        return int(applied)

    async def decide_mix_one(self, key: Key, e: common_pb2.Endpoint, t: Track,
                             streams: Mapping[ep.Priority, StreamReading], rps: float,
                             p95: float | None, now: float, cpu_rps: float | None) -> int:
        """An endpoint on several flavors: replicas per flavor (mix.decide_mix)."""
        inputs = mix_inputs_for(e, streams, rps, p95, self.runways.get(e.tenant),
                                self.prices, self.windows, t.last_up, t.last_down,
                                measured_cpu_rps=cpu_rps)
        t.flavor_rps = {f.name: f.replica_rps for f in inputs.policy.flavors}
        decision, t.mix_state = decide_mix(inputs, t.mix_state, now)
        t.mix, t.decided_us = decision, now_us()
        total = sum(decision.target.values())
        current = sum(inputs.current.values())
        # What GetScaleState and the metrics read, as for one flavor.
        t.inputs = ScaleInputs(
            policy=inputs.policy.scale, price_per_replica_s=decision.cost_per_s / max(1, total),
            remaining=inputs.remaining, runway_s=inputs.runway_s, current=current,
            ready=min(current, sum(inputs.ready.values())), queue_depth=inputs.queue_depth,
            arrival_rps=inputs.arrival_rps, in_flight=inputs.in_flight, p95_ms=inputs.p95_ms)
        t.decision = Decision(total, decision.reason, current, total, None, decision.panic,
                              decision.projected_cost, decision.demand_rps, decision.demand_rps)
        applied = False
        if dict(decision.target) != dict(inputs.current):
            resp = await self.replicas.ScaleEndpoint(replicas_pb2.ScaleEndpointRequest(
                tenant=e.tenant, endpoint_id=e.endpoint_id, reason=str(decision.reason),
                flavor_replicas={f: decision.target.get(f, 0) for f in flavors_of(e.spec)}),
                timeout=30)
            got = {f: n for f, n in resp.endpoint.flavor_replicas.items() if n}
            applied = got != dict(inputs.current)
            if any(n > inputs.current.get(f, 0) for f, n in got.items()):
                t.last_up = now
            if any(got.get(f, 0) < n for f, n in inputs.current.items()):
                t.last_down = now
            if resp.refusal:
                log.info("%s of %s: %s of %s started: %s", e.endpoint_id, e.tenant, got,
                         dict(decision.target), resp.refusal)
            log.info("%s of %s: %s -> %s (%s)", e.endpoint_id, e.tenant,
                     dict(inputs.current), got, decision.reason)
            t.applied += applied
            if applied:
                await self.publish(events_pb2.EndpointScaled(
                    tenant=e.tenant, endpoint=e.endpoint_id, from_replicas=current,
                    to_replicas=resp.endpoint.replicas, reason=str(decision.reason),
                    time_us=t.decided_us, runway_s=min(inputs.runway_s, 1e18),
                    projected_cost=str(decision.projected_cost)))
        self.on_decision(key, t.decision, applied)
        return int(applied)

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """A round every interval, or sooner when a runway message arrives."""
        while not stop.is_set():
            self.wake.clear()
            try:
                if self.leading():
                    await self.round()
                elif self.tracks:  # a follower keeps no state: the leader's is the truth
                    self.tracks.clear()
            except (grpc.aio.AioRpcError, RedisError, OSError) as err:
                log.warning("autoscaler round failed: %s", err)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
            await asyncio.wait(waits, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    # --- GetScaleState --------------------------------------------------------

    def scale_state(self, tenant: str, endpoint_id: str
                    ) -> autoscaler_pb2.GetScaleStateResponse | None:
        t = self.tracks.get((tenant, endpoint_id))
        if t is None or t.decision is None or t.inputs is None:
            return None
        d, i = t.decision, t.inputs
        cooldown = (t.last_down if t.last_down is not None else -1e18)
        if t.last_up is not None:
            cooldown = max(cooldown, t.last_up)
        until = 0
        if cooldown > -1e18:
            until = t.decided_us + int((cooldown + i.policy.scale_down_cooldown_s
                                        - self.clock()) * 1e6)
        mix = t.mix
        return autoscaler_pb2.GetScaleStateResponse(
            flavor_replicas=dict(mix.current) if mix else {},
            target_flavor_replicas=dict(mix.target) if mix else {},
            cheapest_mix=dict(mix.plan) if mix else {},
            demand_rps=mix.demand_rps if mix else 0.0,
            flavor_rps=t.flavor_rps if mix else {},
            replicas=d.current, target_replicas=d.target, reason=str(d.reason),
            inputs=autoscaler_pb2.ScaleInputs(
                queue_depth=i.queued + i.in_flight, p95_ms=i.p95_ms or 0.0,
                ready_replicas=i.ready, runway_s=0.0 if i.runway_s == float("inf")
                else i.runway_s, runway_unlimited=i.runway_s == float("inf"),
                remaining=str(i.remaining), price_per_replica_s=str(i.price_per_replica_s)),
            decided_us=t.decided_us, cooldown_until_us=max(0, until))


__all__ = ["Autoscaler", "Reason", "Track"]
