"""Wiring of the admission process."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Gauge

from kestrel import bus, checkfeed, runway
from kestrel.clock import now_us
from kestrel.config import Stores, env_float, env_int, env_str, local_kubeconfig
from kestrel.db import create_pool, migrate_component
from kestrel.grpcserver import Server
from kestrel.jobs import JobRow
from kestrel.kubeclient import kubeconfig_usable, new_api_client
from kestrel.lease import Elector, while_leading
from kestrel.lease import identity as lease_identity
from kestrel.metrics import GrpcMetrics, consumer_pending_gauge, watch_consumers
from kestrel.runway import Runways
from kestrel.service import drain, every, serve_metrics
from kestrel_sdk.v1 import admission_pb2, admission_pb2_grpc, events_pb2
from services.admission.consumers import Reevaluator, follow_workloads, on_runway
from services.admission.core import Admission
from services.admission.domain import JobState
from services.admission.kueue import RunwayCheckController
from services.admission.metrics import AdmissionMetrics
from services.admission.outbox import Outbox
from services.admission.servicer import AdmissionServicer
from services.admission.store import MIGRATIONS, AdmissionStore
from services.admission.wire import job_admitted, state_changed

log = logging.getLogger("kestrel.admission")


# How long a fetch of the placer's workload events that got a first one waits for
# company: a job's next state shows up to this much later, and each batch costs one
# statement per wave and one round of announcements and acks. At bench-jobs' trickle,
# 0.25 s against 0.05 s took admission from 8.2-9.0 to 5.3-6.3 CPU-ms per job, with the
# meter's longer gather and the watches' longer linger (README, Benchmarks).
GATHER_S = 0.25


@dataclass(frozen=True)
class AdmissionConfig:
    stores: Stores
    host: str
    grpc_port: int
    metrics_port: int
    max_node_gpus: int
    kubeconfig: str
    runway_check: str
    gather_s: float  # how long a fetch of workload events waits for company
    # With a Lease name, of several admission replicas only the holder runs the runway
    # check's controller (the Workloads' check states and deactivations); the others
    # keep its feed and money warm and decide submits as every replica does.
    lease: str = ""
    lease_namespace: str = "default"
    lease_s: int = 3

    @classmethod
    def from_env(cls) -> AdmissionConfig:
        return cls(Stores.from_env("admission"), env_str("KESTREL_BIND_HOST", "127.0.0.1"),
                   env_int("KESTREL_ADMISSION_PORT", 50052),
                   env_int("KESTREL_ADMISSION_METRICS_PORT", 9152),
                   env_int("KESTREL_MAX_NODE_GPUS", 8),
                   env_str("KESTREL_KUBECONFIG", str(local_kubeconfig())),
                   env_str("KESTREL_RUNWAY_CHECK", "kestrel-runway"),
                   env_float("KESTREL_ADMISSION_GATHER_S", GATHER_S),
                   env_str("KESTREL_ADMISSION_LEASE", ""),
                   env_str("KESTREL_ADMISSION_LEASE_NAMESPACE", "default"),
                   env_int("KESTREL_ADMISSION_LEASE_S", 3))


async def follow_checks(nc: NATS, controller: RunwayCheckController) -> None:
    """The placer's feed of the Workloads our check is on (kestrel.checkfeed) into the
    controller; a gap in it, and the start, ask the placer for a full set."""

    async def sync(reason: str) -> None:
        msg = events_pb2.CheckSyncRequest(reason=reason)
        await nc.publish(checkfeed.SYNC_SUBJECT, msg.SerializeToString(),
                         headers={bus.TYPE_HEADER: bus.type_name(msg)})

    async def on_checks(msg: Msg) -> None:
        try:
            checks = bus.parse(msg, events_pb2.CheckedWorkloads)
        except bus.Unusable as exc:  # not ours to park (core NATS): a full set mends it
            log.warning("unusable runway-check message: %s", exc)
            await controller.ask_full("an unusable message")
            return
        if controller.received(checks):
            await controller.ask_full(f"message {checks.seq} of {checks.epoch or '?'} "
                                      "follows a gap")

    controller.sync = sync
    await nc.subscribe(checkfeed.SUBJECT, cb=on_checks)
    await controller.ask_full("admission started")


async def run(config: AdmissionConfig, stop: asyncio.Event) -> None:
    pool = await create_pool(config.stores.postgres_dsn, max_size=10)
    nc = await bus.connect(config.stores.nats_url, "admission")
    js = nc.jetstream()
    await bus.retry_forever("ensure streams", lambda: bus.ensure_streams(js))
    store = AdmissionStore(pool)
    while not await store.schema_ready():
        log.info("waiting for the meter's and the gateway's schema")
        await asyncio.sleep(0.5)
    await migrate_component(config.stores, "admission", MIGRATIONS)
    registry = CollectorRegistry()
    metrics = AdmissionMetrics(registry)

    controller: RunwayCheckController | None = None

    async def send(row: JobRow, prev: JobState | None) -> None:
        now = now_us()
        sends = [bus.publish(js, bus.subject_job_state(row.tenant), state_changed(row, prev, now),
                             f"state-{row.job_id}-{int(row.state)}")]
        if row.state in (JobState.ADMITTED, JobState.HELD):
            # Both go to the placer: a HELD job waits in Kubernetes at the runway check
            # (Pending, its reason in `kubectl describe workload`) until it is admitted.
            sends.append(bus.publish(js, bus.subject_job_admitted(row.tenant), job_admitted(row),
                                     f"place-{row.job_id}-{int(row.state)}"))
        await asyncio.gather(*sends)

    # The job is committed before it is announced: a failed announcement is retried
    # (outbox), and one lost to a crash is made again at start-up (admitted_not_placed).
    outbox = Outbox(send, store.get_many)

    async def announce(row: JobRow, prev: JobState | None) -> None:
        """A committed change, counted and woken on once (retries go through the outbox
        alone), then announced."""
        if prev is None:  # a submission decided (a replay after a restart has prev set)
            metrics.decisions.labels(row.tenant, row.state.name.lower()).inc()
        elif prev is JobState.HELD and row.state is JobState.ADMITTED:
            metrics.decisions.labels(row.tenant, "released").inc()
        if controller is not None and prev is JobState.HELD:
            controller.wake(row.tenant)  # released or cancelled: its check's verdict moves
        log.info("job %s of %s: %s -> %s%s", row.job_id, row.tenant,
                 prev.name if prev is not None else "submitted", row.state.name,
                 f" ({row.reason})" if row.reason else "")
        await outbox.publish(row, prev)

    admission = Admission(store, announce, max_node_gpus=config.max_node_gpus)
    await admission.load()
    for row in await store.admitted_not_placed():  # crash between commit and publish
        await outbox.publish(row, row.state)
    reeval = Reevaluator(admission)

    async def refresh_prices() -> None:
        admission.prices = await store.prices()

    async def sweep_held() -> None:
        for tenant, book in list(admission.books.items()):
            if book.held or book.holds:
                reeval.request(tenant)
        # Held jobs another replica decided (its book, not ours, knows them): a replica
        # that stopped leaves them to the others, whose next look reloads the tenant.
        for tenant in await store.held_tenants():
            reeval.request(tenant)

    server = Server(config.host, config.grpc_port,
                    [admission_pb2.DESCRIPTOR.services_by_name["Admission"].full_name],
                    interceptors=[GrpcMetrics(registry)])
    admission_pb2_grpc.add_AdmissionServicer_to_server(AdmissionServicer(admission),
                                                      server.server)
    await server.start()
    http = serve_metrics(registry, config.host, config.metrics_port)
    if config.runway_check and kubeconfig_usable(config.kubeconfig):
        controller = RunwayCheckController(admission, config.kubeconfig, config.runway_check)
        log.info("runway admission check %s on %s", config.runway_check, config.kubeconfig)
    else:
        log.info("runway admission check off (KESTREL_RUNWAY_CHECK empty or no kubeconfig)")
    if controller is not None:
        await follow_checks(nc, controller)
    runways = Runways()
    runways.listen(on_runway(reeval, controller.heard if controller is not None else None))
    tasks = [asyncio.create_task(runway.follow(nc, runways, stop), name="runway"),
             asyncio.create_task(follow_workloads(nc, admission, reeval, stop,
                                                  config.gather_s)),
             asyncio.create_task(every(10, stop, refresh_prices, "refreshing prices failed",
                                       log)),
             asyncio.create_task(every(5, stop, sweep_held, "sweeping held jobs failed", log)),
             asyncio.create_task(every(1, stop, outbox.retry,
                                       "retrying job announcements failed", log)),
             asyncio.create_task(metrics.follow_held(pool, admission.books, stop)),
             asyncio.create_task(watch_consumers(
                 js, consumer_pending_gauge(registry), [("KESTREL_WORKLOADS", "admission")],
                 stop))]
    elector: Elector | None = None
    if controller is not None and config.lease:
        api = await bus.retry_forever("kubernetes client", lambda: asyncio.to_thread(
            new_api_client, config.kubeconfig, 4))
        elector = Elector(api, config.lease, config.lease_namespace, lease_identity(),
                          duration_s=config.lease_s, renew_s=max(0.2, config.lease_s / 6))
        leader = Gauge("kestrel_admission_check_leader",
                       "1 while this admission replica holds the Lease and runs the runway "
                       "check's controller", registry=registry)
        leader.set_function(lambda: float(elector is not None and elector.leading))
        tasks += [asyncio.create_task(elector.run(stop), name="lease"),
                  asyncio.create_task(while_leading(elector, stop, controller.run),
                                      name="runway-check")]
        log.info("runway check controller: when holding Lease %s/%s as %s",
                 config.lease_namespace, config.lease, elector.identity)
    elif controller is not None:
        tasks.append(asyncio.create_task(controller.run(stop), name="runway-check"))
    log.info("admission serving gRPC on %s", server.address)
    try:
        await stop.wait()
    finally:
        stop.set()
        await drain(server, tasks, task_timeout_s=3, http=http, nc=nc, pool=pool)
        if elector is not None:
            await asyncio.to_thread(elector.release)
