"""Wiring of the placer process: connections, core, watches, transports, lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter, Gauge

from kestrel import bus, checkfeed, runway
from kestrel.config import Stores, env_int, env_str, local_image_record, local_kubeconfig
from kestrel.db import create_pool
from kestrel.grpcserver import Server
from kestrel.lease import Elector
from kestrel.lease import identity as lease_identity
from kestrel.metrics import GrpcMetrics, consumer_pending_gauge, watch_consumers
from kestrel.runway import Runways
from kestrel.service import drain, every, serve_metrics
from kestrel.workloads import GPU_FLAVORS
from kestrel_sdk.v1 import events_pb2, placer_pb2, placer_pb2_grpc
from services.placer.consumers import ACK_WAIT_S, consume_admitted
from services.placer.core import Placer
from services.placer.domain import DEFAULT_SHORT_BP
from services.placer.kube import KINDS, WATCHED, Kube, Watcher
from services.placer.lifecycle import Derived
from services.placer.orphans import Why
from services.placer.servicer import PlacerServicer
from services.placer.settings import PlacerSettings
from services.placer.standins import StandIns
from services.placer.store import PlacerStore
from services.placer.wire import event_to_wire, runway_from_wire

log = logging.getLogger("kestrel.placer")

# How often an empty numbered message goes to admission's runway check when nothing
# else does (kestrel.checkfeed.Outbox.beat): the longest a lost message goes unseen.
CHECK_BEAT_S = 5.0


@dataclass(frozen=True)
class PlacerConfig:
    stores: Stores
    host: str
    grpc_port: int
    metrics_port: int
    kubeconfig: str
    settings: PlacerSettings
    refresh_s: float
    kube_threads: int
    ack_wait_s: int = ACK_WAIT_S
    orphan_s: float = 30.0  # how often replicas nothing would stop are looked for
    # Leader election: with a Lease name, of several placers only its holder acts (the
    # others wait, connected, to take over); "" runs one placer without a Lease.
    lease: str = ""
    lease_namespace: str = "default"
    lease_s: int = 3

    @classmethod
    def from_env(cls) -> PlacerConfig:
        flavors = tuple(f.strip() for f in env_str("KESTREL_PLACER_FLAVORS",
                                                   ",".join(GPU_FLAVORS)).split(",")
                        if f.strip())
        return cls(
            stores=Stores.from_env("placer"),
            host=env_str("KESTREL_BIND_HOST", "127.0.0.1"),
            grpc_port=env_int("KESTREL_PLACER_PORT", 50054),
            metrics_port=env_int("KESTREL_PLACER_METRICS_PORT", 9154),
            kubeconfig=env_str("KESTREL_KUBECONFIG", str(local_kubeconfig())),
            settings=PlacerSettings(
                flavors=flavors,
                runway_check=env_str("KESTREL_RUNWAY_CHECK", "kestrel-runway"),
                short_bp=env_int("KESTREL_PLACER_SHORT_BP", DEFAULT_SHORT_BP),
                worker_image=env_str("KESTREL_WORKER_IMAGE", ""),
                worker_image_record=env_str("KESTREL_WORKER_IMAGE_RECORD",
                                            str(local_image_record())),
                worker_redis_url=env_str("KESTREL_WORKER_REDIS_URL",
                                         Stores.from_env("placer").redis_url),
                gpu_standins=env_str("KESTREL_PLACER_GPU_STANDINS", "1") == "1"),
            refresh_s=float(env_int("KESTREL_PLACER_REFRESH_S", 10)),
            kube_threads=env_int("KESTREL_PLACER_KUBE_THREADS", 32),
            ack_wait_s=env_int("KESTREL_PLACER_ACK_WAIT_S", ACK_WAIT_S),
            orphan_s=float(env_str("KESTREL_PLACER_ORPHAN_S", "30")),
            lease=env_str("KESTREL_PLACER_LEASE", ""),
            lease_namespace=env_str("KESTREL_PLACER_LEASE_NAMESPACE", "default"),
            lease_s=env_int("KESTREL_PLACER_LEASE_S", 3),
        )


async def _until_leading(elector: Elector, stop: asyncio.Event) -> bool:
    """Wait, warm, until this placer holds the Lease (True) or is stopped (False)."""
    while not elector.leading:
        if stop.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    return True


async def _step_down_on_loss(elector: Elector, stop: asyncio.Event) -> None:
    """A leader that no longer holds the Lease stops, as client-go's leaderelection
    users do (Kueue's manager exits): another placer leads now, and a process that
    restarts comes back as a standby. What it has in flight finishes during the drain;
    a Job is named by its job id, so one placed by both is still one Job."""
    while elector.leading and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    if not stop.is_set():
        log.error("lost Lease %s/%s: stopping, another placer leads", elector.namespace,
                  elector.name)
        stop.set()


async def _end_lease(tasks: list[asyncio.Task[None]], elector: Elector | None) -> None:
    """End the lease tasks and give the Lease up if held, so a standby takes over at
    once (after a leader's drain: nothing of its own is still in flight)."""
    for t in tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t, timeout=5)
    if elector is not None:
        await asyncio.to_thread(elector.release)


async def run(config: PlacerConfig, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    marks: list[str] = []  # where the start-up went, logged once serving

    def mark(what: str) -> None:
        marks.append(f"{what} {loop.time() - began:.1f}")

    pool = await create_pool(config.stores.postgres_dsn, max_size=4)
    nc = await bus.connect(config.stores.nats_url, "placer")
    js = nc.jetstream()
    await bus.retry_forever("ensure streams", lambda: bus.ensure_streams(js))
    # Kubernetes calls block a thread each while the apiserver answers: more threads
    # than the default min(32, cpus + 4) keep creates flowing on a small machine.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=config.kube_threads, thread_name_prefix="kube"))
    mark("stores")
    kube: Kube = await bus.retry_forever(
        "kubernetes client", lambda: asyncio.to_thread(Kube, config.kubeconfig))
    store = PlacerStore(pool)
    registry = CollectorRegistry()
    published = Counter("kestrel_placer_events_published_total",
                        "Workload events published",
                        ["type"], registry=registry)
    relists = Counter("kestrel_placer_relists_total", "Full lists of a watched kind", ["kind"],
                      registry=registry)

    async def publish(event: Derived) -> None:
        await bus.publish(js, bus.subject_workload(event.tenant, int(event.type)),
                          event_to_wire(event), event.event_id)

    placer = Placer(kube, store, publish, config.settings)
    observer, tenancy = placer.observer, placer.tenancy
    if config.settings.gpu_standins:
        observer.standins = StandIns(config.settings.worker_redis_url)
    observer.on_published = lambda e: published.labels(e.type.word).inc()
    orphaned = Counter("kestrel_placer_orphan_replicas_total",
                       "Endpoint replicas found running with nothing to stop them (their "
                       "endpoint deleted, their job cancelled, or not recorded on their "
                       "endpoint) and ended by the reconcile", ["reason"], registry=registry)
    for why in Why:
        orphaned.labels(why.value)
    placer.on_orphan = lambda o: orphaned.labels(o.why.value).inc()

    async def publish_checks(msgs: list[events_pb2.CheckedWorkloads]) -> None:
        for msg in msgs:  # core NATS: admission numbers them and asks again on a gap
            await nc.publish(checkfeed.SUBJECT, msg.SerializeToString(),
                             headers={bus.TYPE_HEADER: bus.type_name(msg)})

    async def on_check_sync(msg: Msg) -> None:
        observer.check_sync()

    observer.publish_checks = publish_checks
    lease_tasks: list[asyncio.Task[None]] = []
    elector: Elector | None = None
    if config.lease:
        identity = lease_identity()
        elector = Elector(kube.api, config.lease, config.lease_namespace, identity,
                          duration_s=config.lease_s, renew_s=max(0.2, config.lease_s / 6))
        leader = Gauge("kestrel_placer_leader", "1 while this placer holds the Lease",
                       registry=registry)
        leader.set_function(lambda: float(elector is not None and elector.leading))
        lease_tasks.append(asyncio.create_task(elector.run(stop), name="lease"))
        log.info("standby: waiting for Lease %s/%s as %s", config.lease_namespace,
                 config.lease, identity)
        if not await _until_leading(elector, stop):
            await _end_lease(lease_tasks, elector)
            await nc.close()
            await pool.close()
            log.info("stopped as a standby")
            return
        lease_tasks.append(asyncio.create_task(_step_down_on_loss(elector, stop),
                                               name="lease-loss"))
        mark("lease")
    await nc.subscribe(checkfeed.SYNC_SUBJECT, cb=on_check_sync)
    await bus.retry_forever("admission check", tenancy.ensure_admission_check)
    await bus.retry_forever("prices", tenancy.refresh)
    mark("check and prices")

    halt = threading.Event()
    emit = observer.feed(loop)
    for kind in KINDS:
        Watcher(lambda: Kube(config.kubeconfig), kind, emit, halt,
                on_relist=lambda k: relists.labels(k).inc(), watch=kind in WATCHED).start()
    tasks = [asyncio.create_task(observer.run_observer(stop), name="observer")]
    runway_ready = asyncio.Event()
    runways = Runways()  # every tenant's runway, known before placement begins
    runways.listen(lambda r: placer.runways.__setitem__(r.tenant, runway_from_wire(r)))
    tasks.append(asyncio.create_task(runway.follow(nc, runways, stop, runway_ready),
                                     name="runway"))
    # Serve once the runway of every tenant is known and every event implied by what
    # exists in Kubernetes is out; a SIGTERM meanwhile still stops the process.
    for what, ready in (("runway view", runway_ready), ("initial lists", observer.synced)):
        await asyncio.wait([asyncio.create_task(ready.wait()),
                            asyncio.create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        mark(what)
    if stop.is_set():
        halt.set()
        await _end_lease(lease_tasks, elector)
        if observer.standins is not None:
            await observer.standins.stop_all()
        for t in tasks:
            t.cancel()
        await nc.close()
        await pool.close()
        log.info("stopped before serving")
        return

    server = Server(config.host, config.grpc_port,
                    [placer_pb2.DESCRIPTOR.services_by_name["Placer"].full_name],
                    interceptors=[GrpcMetrics(registry)])
    placer_pb2_grpc.add_PlacerServicer_to_server(PlacerServicer(placer), server.server)
    await server.start()
    http = serve_metrics(registry, config.host, config.metrics_port)
    jobs = consume_admitted(nc, placer, stop, ack_wait_s=config.ack_wait_s)
    tasks += [asyncio.create_task(jobs, name="jobs"),
              asyncio.create_task(every(
                  config.refresh_s, stop, tenancy.refresh,
                  "refreshing prices and tenant quotas failed", log), name="refresh"),
              asyncio.create_task(every(
                  CHECK_BEAT_S, stop, observer.check_beat,
                  "numbering the runway-check feed failed", log), name="check-beat"),
              asyncio.create_task(every(
                  1.0, stop, observer.requeue_stuck,
                  "requeueing Jobs Kueue left without a Workload failed", log),
                  name="requeue"),
              asyncio.create_task(every(
                  config.orphan_s, stop, placer.reconcile_replicas,
                  "looking for orphaned endpoint replicas failed", log), name="orphans"),
              asyncio.create_task(watch_consumers(
                  js, consumer_pending_gauge(registry), [("KESTREL_JOBS", "placer")], stop),
                  name="lag")]
    log.info("placer serving gRPC on %s (runway check %r, flavors %s) %.1f s after start "
             "(s since start: %s)", server.address, config.settings.runway_check,
             ",".join(config.settings.flavors), loop.time() - began, ", ".join(marks))
    try:
        await stop.wait()
    finally:
        log.info("draining: finishing placements in flight, then closing")
        stop.set()
        halt.set()
        await drain(server, tasks, task_timeout_s=10, http=http, nc=nc, pool=pool)
        await _end_lease(lease_tasks, elector)  # placements done: hand over
        if observer.standins is not None:
            await observer.standins.stop_all()
