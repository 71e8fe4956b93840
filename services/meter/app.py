"""Wiring of the meter process: connections, core, transports, lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from decimal import Decimal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from kestrel import bus
from kestrel.config import Stores, env_float, env_int, env_str
from kestrel.db import create_pool, migrate_component
from kestrel.grpcserver import Server
from kestrel.metrics import GrpcMetrics, consumer_pending_gauge, watch_consumers
from kestrel.service import drain, every, serve_metrics
from kestrel_sdk.money import parse_amount
from kestrel_sdk.v1 import common_pb2, events_pb2, meter_pb2, meter_pb2_grpc
from services.meter.consumers import DURABLE, STREAM, WorkloadConsumer
from services.meter.core import Meter, MeterSettings
from services.meter.domain import Reason, RunwayFigures
from services.meter.metrics import MeterMetrics
from services.meter.servicer import MeterServicer
from services.meter.store import MIGRATIONS, MeterStore
from services.meter.wire import runway_changed

log = logging.getLogger("kestrel.meter")

# Credits per GPU-second (H100 3.60/h, A10 1.08/h) and per core-second on the CPU pool
# (0.072/h), applied only to flavors without a price row yet; operators change prices
# with SetPrice. Without a `cpu` price no CPU endpoint could reserve its horizon.
DEFAULT_PRICES = "gpu-h100=0.001,gpu-a10=0.0003,cpu=0.00002"


# How long a fetch of workload events that got a first one waits for company (unless
# the batch before was full: a backlog goes at once). A batch costs one transaction, one
# round of acks and one runway recompute however many events it holds; at bench-jobs'
# trickle (about 30 events a second) 0.5 s against 0.1 s took the meter from 4.6-5.2 to
# 2.3-2.8 CPU-ms per job and Postgres from 3.6-4.1 to 1.8-2.1 (README, Benchmarks).
# A runway lags its ledger by at most this, half a tick.
GATHER_S = 0.5


@dataclass(frozen=True)
class MeterConfig:
    stores: Stores
    host: str
    grpc_port: int
    metrics_port: int
    settings: MeterSettings
    batch: int
    gather_s: float
    default_prices: dict[str, Decimal]
    # Every open hold is read again this often: what a missed message of admission's
    # (plain NATS) left stale is right again after at most this long.
    holds_resync_s: float = 30.0
    # How long a fetched batch may stay unacknowledged before JetStream hands it to
    # another replica: how long the events a killed replica held wait for a survivor.
    ack_wait_s: int = 30

    @classmethod
    def from_env(cls) -> MeterConfig:
        prices = {}
        for item in env_str("KESTREL_PRICES", DEFAULT_PRICES).split(","):
            if item.strip():
                flavor, _, value = item.partition("=")
                prices[flavor.strip()] = parse_amount(value, positive=False)
        return cls(
            stores=Stores.from_env("meter"),
            host=env_str("KESTREL_BIND_HOST", "127.0.0.1"),
            grpc_port=env_int("KESTREL_METER_PORT", 50053),
            metrics_port=env_int("KESTREL_METER_METRICS_PORT", 9153),
            settings=MeterSettings(
                tick_s=env_float("KESTREL_METER_TICK_S", 1.0),
                settle_us=env_int("KESTREL_METER_SETTLE_US", 200_000),
                material_bp=env_int("KESTREL_METER_MATERIAL_BP", 100)),
            batch=env_int("KESTREL_METER_BATCH", 1000),
            gather_s=env_float("KESTREL_METER_GATHER_S", GATHER_S),
            default_prices=prices,
            holds_resync_s=env_float("KESTREL_METER_HOLDS_RESYNC_S", 30.0),
            ack_wait_s=env_int("KESTREL_METER_ACK_WAIT_S", 30),
        )


# Job states whose change writes or releases no hold: a job placed (QUEUED) or running
# keeps the hold it had (its allocation's opening comes through the meter's own ingest),
# and a HELD job has none. Skipping them halves the reserved re-reads of a busy tenant.
HOLDLESS = frozenset({common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING,
                      common_pb2.JOB_STATE_HELD})


async def _follow_holds(nc: NATS, meter: Meter, stop: asyncio.Event) -> None:
    """Admission's job state changes move holds: read again the holds of the jobs that
    moved (a job's id is its hold's workload id), gathered for 50 ms, one index probe
    each. A message that cannot be read has its whole tenant read again. The messages
    go over plain NATS, so a reconnect (messages may have been missed meanwhile) reads
    every hold again at the next one, and so does the periodic resync (run())."""
    jobs: set[str] = set()
    tenants: set[str] = set()
    wake = asyncio.Event()

    async def on_state(msg: Msg) -> None:
        try:
            change = bus.parse(msg, events_pb2.JobStateChanged)
        except bus.Unusable:  # unreadable: its tenant's holds, all of them
            tenants.add(msg.subject.rsplit(".", 1)[-1])
            wake.set()
            return
        if change.to_state in HOLDLESS:
            return
        if change.job_id:
            jobs.add(change.job_id)
        else:
            tenants.add(msg.subject.rsplit(".", 1)[-1])
        wake.set()

    reconnects = nc.stats["reconnects"]
    sub = await nc.subscribe("kestrel.jobs.state.>", cb=on_state)
    try:
        while not stop.is_set():
            await wake.wait()
            wake.clear()
            await asyncio.sleep(0.05)
            moved, whole = sorted(jobs), sorted(tenants)
            jobs.clear()
            tenants.clear()
            try:
                if nc.stats["reconnects"] != reconnects:
                    reconnects = nc.stats["reconnects"]
                    await meter.resync(full=True)
                else:
                    await meter.reservation_changed(whole, workloads=moved)
            except Exception:
                log.exception("re-reading holds failed")
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def run(config: MeterConfig, stop: asyncio.Event) -> None:
    pool = await create_pool(config.stores.postgres_dsn, max_size=6)
    nc = await bus.connect(config.stores.nats_url, "meter")
    js = nc.jetstream()
    await bus.retry_forever("ensure streams", lambda: bus.ensure_streams(js))
    await migrate_component(config.stores, "meter", MIGRATIONS)
    store = MeterStore(pool)
    registry = CollectorRegistry()

    async def publish(fig: RunwayFigures, reason: Reason, committed_us: int) -> None:
        msg = runway_changed(fig, reason, committed_us)
        try:
            await bus.publish(js, bus.subject_runway(fig.tenant), msg,
                              f"runway-{fig.tenant}-{fig.meter_version}-{committed_us}-"
                              f"{fig.ledger_seq}")
        except Exception as exc:  # the next change or a restart republishes
            log.warning("runway publish for %s failed: %s", fig.tenant, exc)

    meter = Meter(store, publish, config.settings)
    metrics = MeterMetrics(meter, registry)
    meter.observe_write = metrics.write_latency.observe
    meter.on_stale = metrics.resync_stale.inc
    await meter.start()
    for flavor, price in config.default_prices.items():
        if flavor not in meter.prices:
            await meter.set_price(flavor, price)

    server = Server(config.host, config.grpc_port,
                    [meter_pb2.DESCRIPTOR.services_by_name["Meter"].full_name],
                    interceptors=[GrpcMetrics(registry)])
    meter_pb2_grpc.add_MeterServicer_to_server(MeterServicer(meter), server.server)
    await server.start()
    http = serve_metrics(registry, config.host, config.metrics_port)
    consumer = WorkloadConsumer(nc, meter, batch=config.batch, gather_s=config.gather_s,
                                ack_wait_s=config.ack_wait_s, on_bad=metrics.bad_events.inc)
    consumer_task = asyncio.create_task(consumer.run(), name="consumer")

    async def tick() -> None:
        await meter.tick()
        metrics.last_tick.set(time.time())
        metrics.ticks.inc()

    tick_task = asyncio.create_task(every(
        config.settings.tick_s, stop, tick, "tick failed; the next tick cuts the same time",
        log), name="tick")
    lag_task = asyncio.create_task(watch_consumers(
        js, consumer_pending_gauge(registry), [(STREAM, DURABLE)], stop), name="lag")
    holds_task = asyncio.create_task(_follow_holds(nc, meter, stop), name="holds")
    resync_task = asyncio.create_task(every(
        config.holds_resync_s, stop, meter.resync, "reading every hold again failed", log),
        name="resync")
    log.info("meter serving gRPC on %s, metrics on %s:%d", server.address, config.host,
             config.metrics_port)
    try:
        done, _ = await asyncio.wait(
            [asyncio.create_task(stop.wait()), consumer_task, tick_task],
            return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not None and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        log.info("draining: finishing the current batch, then closing")
        stop.set()
        consumer.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer_task, timeout=10)
        for t in (tick_task, lag_task, holds_task, resync_task):
            t.cancel()
        await drain(server, [], task_timeout_s=0, http=http, nc=nc, pool=pool)
