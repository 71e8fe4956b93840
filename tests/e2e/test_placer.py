"""End-to-end: the placer as a real process against the real data plane.

Real kube-apiserver + Kueue (KWOK simulates only the GPU nodes and their pods),
real NATS JetStream and Postgres from the session stack. No assertion is about
wall-clock speed: waits are bounded only so a broken setup fails instead of
hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import grpc
import pytest
from kubernetes.client.exceptions import ApiException
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from kestrel import bus
from kestrel.clock import now_us
from kestrel_sdk.v1 import (
    common_pb2,
    events_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    placer_pb2,
    placer_pb2_grpc,
)
from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from services.gateway.store import GatewayStore
from services.meter.store import MeterStore
from services.placer.core import AdmittedJob, Placer
from services.placer.kube import Kube
from services.placer.lifecycle import condition, time_us
from services.placer.settings import PlacerSettings
from services.placer.store import PlacerStore
from tests.conftest import OPERATOR_TOKEN, Plane

pytestmark = pytest.mark.e2e

WAIT_S = 180.0  # upper bound for any single wait; never asserted as a duration
T = TypeVar("T")
QUEUED, ADMITTED, STARTED, FINISHED, EVICTED, FAILED, CANCELLED = 6, 1, 2, 3, 4, 5, 7


@pytest.fixture(scope="session")
def k8s(cluster_up: kc.ClusterInfo) -> Any:
    return kc.api_client()


def _apis(api: Any) -> tuple[Any, Any, Any]:
    from kubernetes import client

    return client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)


async def wait_until(what: str, fn: Callable[[], Awaitable[T | None]],
                     timeout_s: float = WAIT_S) -> T:
    """Poll the coroutine function `fn` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        value = await fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 1.0)


