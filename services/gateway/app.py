"""Wiring of the gateway process."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from kestrel import bus, runway
from kestrel.config import Stores, env_float, env_int, env_str
from kestrel.db import create_pool, migrate_component
from kestrel.grpcserver import Server
from kestrel.metrics import GrpcMetrics
from kestrel.service import drain, serve_metrics
from kestrel_sdk.tls import aio_channel
from kestrel_sdk.v1 import (
    admission_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    meter_pb2_grpc,
    placer_pb2_grpc,
    replicas_pb2,
    replicas_pb2_grpc,
)
from services.gateway import ratelimit
from services.gateway.auth import hash_secret
from services.gateway.http import HttpListener, OpenAIApi
from services.gateway.infer import InferBackend, ReplyHub
from services.gateway.ratelimit import RateLimiter
from services.gateway.replicas_servicer import ReplicasServicer
from services.gateway.servicer import GatewayServicer
from services.gateway.store import MIGRATIONS, GatewayStore

log = logging.getLogger("kestrel.gateway")


@dataclass(frozen=True)
class GatewayConfig:
    stores: Stores
    host: str
    grpc_port: int
    metrics_port: int
    http_port: int
    replicas_port: int  # kestrel.v1.Replicas, internal: the autoscaler's
    admission_addr: str
    meter_addr: str
    placer_addr: str
    operator_token: str
    operator_token_file: str
    max_node_gpus: int
    redis_max_connections: int
    redis_wait_s: float
    worker_heartbeat_s: float = 1.0

    @classmethod
    def from_env(cls) -> GatewayConfig:
        return cls(Stores.from_env("gateway"), env_str("KESTREL_BIND_HOST", "127.0.0.1"),
                   env_int("KESTREL_GATEWAY_PORT", 50051),
                   env_int("KESTREL_GATEWAY_METRICS_PORT", 9151),
                   env_int("KESTREL_GATEWAY_HTTP_PORT", 8080),
                   env_int("KESTREL_REPLICAS_PORT", 50057),
                   env_str("KESTREL_ADMISSION_ADDR", "127.0.0.1:50052"),
                   env_str("KESTREL_METER_ADDR", "127.0.0.1:50053"),
                   env_str("KESTREL_PLACER_ADDR", "127.0.0.1:50054"),
                   env_str("KESTREL_OPERATOR_TOKEN", ""),
                   env_str("KESTREL_OPERATOR_TOKEN_FILE", ".run/operator-token"),
                   env_int("KESTREL_MAX_NODE_GPUS", 8),
                   env_int("KESTREL_GATEWAY_REDIS_MAX_CONNECTIONS", 32),
                   env_float("KESTREL_GATEWAY_REDIS_WAIT_S", 2.0),
                   env_float("KESTREL_WORKER_HEARTBEAT_S", 1.0))


def operator_token_hash(config: GatewayConfig) -> str:
    """From KESTREL_OPERATOR_TOKEN, else a token generated once into a 0600 file."""
    if config.operator_token:
        return hash_secret(config.operator_token)
    path = Path(config.operator_token_file)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"kso_{secrets.token_urlsafe(32)}\n")
        log.info("generated an operator token in %s", path)
    return hash_secret(path.read_text().strip())


async def run(config: GatewayConfig, stop: asyncio.Event) -> None:
    pool = await create_pool(config.stores.postgres_dsn, max_size=10)
    nc = await bus.connect(config.stores.nats_url, "gateway")
    redis = ratelimit.connect(config.stores.redis_url, config.redis_max_connections,
                              config.redis_wait_s)
    store = GatewayStore(pool)
    await migrate_component(config.stores, "gateway", MIGRATIONS)
    admission_ch = aio_channel(config.admission_addr)
    meter_ch = aio_channel(config.meter_addr)
    placer_ch = aio_channel(config.placer_addr) if config.placer_addr else None
    hub = ReplyHub(config.stores.redis_url)  # Infer's replies: one reader per gateway
    hub.start()
    runways = runway.Runways()  # Infer's budget gate reads the meter's last figure
    following = asyncio.create_task(runway.follow(nc, runways, stop), name="runway")
    servicer = GatewayServicer(
        store, RateLimiter(redis), admission_pb2_grpc.AdmissionStub(admission_ch),
        meter_pb2_grpc.MeterStub(meter_ch), nc, operator_token_hash(config),
        config.max_node_gpus,
        placer_pb2_grpc.PlacerStub(placer_ch) if placer_ch is not None else None,
        InferBackend(redis, hub, config.worker_heartbeat_s), runways)
    registry = CollectorRegistry()
    metrics = GrpcMetrics(registry)
    server = Server(config.host, config.grpc_port,
                    [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name],
                    interceptors=[metrics])
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server.server)
    await server.start()
    # The internal service on a port of its own, so that only its callers reach it.
    internal = Server(config.host, config.replicas_port,
                      [replicas_pb2.DESCRIPTOR.services_by_name["Replicas"].full_name],
                      interceptors=[metrics])
    replicas_pb2_grpc.add_ReplicasServicer_to_server(ReplicasServicer(servicer.endpoints),
                                                     internal.server)
    await internal.start()
    openai_api = HttpListener(OpenAIApi(servicer.callers, servicer.endpoints,
                                        servicer.inference, registry),
                              config.host, config.http_port)
    await openai_api.start()
    http = serve_metrics(registry, config.host, config.metrics_port)
    log.info("gateway serving gRPC on %s, kestrel.v1.Replicas on %s", server.address,
             internal.address)
    try:
        await stop.wait()
    finally:
        await openai_api.stop()
        await internal.stop(grace_s=3)
        channels = [admission_ch, meter_ch, *([placer_ch] if placer_ch is not None else [])]
        await drain(server, [following], task_timeout_s=5, http=http, nc=nc, pool=pool,
                    closers=[*(c.close for c in channels), hub.close, redis.aclose])
