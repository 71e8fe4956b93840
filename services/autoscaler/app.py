"""Wiring of the autoscaler process: the gateway's internal Replicas service, the meter,
Redis, the runway stream, kestrel.v1.Autoscaler (reflection, health) and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge

from kestrel import bus, runway
from kestrel.config import Stores, env_float, env_int, env_str
from kestrel.grpcserver import Server
from kestrel.kubeclient import new_api_client
from kestrel.lease import Elector
from kestrel.lease import identity as lease_identity
from kestrel.metrics import GrpcMetrics
from kestrel.runway import Runways
from kestrel.service import every, serve_metrics
from kestrel_sdk.tls import aio_channel
from kestrel_sdk.v1 import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    events_pb2,
    meter_pb2_grpc,
    replicas_pb2_grpc,
)
from services.autoscaler.core import Autoscaler, Key
from services.autoscaler.domain import Decision, Reason
from services.autoscaler.inputs import Windows, parse_flavor_rates
from services.autoscaler.servicer import AutoscalerServicer

log = logging.getLogger("kestrel.autoscaler")


@dataclass(frozen=True)
class AutoscalerConfig:
    stores: Stores
    host: str
    grpc_port: int
    metrics_port: int
    replicas_addr: str  # the gateway's internal kestrel.v1.Replicas
    meter_addr: str
    interval_s: float
    windows: Windows
    heartbeat_s: float
    kubeconfig: str = ""  # empty: no leader election (run a single autoscaler)
    lease: str = "kestrel-autoscaler"
    lease_namespace: str = "default"
    lease_duration_s: int = 5

    @classmethod
    def from_env(cls) -> AutoscalerConfig:
        return cls(
            stores=Stores.from_env("autoscaler"),
            host=env_str("KESTREL_BIND_HOST", "127.0.0.1"),
            grpc_port=env_int("KESTREL_AUTOSCALER_PORT", 50055),
            metrics_port=env_int("KESTREL_AUTOSCALER_METRICS_PORT", 9155),
            replicas_addr=env_str("KESTREL_REPLICAS_ADDR", "127.0.0.1:50057"),
            meter_addr=env_str("KESTREL_METER_ADDR", "127.0.0.1:50053"),
            interval_s=env_float("KESTREL_AUTOSCALER_INTERVAL_S", 1.0),
            windows=Windows(
                stable_window_s=env_float("KESTREL_AUTOSCALER_STABLE_WINDOW_S", 60.0),
                panic_window_s=env_float("KESTREL_AUTOSCALER_PANIC_WINDOW_S", 6.0),
                panic_threshold=env_float("KESTREL_AUTOSCALER_PANIC_THRESHOLD", 2.0),
                scale_up_cooldown_s=env_float("KESTREL_AUTOSCALER_SCALE_UP_COOLDOWN_S", 5.0),
                scale_down_cooldown_s=env_float("KESTREL_AUTOSCALER_SCALE_DOWN_COOLDOWN_S",
                                                30.0),
                replica_rps=env_float("KESTREL_AUTOSCALER_REPLICA_RPS", 45.0),
                flavor_rates=parse_flavor_rates(env_str("KESTREL_AUTOSCALER_FLAVOR_RATES",
                                                        ""))),
            heartbeat_s=env_float("KESTREL_WORKER_HEARTBEAT_S", 1.0),
            kubeconfig=env_str("KESTREL_KUBECONFIG", ""),
            lease=env_str("KESTREL_AUTOSCALER_LEASE", "kestrel-autoscaler"),
            lease_namespace=env_str("KESTREL_AUTOSCALER_LEASE_NAMESPACE", "default"),
            lease_duration_s=env_int("KESTREL_AUTOSCALER_LEASE_S", 5))


async def run(config: AutoscalerConfig, stop: asyncio.Event) -> None:
    nc = await bus.connect(config.stores.nats_url, "autoscaler")
    js = nc.jetstream()
    await bus.retry_forever("ensure streams", lambda: bus.ensure_streams(js))
    redis = aioredis.Redis.from_url(config.stores.redis_url, socket_connect_timeout=5.0)
    replicas_channel = aio_channel(config.replicas_addr)
    meter_channel = aio_channel(config.meter_addr)
    registry = CollectorRegistry()
    replicas = Gauge("kestrel_autoscaler_replicas", "Replicas an endpoint has (live)",
                     ["tenant", "endpoint"], registry=registry)
    targets = Gauge("kestrel_autoscaler_target_replicas", "The last decision's target",
                    ["tenant", "endpoint"], registry=registry)
    decisions = Counter("kestrel_autoscaler_decisions_total", "Decisions by reason",
                        ["reason", "applied"], registry=registry)
    for reason in Reason:  # every reason exists from the start (0 until it happens)
        decisions.labels(str(reason), "false")

    async def publish(msg: events_pb2.EndpointScaled) -> None:
        await bus.publish(js, bus.subject_endpoint_scaled(msg.tenant, msg.endpoint), msg,
                          f"scaled-{msg.endpoint}-{msg.time_us}-{uuid.uuid4().hex[:6]}")

    scaler = Autoscaler(replicas_pb2_grpc.ReplicasStub(replicas_channel),
                        meter_pb2_grpc.MeterStub(meter_channel), redis, publish, config.windows,
                        config.heartbeat_s)

    def on_decision(key: Key, d: Decision, applied: bool) -> None:
        replicas.labels(*key).set(d.target if applied else d.current)
        targets.labels(*key).set(d.target)
        decisions.labels(str(d.reason), "true" if applied else "false").inc()

    scaler.on_decision = on_decision
    elector: Elector | None = None
    if config.kubeconfig and config.lease:
        api = await bus.retry_forever("kubernetes client", lambda: asyncio.to_thread(
            new_api_client, config.kubeconfig, 4))
        identity = lease_identity()
        elector = Elector(api, config.lease, config.lease_namespace, identity,
                          duration_s=config.lease_duration_s,
                          renew_s=max(0.2, config.lease_duration_s / 5))
        scaler.leading = lambda: elector is not None and elector.leading
        leader = Gauge("kestrel_autoscaler_leader", "1 while this autoscaler holds the Lease",
                       registry=registry)
        leader.set_function(lambda: float(elector is not None and elector.leading))
        log.info("leader election: Lease %s/%s as %s", config.lease_namespace, config.lease,
                 identity)

    runways = Runways()
    runways.listen(scaler.runway_changed)
    runway_ready = asyncio.Event()
    server = Server(config.host, config.grpc_port,
                    [autoscaler_pb2.DESCRIPTOR.services_by_name["Autoscaler"].full_name],
                    interceptors=[GrpcMetrics(registry)])
    autoscaler_pb2_grpc.add_AutoscalerServicer_to_server(AutoscalerServicer(scaler),
                                                         server.server)
    await server.start()
    http = serve_metrics(registry, config.host, config.metrics_port)
    # Every tenant's last runway is known before the first decision.
    tasks = [asyncio.create_task(runway.follow(nc, runways, stop, runway_ready),
                                 name="runway")]
    await asyncio.wait([asyncio.create_task(runway_ready.wait()),
                        asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    tasks += [asyncio.create_task(scaler.run(stop, config.interval_s), name="loop"),
              *([asyncio.create_task(elector.run(stop), name="lease")] if elector else []),
              asyncio.create_task(every(30.0, stop, scaler.refresh_prices,
                                        "refreshing prices failed", log), name="prices")]
    log.info("autoscaler serving gRPC on %s (every %.1fs; replicas %s, meter %s)",
             server.address, config.interval_s, config.replicas_addr, config.meter_addr)
    try:
        await stop.wait()
    finally:
        stop.set()
        await server.stop(grace_s=3)
        for t in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, timeout=10)
        if elector is not None:
            await asyncio.to_thread(elector.release)
        if http is not None:
            http[0].shutdown()
        await nc.close()
        await redis.aclose()
        await replicas_channel.close()
        await meter_channel.close()
        log.info("stopped")