async def wait_for(what: str, fn: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    """Poll `fn` until it returns something truthy; return it."""

    async def call() -> T | None:
        return fn()

    return await wait_until(what, call, timeout_s)


class Events:
    """Every WorkloadEvent in stream KESTREL_WORKLOADS, as it arrives (ordered consumer)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, events_pb2.WorkloadEvent]] = []
        self.subjects: list[str] = []
        self.arrived: list[float] = []  # monotonic arrival time of each item
        # Called with each event as it arrives, before the test's next poll: what has to
        # happen at an exact point of the stream (a kill -9 mid-burst) happens there.
        self.on_event: Callable[[events_pb2.WorkloadEvent], None] | None = None

    async def start(self, js: JetStreamContext) -> None:
        async def on_msg(msg: Msg) -> None:
            msg_id = (msg.headers or {}).get(bus.MSG_ID_HEADER, "")
            self.items.append((msg_id, events_pb2.WorkloadEvent.FromString(msg.data)))
            self.subjects.append(msg.subject)
            self.arrived.append(time.monotonic())
            if self.on_event is not None:
                self.on_event(self.items[-1][1])

        await js.subscribe("kestrel.workload.>", cb=on_msg, ordered_consumer=True,
                           deliver_policy=DeliverPolicy.ALL)

    def of(self, workload_prefix: str, typ: int | None = None) -> list[events_pb2.WorkloadEvent]:
        return [e for _, e in self.items if e.workload_id.startswith(workload_prefix)
                and (typ is None or e.type == typ)]

    def events_subjects(self, job_id: str, typ: int) -> list[str]:
        return [subj for (_, e), subj in zip(self.items, self.subjects, strict=True)
                if e.workload_id == job_id and e.type == typ]

    def one(self, job_id: str, typ: int) -> events_pb2.WorkloadEvent | None:
        found = [e for e in self.of(job_id, typ) if e.workload_id == job_id]
        return found[0] if found else None


class Harness:
    """One placer process over a fresh database and clean bus, plus tenant bookkeeping."""

    def __init__(self, env: dict[str, str], dsn: str, js: JetStreamContext, api: Any,
                 tmp: Path) -> None:
        self.port = free_port()
        self.env = {**env, "KESTREL_POSTGRES_DSN": dsn, "KESTREL_PLACER_PORT": str(self.port),
                    "KESTREL_PLACER_METRICS_PORT": "0", "KESTREL_RUNWAY_CHECK": "",
                    "KESTREL_KUBECONFIG": str(kc.PATHS.kubeconfig)}
        self.dsn = dsn
        self.js = js
        self.api = api
        self.tmp = tmp
        self.proc: ServiceProcess | None = None
        self.starts = 0
        self.tenants: list[str] = []
        self.events = Events()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, **env: str) -> ServiceProcess:
        self.starts += 1
        self.proc = ServiceProcess("placer", {**self.env, **env}, self.address,
                                   self.tmp / f"placer-{self.starts}.log").start(timeout_s=90)
        return self.proc

    def standby(self, **env: str) -> ServiceProcess:
        """A second placer on a port of its own, spawned, not waited for: with a Lease
        it serves only once it leads."""
        self.starts += 1
        port = free_port()
        return ServiceProcess("placer", {**self.env, **env, "KESTREL_PLACER_PORT": str(port)},
                              f"127.0.0.1:{port}",
                              self.tmp / f"placer-{self.starts}.log").spawn()

    async def tenant(self, quota: dict[str, int], borrow: dict[str, int] | None = None) -> str:
        name = f"pl{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(
                "INSERT INTO tenant_profiles (tenant, display_name, gpu_quota, gpu_borrow, "
                "rate_per_s, burst, suspended, created_us) "
                "VALUES ($1, '', $2, $3, 10, 10, false, $4)",
                name, json.dumps(quota), json.dumps(borrow or {}), now_us())
        finally:
            await conn.close()
        self.tenants.append(name)
        return name

    async def admit(self, tenant: str, gpus: int = 1, max_s: int = 60, sim_s: int = 2,
                    flavor: str = "", job_id: str = "", msg_id: str = "",
                    endpoint_id: str = "") -> str:
        job_id = job_id or f"job-{uuid.uuid4().hex[:16]}"
        spec = common_pb2.JobSpec(name="e2e", gpus=gpus, flavor=flavor, max_duration_s=max_s,
                                  sim_duration_s=sim_s, labels={"team": "e2e"},
                                  endpoint_id=endpoint_id)
        msg = events_pb2.JobAdmitted(job=common_pb2.Job(job_id=job_id, tenant=tenant,
                                                        spec=spec), reserved="1")
        await bus.publish(self.js, bus.subject_job_admitted(tenant), msg,
                          msg_id or f"admitted-{job_id}")
        return job_id

    async def runway(self, tenant: str, remaining_bp: int, runway_s: float = 1e6) -> None:
        msg = events_pb2.RunwayChanged(runway=common_pb2.Runway(
            tenant=tenant, remaining_bp=remaining_bp, runway_s=runway_s, unlimited=False))
        await bus.publish(self.js, bus.subject_runway(tenant), msg,
                          f"runway-{tenant}-{uuid.uuid4().hex}")

    def jobs(self, tenant: str, job_id: str) -> list[dict[str, Any]]:
        _, batch, _ = _apis(self.api)
        resp = batch.list_namespaced_job(f"kestrel-{tenant}",
                                         label_selector=f"kestrel.dev/job-id={job_id}",
                                         _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data)["items"]
        return items

    def workload(self, tenant: str, job_id: str) -> dict[str, Any] | None:
        _, _, custom = _apis(self.api)
        listing = custom.list_namespaced_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                                       f"kestrel-{tenant}", "workloads")
        for wl in listing["items"]:
            for ref in wl["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("name") == job_id:
                    return dict(wl)
        return None

    def cleanup(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        kw.delete_tenant_queues(self.api, [f"kestrel-{t}" for t in self.tenants])


@pytest.fixture
async def placer_db(database: str, role_dsn: Callable[[str], str]) -> str:
    """The meter's and the gateway's schema (prices, tenant_profiles) with two prices,
    migrated as the schema's owner, as the services do."""
    owner = await asyncpg.create_pool(role_dsn("kestrel_owner"), min_size=1, max_size=2)
    try:
        await MeterStore(owner).migrate()
        await GatewayStore(owner).migrate()
    finally:
        await owner.close()
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    try:
        await pool.execute("INSERT INTO prices (flavor, price_per_gpu_s, effective_us) VALUES "
                           "('gpu-h100', 0.01, 1), ('gpu-a10', 0.001, 1)")
    finally:
        await pool.close()
    return database


@pytest.fixture
async def js(clean_bus: str) -> AsyncIterator[JetStreamContext]:
    nc: NATS = await bus.connect(clean_bus, "e2e-placer")
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def harness(service_env: dict[str, str], placer_db: str, js: JetStreamContext,
                  k8s: Any, tmp_path: Path) -> AsyncIterator[Harness]:
    # The placer connects as its own role (KESTREL_PLACER_POSTGRES_DSN); the harness
    # seeds and inspects with the superuser's DSN.
    h = Harness(service_env, placer_db, js, k8s, tmp_path)
    await h.events.start(js)
    try:
        yield h
    finally:
        await asyncio.to_thread(h.cleanup)


def _cq(api: Any, tenant: str) -> dict[str, Any]:
    _, _, custom = _apis(api)
    obj: dict[str, Any] = custom.get_cluster_custom_object(
        kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, "clusterqueues", f"kestrel-{tenant}")
    return obj


async def test_admitted_job_becomes_one_job_and_reports_its_lifecycle(harness: Harness) -> None:
    tenant = await harness.tenant({"gpu-h100": 4, "gpu-a10": 4})
    harness.start()
    job_id = await harness.admit(tenant, gpus=2, max_s=30, sim_s=2)
    # The same message again (another Nats-Msg-Id, so JetStream keeps it): still one Job.
    await harness.admit(tenant, gpus=2, max_s=30, sim_s=2, job_id=job_id, msg_id="again")

    jobs = await wait_for("the Job", lambda: harness.jobs(tenant, job_id))
    job = jobs[0]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == f"kestrel-{tenant}"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert job["metadata"]["labels"]["kestrel.dev/tenant"] == tenant
    assert spec["activeDeadlineSeconds"] == 30
    assert spec["backoffLimit"] == 0
    assert pod["nodeSelector"] == {"kestrel.dev/flavor": "gpu-h100"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["template"]["metadata"]["annotations"][kw.KWOK_DURATION_ANNOTATION] == "2s"
    annotations = job["metadata"]["annotations"]
    assert annotations["kestrel.dev/flavor"] == "gpu-h100"
    assert "dearest flavor that fits" in annotations["kestrel.dev/flavor-reason"]

    finished = await wait_for("FINISHED", lambda: harness.events.one(job_id, FINISHED))
    wl = harness.workload(tenant, job_id)
    assert wl is not None
    reserved, done = condition(wl, "Admitted"), condition(wl, "Finished")
    assert reserved is not None and done is not None
    admitted = harness.events.one(job_id, ADMITTED)
    started = harness.events.one(job_id, STARTED)
    queued = harness.events.one(job_id, QUEUED)
    assert admitted is not None and started is not None and queued is not None
    assert queued.flavor == "gpu-h100" and queued.reason == annotations["kestrel.dev/flavor-reason"]
    assert admitted.time_us == time_us(reserved["lastTransitionTime"])
    assert finished.time_us == time_us(done["lastTransitionTime"])
    assert admitted.time_us <= started.time_us <= finished.time_us
    assert (admitted.gpus, admitted.flavor) == (2, "gpu-h100")
    assert admitted.k8s_namespace == f"kestrel-{tenant}" and admitted.k8s_name == \
        wl["metadata"]["name"]
    assert harness.events.of(job_id, FAILED) == [] and harness.events.of(job_id, EVICTED) == []
    # One event per kind, with the stable id `<job_id>:<kind>` as its Nats-Msg-Id.
    ids = [(mid, e.event_id) for mid, e in harness.events.items if e.workload_id == job_id]
    assert sorted(i for _, i in ids) == sorted(
        f"{job_id}:{k}" for k in ("queued", "admitted", "started", "finished"))
    assert all(mid == eid for mid, eid in ids)
    assert len(harness.jobs(tenant, job_id)) == 1
    # Both deliveries were acknowledged.
    info = await harness.js.consumer_info("KESTREL_JOBS", "placer")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    # The tenant's queues, created lazily before its first Job.
    cq = _cq(harness.api, tenant)
    assert cq["spec"]["cohortName"] == "kestrel-gpu"
    assert "admissionChecksStrategy" not in cq["spec"]


async def test_short_runway_places_on_the_cheapest_flavor(harness: Harness) -> None:
    tenant = await harness.tenant({"gpu-h100": 4, "gpu-a10": 4})
    await harness.runway(tenant, remaining_bp=1000)
    harness.start()  # a starting placer reads every tenant's last runway first
    job_id = await harness.admit(tenant, gpus=1, max_s=30, sim_s=1, flavor="gpu-h100")

    admitted = await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))
    assert admitted.flavor == "gpu-a10"
    job = harness.jobs(tenant, job_id)[0]
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"kestrel.dev/flavor": "gpu-a10"}
    reason = job["metadata"]["annotations"]["kestrel.dev/flavor-reason"]
    assert reason == "runway short (10% left): cheapest flavor that fits"
    queued = harness.events.one(job_id, QUEUED)
    assert queued is not None and (queued.flavor, queued.reason) == ("gpu-a10", reason)
    await wait_for("FINISHED", lambda: harness.events.one(job_id, FINISHED))


