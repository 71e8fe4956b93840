"""Wiring of one model worker replica: model, Redis, gRPC health, /metrics, heartbeats.

With a cluster, the placer runs each replica: a pod of the Kestrel image on the CPU
pool's real kubelet, or, for a simulated (KWOK) GPU replica, a host process standing
in for its pod (KESTREL_WORKER_SIMULATED=1, said in every reply and heartbeat).
Without one, replicas are host processes started by tests, `make bench-infer` or an
operator with KESTREL_WORKER_ENDPOINT=<endpoint id>.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry

from kestrel.config import env_float, env_int, env_str
from kestrel.endpoints import ENDPOINT_ID_RE
from kestrel.grpcserver import Server
from kestrel.service import every, serve_metrics
from services.worker.batching import BatchPolicy
from services.worker.metrics import WorkerMetrics
from services.worker.model import load
from services.worker.replica import Replica, ReplicaSettings

log = logging.getLogger("kestrel.worker")
# The name the worker's grpc.health.v1 reports SERVING under once its model is loaded.
HEALTH_NAME = "kestrel.v1.Worker"


@dataclass(frozen=True)
class WorkerConfig:
    endpoint_id: str
    tenant: str
    replica: str
    host: str
    grpc_port: int
    metrics_port: int
    redis_url: str
    model_dir: str
    threads: int
    max_batch: int
    max_wait_ms: float
    starve_ms: float
    claim_idle_ms: int
    heartbeat_s: float
    simulated: bool = False

    @classmethod
    def from_env(cls) -> WorkerConfig:
        endpoint = env_str("KESTREL_WORKER_ENDPOINT", "")
        if not ENDPOINT_ID_RE.match(endpoint):
            raise SystemExit(f"KESTREL_WORKER_ENDPOINT={endpoint!r}: an endpoint id "
                             "(ep-<16 hex digits>) is required")
        replica = env_str("KESTREL_WORKER_REPLICA", "") or \
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return cls(endpoint, env_str("KESTREL_WORKER_TENANT", ""), replica,
                   env_str("KESTREL_BIND_HOST", "127.0.0.1"),
                   env_int("KESTREL_WORKER_PORT", 50056),
                   env_int("KESTREL_WORKER_METRICS_PORT", 9156),
                   env_str("KESTREL_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   env_str("KESTREL_MODEL_DIR", ""),
                   env_int("KESTREL_WORKER_THREADS", 2),
                   env_int("KESTREL_WORKER_MAX_BATCH", 32),
                   env_float("KESTREL_WORKER_MAX_WAIT_MS", 5.0),
                   env_float("KESTREL_WORKER_STARVE_MS", 250.0),
                   env_int("KESTREL_WORKER_CLAIM_IDLE_MS", 2000),
                   env_float("KESTREL_WORKER_HEARTBEAT_S", 1.0),
                   env_str("KESTREL_WORKER_SIMULATED", "0") == "1")


async def run(config: WorkerConfig, stop: asyncio.Event) -> None:
    embedder = load(config.model_dir, config.threads)
    embedder.embed(["warm up the session", "and its allocator"] * 4)  # first run is slow
    log.info("model loaded (sha256 verified), %d intra-op threads", config.threads)
    redis = aioredis.Redis.from_url(config.redis_url, socket_connect_timeout=5.0)
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, config.tenant, config.endpoint_id, config.replica)
    settings = ReplicaSettings(
        config.tenant, config.endpoint_id, config.replica,
        BatchPolicy(config.max_batch, int(config.max_wait_ms * 1000),
                    int(config.starve_ms * 1000)),
        config.claim_idle_ms, config.heartbeat_s, config.simulated)
    replica = Replica(redis, settings, embedder.embed, metrics)
    await replica.ensure_groups()
    await replica.beat()
    server = Server(config.host, config.grpc_port, [])
    await server.start()
    await server.health.set(HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING)
    http = serve_metrics(registry, config.host, config.metrics_port)
    log.info("worker %s of %s serving health on %s", config.replica, config.endpoint_id,
             server.address)
    done = asyncio.Event()
    tasks = [
        asyncio.create_task(replica.run(stop)),
        asyncio.create_task(every(config.heartbeat_s, done, replica.beat, "heartbeat", log)),
        asyncio.create_task(every(config.claim_idle_ms / 2000, done, replica.claim_orphans,
                                  "claim", log)),
    ]
    try:
        await stop.wait()
        await server.health.set(HEALTH_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.wait_for(tasks[0], timeout=30)
    finally:
        done.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await replica.leave()
        if http is not None:
            http[0].shutdown()
        await server.stop(grace_s=1)
        await redis.aclose()
        log.info("stopped")