async def test_kill9_mid_job_then_restart_misses_no_finish_and_duplicates_nothing(
        harness: Harness) -> None:
    tenant = await harness.tenant({"gpu-h100": 4})
    proc = harness.start()
    job_id = await harness.admit(tenant, gpus=1, max_s=60, sim_s=6)
    await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))
    proc.kill9()
    # The job finishes in Kubernetes while no placer runs.
    await wait_for("Workload Finished", lambda: (
        (wl := harness.workload(tenant, job_id)) is not None
        and kw.condition_true(wl, "Finished")))
    assert harness.events.one(job_id, FINISHED) is None
    harness.start()
    finished = await wait_for("FINISHED", lambda: harness.events.one(job_id, FINISHED))
    wl = harness.workload(tenant, job_id)
    assert wl is not None
    done = condition(wl, "Finished")
    assert done is not None and finished.time_us == time_us(done["lastTransitionTime"])
    assert len(harness.jobs(tenant, job_id)) == 1
    for kind in (QUEUED, ADMITTED, FINISHED):
        assert len({e.event_id for e in harness.events.of(job_id, kind)}) == 1
    assert {e.workload_id for e in harness.events.of(job_id)} == {job_id}


ACK_WAIT = 180  # s: the restart test's ack wait


async def test_a_restarted_placer_places_what_its_predecessor_had_in_flight_at_once(
        harness: Harness) -> None:
    """kill -9 with admitted jobs still to place: the new placer must not wait for the
    dead one's unacknowledged messages to time out (ack wait) before placing them."""
    tenant = await harness.tenant({"gpu-h100": 4})
    # A long ack wait, so that waiting for it cannot pass for a slow machine.
    proc = harness.start(KESTREL_PLACER_ACK_WAIT_S=str(ACK_WAIT))
    n = 80
    ids = [f"job-{uuid.uuid4().hex[:16]}" for _ in range(n)]
    for job_id in ids:
        await harness.admit(tenant, gpus=1, max_s=60, sim_s=1, job_id=job_id)

    def placed() -> list[float]:
        return [at for (_, e), at in zip(harness.events.items, harness.events.arrived,
                                         strict=True) if e.type == QUEUED]

    killed: list[float] = []

    def kill_at_the_fifth(event: events_pb2.WorkloadEvent) -> None:
        # In the subscription callback, not at the next poll: a poll can come late enough
        # on a loaded machine that the first placer has placed all n, leaving nothing in
        # flight to hand over (CI saw that once).
        if not killed and event.type == QUEUED and len(placed()) >= 5:
            proc.kill9()
            killed.append(time.monotonic())

    harness.events.on_event = kill_at_the_fifth
    await wait_for("the first placements and the kill -9", lambda: killed)
    harness.events.on_event = None
    before = placed()
    rate_before = (len(before) - 1) / max(before[-1] - before[0], 1e-3)
    killed_at, done_before = killed[0], len({e.workload_id for _, e in
                                              harness.events.items if e.type == QUEUED})
    assert done_before < n, "the first placer placed every job before it was killed"
    harness.start(KESTREL_PLACER_ACK_WAIT_S=str(ACK_WAIT))
    ready_at = time.monotonic()
    await wait_for("every job placed", lambda: len({e.workload_id for _, e in
                                                    harness.events.items
                                                    if e.type == QUEUED}) >= n)
    after = [at for at in placed() if at > ready_at]
    first_s, all_s = after[0] - ready_at, after[-1] - ready_at
    rate_after = (n - done_before) / max(all_s, 1e-3)
    print(f"\nplacer restart: {done_before}/{n} placed before kill -9 "
          f"({rate_before:.1f}/s); restart took {ready_at - killed_at:.1f} s; first placement "
          f"{first_s:.2f} s after ready; the remaining {n - done_before} in {all_s:.2f} s "
          f"({rate_after:.1f}/s)")
    # Not a speed target: the old consumer's pending messages came back only after
    # their ack wait expired; now they are placed as soon as the new placer consumes.
    assert all_s < ACK_WAIT / 2, f"waited {all_s:.1f} s: the dead placer's ack wait"
    for job_id in ids:
        assert len(harness.jobs(tenant, job_id)) == 1


def _lease_holder(api: Any, name: str) -> str:
    from kubernetes import client as k8s

    try:
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease(name, "default")
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return str((lease.spec and lease.spec.holder_identity) or "")


async def test_of_two_placers_the_lease_holder_places_and_the_standby_takes_over_a_kill9(
        harness: Harness) -> None:
    """Two placers and one Lease: the holder serves and places, the other waits warm
    (connected, not serving, creating nothing); after kill -9 of the holder the standby
    takes the Lease once it expires, takes over the jobs the dead one had in flight and
    places the rest: every job is one Job."""
    tenant = await harness.tenant({"gpu-h100": 4})
    lease = f"kestrel-placer-{uuid.uuid4().hex[:6]}"
    env = {"KESTREL_PLACER_LEASE": lease, "KESTREL_PLACER_LEASE_S": "3",
           "KESTREL_PLACER_ACK_WAIT_S": str(ACK_WAIT)}
    leader = harness.start(**env)
    standby = harness.standby(**env)
    try:
        await wait_for("the second placer to wait for the Lease", lambda: (
            b"standby: waiting for Lease" in standby.log_path.read_bytes()))
        assert f"-{leader.pid}-" in _lease_holder(harness.api, lease)
        n = 40
        ids = [f"job-{uuid.uuid4().hex[:16]}" for _ in range(n)]
        for job_id in ids:
            await harness.admit(tenant, gpus=1, max_s=60, sim_s=1, job_id=job_id)

        def placed() -> set[str]:
            return {e.workload_id for _, e in harness.events.items if e.type == QUEUED}

        killed: list[float] = []

        def kill_at_the_fifth(event: events_pb2.WorkloadEvent) -> None:
            if not killed and event.type == QUEUED and len(placed()) >= 5:
                leader.kill9()
                killed.append(time.monotonic())

        harness.events.on_event = kill_at_the_fifth
        await wait_for("the first placements and the kill -9", lambda: killed)
        harness.events.on_event = None
        done_before = len(placed())
        assert done_before < n, "the leader placed every job before it was killed"
        # Until the kill the standby served nothing; now it leads.
        await wait_for("the standby to hold the Lease", lambda: (
            f"-{standby.pid}-" in _lease_holder(harness.api, lease)))
        await asyncio.to_thread(standby.wait, 60)
        serving_at = time.monotonic()
        await wait_for("every job placed", lambda: len(placed()) >= n)
        all_at = time.monotonic()
        print(f"\nplacer hand-over: {done_before}/{n} placed before kill -9; the standby "
              f"served {serving_at - killed[0]:.1f} s after it (Lease 3 s) and had placed "
              f"the rest {all_at - killed[0]:.1f} s after it")
        # Not a speed target: the dead leader's unacknowledged jobs were taken over at
        # once, not after their ack wait.
        assert all_at - serving_at < ACK_WAIT / 2
        for job_id in ids:
            assert len(harness.jobs(tenant, job_id)) == 1
    finally:
        standby.stop()
        with contextlib.suppress(ApiException):
            from kubernetes import client as k8s

            k8s.CoordinationV1Api(harness.api).delete_namespaced_lease(lease, "default")


async def test_cancel_deletes_the_job_and_ends_the_allocation_at_that_instant(
        harness: Harness) -> None:
    tenant = await harness.tenant({"gpu-h100": 4})
    harness.start()
    job_id = await harness.admit(tenant, gpus=2, max_s=300, sim_s=120)
    await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))

    before = now_us()
    async with grpc.aio.insecure_channel(harness.address) as channel:
        resp = await placer_pb2_grpc.PlacerStub(channel).CancelWorkload(
            placer_pb2.CancelWorkloadRequest(tenant=tenant, workload_id=job_id), timeout=30)
        # A removed RPC (ScaleEndpoint only ever answered UNIMPLEMENTED) is unknown.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary("/kestrel.v1.Placer/ScaleEndpoint")(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    after = now_us()
    assert resp.deleted
    assert before <= resp.cancelled_us <= after

    await wait_for("the Job deleted", lambda: not harness.jobs(tenant, job_id))
    cancelled = await wait_for("CANCELLED", lambda: harness.events.one(job_id, CANCELLED))
    assert cancelled.time_us == resp.cancelled_us
    assert cancelled.reason == "cancelled by the tenant" and cancelled.gpus == 2
    assert harness.events.events_subjects(job_id, CANCELLED) == [
        f"kestrel.workload.{tenant}.cancelled"]
    await wait_for("the Workload deleted", lambda: harness.workload(tenant, job_id) is None)
    # Nothing else closes it: the deletion of the cancelled allocation publishes no
    # FAILED (the allocation's one close is the cancel).
    assert harness.events.of(job_id, FINISHED) == [] and harness.events.of(job_id, FAILED) == []
    assert len({e.event_id for e in harness.events.of(job_id, CANCELLED)}) == 1


async def test_ensure_tenant_creates_then_patches_queues_with_the_runway_check(
        harness: Harness) -> None:
    check = f"kestrel-runway-e2e-{uuid.uuid4().hex[:6]}"
    harness.start(KESTREL_RUNWAY_CHECK=check)
    tenant = f"pl{uuid.uuid4().hex[:8]}"
    harness.tenants.append(tenant)
    _, _, custom = _apis(harness.api)
    try:
        async with grpc.aio.insecure_channel(harness.address) as channel:
            stub = placer_pb2_grpc.PlacerStub(channel)
            for h100 in (2, 6):
                resp = await stub.EnsureTenant(placer_pb2.EnsureTenantRequest(
                    tenant=tenant, quota=[placer_pb2.FlavorQuota(flavor="gpu-h100", gpus=h100)]),
                    timeout=30)
                assert (resp.namespace, resp.local_queue, resp.cluster_queue) == (
                    f"kestrel-{tenant}", "gpu", f"kestrel-{tenant}")
                cq = _cq(harness.api, tenant)
                quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}
                         for f in cq["spec"]["resourceGroups"][0]["flavors"]}
                assert quota["gpu-h100"]["nvidia.com/gpu"] in (h100, str(h100))
                assert quota["gpu-a10"]["nvidia.com/gpu"] in (0, "0")
                assert cq["spec"]["admissionChecksStrategy"] == {
                    "admissionChecks": [{"name": check}]}
        ac = custom.get_cluster_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                              "admissionchecks", check)
        assert ac["spec"]["controllerName"] == "kestrel.dev/runway"
        core, _, _ = _apis(harness.api)
        ns = core.read_namespace(f"kestrel-{tenant}")
        assert ns.metadata.labels["kestrel.dev/tenant"] == tenant
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                                "admissionchecks", check)


async def test_deactivated_workload_is_evicted_then_a_readmission_is_a_new_allocation(
        harness: Harness) -> None:
    tenant = await harness.tenant({"gpu-h100": 4})
    harness.start()
    job_id = await harness.admit(tenant, gpus=1, max_s=300, sim_s=120)
    await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))
    _, _, custom = _apis(harness.api)
    wl = harness.workload(tenant, job_id)
    assert wl is not None
    name = wl["metadata"]["name"]

    def set_active(active: bool) -> None:
        # What admission's runway controller does to a tenant out of budget.
        custom.patch_namespaced_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                              f"kestrel-{tenant}", "workloads", name,
                                              {"spec": {"active": active}})

    set_active(False)
    evicted = await wait_for("EVICTED", lambda: harness.events.one(job_id, EVICTED))
    wl = harness.workload(tenant, job_id)
    evicted_cond = condition(wl, "Evicted")
    assert evicted_cond is not None
    assert evicted.time_us == time_us(evicted_cond["lastTransitionTime"])
    assert evicted.reason.startswith("Deactivated") and evicted.flavor == "gpu-h100"

    set_active(True)
    again = await wait_for("ADMITTED of .r2",
                           lambda: [e for e in harness.events.of(job_id, ADMITTED)
                                    if e.workload_id == f"{job_id}.r2"])
    wl = harness.workload(tenant, job_id)
    reserved = condition(wl, "Admitted")
    assert reserved is not None
    assert again[0].time_us == time_us(reserved["lastTransitionTime"]) >= evicted.time_us
    assert again[0].event_id == f"{job_id}.r2:admitted"

    async with grpc.aio.insecure_channel(harness.address) as channel:
        resp = await placer_pb2_grpc.PlacerStub(channel).CancelWorkload(
            placer_pb2.CancelWorkloadRequest(tenant=tenant, workload_id=job_id), timeout=30)
    closed = await wait_for("CANCELLED of .r2", lambda: [
        e for e in harness.events.of(job_id, CANCELLED) if e.workload_id == f"{job_id}.r2"])
    assert closed[0].time_us == resp.cancelled_us
    # The first allocation was closed once, by its eviction.
    assert [e.event_id for e in harness.events.of(job_id) if e.workload_id == job_id
            and e.type in (FINISHED, FAILED, EVICTED, CANCELLED)] == [f"{job_id}:evicted"]
    assert harness.proc is not None and harness.proc.stop() == 0  # SIGTERM drains and exits


async def _most_running_at_once(harness: Harness, tenant: str, job_ids: list[str]) -> int:
    """Poll the tenant's Workloads until every job finished; the most admitted at once."""
    _, _, custom = _apis(harness.api)
    most = 0
    while True:
        items = (await asyncio.to_thread(
            custom.list_namespaced_custom_object, kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
            f"kestrel-{tenant}", "workloads"))["items"]
        running = [w for w in items if kw.condition_true(w, "Admitted")
                   and not kw.condition_true(w, "Finished")]
        most = max(most, len(running))
        if all(harness.events.one(j, FINISHED) for j in job_ids):
            return most
        await asyncio.sleep(0.2)


async def test_a_tenant_quota_is_a_cap_unless_the_operator_lets_it_borrow(
        harness: Harness) -> None:
    """Every tenant's ClusterQueue is in one cohort; idle quota of another tenant is
    there to borrow. A tenant with gpu-h100=2 still runs at most 2 one-GPU jobs at once;
    one allowed to borrow 2 more runs up to 4."""
    idle = await harness.tenant({"gpu-h100": 8})
    capped = await harness.tenant({"gpu-h100": 2})
    lender_borrower = await harness.tenant({"gpu-h100": 2}, borrow={"gpu-h100": 2})
    harness.start()
    async with grpc.aio.insecure_channel(harness.address) as channel:
        await placer_pb2_grpc.PlacerStub(channel).EnsureTenant(
            placer_pb2.EnsureTenantRequest(tenant=idle), timeout=30)
    capped_jobs = [await harness.admit(capped, gpus=1, max_s=60, sim_s=4) for _ in range(6)]
    most = await _most_running_at_once(harness, capped, capped_jobs)
    assert most == 2
    quota = {r["name"]: r for r in _cq(harness.api, capped)["spec"]["resourceGroups"][0][
        "flavors"][0]["resources"]}
    assert quota["nvidia.com/gpu"]["borrowingLimit"] in (0, "0")

    borrowing_jobs = [await harness.admit(lender_borrower, gpus=1, max_s=60, sim_s=4)
                      for _ in range(6)]
    most = await _most_running_at_once(harness, lender_borrower, borrowing_jobs)
    assert most == 4
    quota = {r["name"]: r for r in _cq(harness.api, lender_borrower)["spec"][
        "resourceGroups"][0]["flavors"][0]["resources"]}
    assert quota["nvidia.com/gpu"]["borrowingLimit"] in (2, "2")


async def test_whole_loop_ledger_equals_gpus_times_kubernetes_time(
        harness: Harness, plane: Plane) -> None:
    """Gateway -> admission -> placer -> Kueue -> meter: the ledger's GPU-time of a job is
    exactly gpus x (Finished - Admitted) of its Workload, and admission follows it."""
    harness.start()
    tenant = f"loop{uuid.uuid4().hex[:6]}"
    harness.tenants.append(tenant)
    op = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)
    async with grpc.aio.insecure_channel(plane.address("gateway")) as channel:
        gw = gateway_pb2_grpc.GatewayStub(channel)
        await gw.CreateTenant(gateway_pb2.CreateTenantRequest(
            tenant=gateway_pb2.Tenant(tenant=tenant, gpu_quota={"gpu-h100": 4, "gpu-a10": 4},
                                      rate_limit=gateway_pb2.RateLimit(per_s=100, burst=100)),
            initial_credits="1000"), metadata=op)
        secret = (await gw.CreateApiKey(gateway_pb2.CreateApiKeyRequest(
            tenant=tenant, name="e2e"), metadata=op)).secret
        key = (("authorization", f"Bearer {secret}"),)
        job = (await gw.SubmitJob(gateway_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name="loop", gpus=2, max_duration_s=30, sim_duration_s=2)), metadata=key)).job

        async def succeeded() -> common_pb2.Job | None:
            got: common_pb2.Job = (await gw.GetJob(gateway_pb2.GetJobRequest(
                job_id=job.job_id), metadata=key)).job
            return got if got.state == common_pb2.JOB_STATE_SUCCEEDED else None

        done = await wait_until("the job SUCCEEDED in admission", succeeded)
    assert done.flavor == "gpu-h100" and "dearest flavor that fits" in done.flavor_reason
    wl = harness.workload(tenant, job.job_id)
    assert wl is not None
    reserved, finished = condition(wl, "Admitted"), condition(wl, "Finished")
    assert reserved is not None and finished is not None
    want = 2 * (time_us(finished["lastTransitionTime"]) - time_us(reserved["lastTransitionTime"]))

    async def ledger_closed() -> int | None:
        conn = await asyncpg.connect(harness.dsn)
        try:
            row = await conn.fetchrow(
                "SELECT a.status, (SELECT coalesce(sum(gpu_us), 0) FROM ledger l "
                "WHERE l.workload_id = a.workload_id) AS gpu_us "
                "FROM allocations a WHERE a.workload_id = $1", job.job_id)
        finally:
            await conn.close()
        return int(row["gpu_us"]) if row is not None and row["status"] == 2 else None

    assert await wait_until("the allocation closed in the ledger", ledger_closed) == want


async def test_a_job_held_at_the_runway_check_is_metered_only_from_the_check_ready(
        harness: Harness) -> None:
    """With the runway AdmissionCheck on the ClusterQueue, Kueue reserves quota and waits
    for the check; the allocation starts when the check says Ready (Admitted=True). The
    test plays admission's check controller."""
    check = f"kestrel-runway-e2e-{uuid.uuid4().hex[:6]}"
    _, _, custom = _apis(harness.api)
    group, version = kw.KUEUE_GROUP, kw.KUEUE_API_VERSION

    def stamp() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    harness.start(KESTREL_RUNWAY_CHECK=check)
    try:
        custom.patch_cluster_custom_object_status(group, version, "admissionchecks", check, {
            "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active",
                                       "message": "e2e", "lastTransitionTime": stamp()}]}})
        tenant = await harness.tenant({"gpu-h100": 4})
        job_id = await harness.admit(tenant, gpus=1, max_s=60, sim_s=1)

        def reserved_waiting() -> dict[str, Any] | None:
            wl = harness.workload(tenant, job_id)
            return wl if wl is not None and kw.condition_true(wl, "QuotaReserved") else None

        waiting = await wait_for("quota reserved, check Pending", reserved_waiting)
        assert not kw.condition_true(waiting, "Admitted")
        assert harness.events.one(job_id, ADMITTED) is None  # held: nothing metered
        custom.patch_namespaced_custom_object_status(
            group, version, f"kestrel-{tenant}", "workloads", waiting["metadata"]["name"],
            {"status": {"admissionChecks": [{"name": check, "state": "Ready", "message": "ok",
                                             "lastTransitionTime": stamp()}]}})
        admitted = await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))
        wl = harness.workload(tenant, job_id)
        assert wl is not None
        reserved, ready = condition(wl, "QuotaReserved"), condition(wl, "Admitted")
        assert reserved is not None and ready is not None
        assert admitted.time_us == time_us(ready["lastTransitionTime"])
        assert admitted.time_us >= time_us(reserved["lastTransitionTime"])
        await wait_for("FINISHED", lambda: harness.events.one(job_id, FINISHED))
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(group, version, "admissionchecks", check)


async def test_an_operator_reads_the_nodes_and_a_tenants_queue_usage(harness: Harness) -> None:
    """ListNodes / ListClusterQueues: the console's cluster view, from the apiserver."""
    tenant = await harness.tenant({"gpu-h100": 4})
    harness.start()
    job_id = await harness.admit(tenant, gpus=2, max_s=300, sim_s=120, flavor="gpu-h100")
    await wait_for("ADMITTED", lambda: harness.events.one(job_id, ADMITTED))
    async with grpc.aio.insecure_channel(harness.address) as channel:
        stub = placer_pb2_grpc.PlacerStub(channel)
        nodes = (await stub.ListNodes(placer_pb2.ListNodesRequest(), timeout=30)).nodes
        by = {n.name: n for n in nodes}
        cpu = by[kc.NODE_NAME]
        assert (cpu.pool, cpu.simulated, cpu.ready, cpu.gpus) == ("cpu", False, True, 0)
        gpu = [n for n in nodes if n.pool == "gpu"]  # every GPU node is a KWOK fake
        assert gpu and all(n.simulated and n.gpus > 0 and n.flavor for n in gpu)
        # The same split kubectl shows by label (KWOK's simulated CPU pool included).
        kwok = kc.kubectl("get", "nodes", "-l", kc.SIMULATED_NODE_SELECTOR, "-o",
                          "jsonpath={.items[*].metadata.name}", check=True).stdout.split()
        assert sorted(kwok) == sorted(n.name for n in nodes if n.simulated)

        async def usage() -> placer_pb2.QueueResourceUsage | None:
            queues = (await stub.ListClusterQueues(placer_pb2.ListClusterQueuesRequest(
                tenant=tenant), timeout=30)).cluster_queues
            assert [q.name for q in queues] == [f"kestrel-{tenant}"]
            assert queues[0].tenant == tenant
            got = {(r.flavor, r.resource): r for r in queues[0].resources}
            h100 = got[("gpu-h100", "nvidia.com/gpu")]
            assert h100.nominal_quota == "4"
            return h100 if h100.admitted == "2" else None

        h100 = await wait_until("Kueue's usage of the admitted job", usage, WAIT_S)
        assert h100.reserved == "2" and h100.borrowed == "0"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListClusterQueues(placer_pb2.ListClusterQueuesRequest(
                tenant=f"{tenant},kestrel.dev/tenant!=x"), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- endpoint replicas nothing would stop (issue 56) -------------------------------


class GatedKube(Kube):
    """The real apiserver, with each create_job held at its start until `go` is set:
    a Cancel then arrives while the Job is being created, every time."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(kubeconfig)
        self.entered = threading.Event()
        self.go = threading.Event()

    def create_job(self, body: Any) -> tuple[dict[str, Any], bool]:
        self.entered.set()
        self.go.wait(60)
        return super().create_job(body)


async def test_a_cancel_that_arrives_while_the_job_is_being_created_still_deletes_it(
        harness: Harness, placer_db: str) -> None:
    """A DeleteEndpoint that reached the placer while a replica's Job was being created
    found no Job and deleted nothing; the Job then made ran with nothing to stop it."""
    tenant = await harness.tenant({"gpu-a10": 2})
    kube = GatedKube(str(kc.PATHS.kubeconfig))
    published: list[Any] = []

    async def publish(event: Any) -> None:
        published.append(event)

    pool = await asyncpg.create_pool(placer_db, min_size=1, max_size=2)
    try:
        placer = Placer(kube, PlacerStore(pool), publish, PlacerSettings(
            runway_check="", worker_image="kestrel.dev/kestrel:e2e"))
        job_id = f"job-{uuid.uuid4().hex[:16]}"
        job = AdmittedJob(job_id, tenant, "embed-r0", 1, "gpu-a10", 60, 0, {},
                          endpoint_id="ep-00000000000000e2")
        placing = asyncio.create_task(placer.place(job, cancelled=False))
        await asyncio.to_thread(kube.entered.wait, 60)
        deleted, _ = await placer.cancel(tenant, job_id)
        assert not deleted  # no Job yet: the cancel alone deletes nothing
        kube.go.set()
        assert await placing is None  # placed, seen cancelled meanwhile, deleted
        await wait_for("the Job deleted", lambda: not harness.jobs(tenant, job_id))
        await asyncio.sleep(1.0)
        assert harness.jobs(tenant, job_id) == []
        assert not [e for e in published if e.workload_id == job_id and e.type == QUEUED]
    finally:
        kube.go.set()
        await pool.close()


async def test_the_reconcile_ends_a_replica_whose_endpoint_is_gone_and_keeps_the_rest(
        harness: Harness) -> None:
    """Kubernetes is the truth: a replica Job of a deleted endpoint is ended (allocation
    closed at that instant, Job deleted, counted, alerted on); a recorded replica of a
    live endpoint, and one too young to be recorded yet, run on."""
    tenant = await harness.tenant({"gpu-a10": 4})
    live, gone = "ep-00000000000000a1", "ep-00000000000000a2"
    recorded, young, orphan = (f"job-{uuid.uuid4().hex[:16]}" for _ in range(3))
    conn = await asyncpg.connect(harness.dsn)
    try:
        for endpoint_id, deleted_us, replicas in ((live, 0, [recorded]),
                                                  (gone, now_us(), [orphan])):
            await conn.execute(
                "INSERT INTO endpoints (endpoint_id, tenant, name, spec, created_us, "
                "deleted_us, replicas) VALUES ($1, $2, $1, ''::bytea, $3, $4, $5)",
                endpoint_id, tenant, now_us(), deleted_us, replicas)
    finally:
        await conn.close()
    metrics = free_port()
    harness.start(KESTREL_PLACER_ORPHAN_S="1", KESTREL_PLACER_GPU_STANDINS="0",
                  KESTREL_WORKER_IMAGE="kestrel.dev/kestrel:e2e",
                  KESTREL_PLACER_METRICS_PORT=str(metrics))
    for job_id, endpoint_id in ((recorded, live), (young, live), (orphan, gone)):
        await harness.admit(tenant, flavor="gpu-a10", max_s=600, sim_s=600, job_id=job_id,
                            endpoint_id=endpoint_id)
    ended = await wait_for("the orphan's CANCELLED",
                           lambda: harness.events.one(orphan, CANCELLED))
    assert ended.reason == f"orphaned replica: its endpoint {gone} is deleted"
    await wait_for("the orphan's Job deleted", lambda: not harness.jobs(tenant, orphan))
    # ADMITTED first if Kueue got to it: the allocation then closed at the cancel
    if harness.events.one(orphan, ADMITTED) is not None:
        assert ended.gpus == 1
    await asyncio.sleep(3.0)  # three more reconciles
    for job_id in (recorded, young):
        assert len(harness.jobs(tenant, job_id)) == 1
        assert harness.events.one(job_id, CANCELLED) is None

    def counted() -> str | None:
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5
                                      ).read().decode()
        line = 'kestrel_placer_orphan_replicas_total{reason="endpoint_deleted"} 1.0'
        return line if line in text else None
    await wait_for("the orphan counted", counted)
