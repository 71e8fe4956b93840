"""The public API and admission over real Postgres, NATS and Redis processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal

import asyncpg
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from kestrel_sdk import AsyncClient, Client
from kestrel_sdk.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
)
from tests.conftest import OPERATOR_TOKEN, Plane
from tests.integration.helpers import eventually, publish_events, wev

pytestmark = pytest.mark.integration
S = common_pb2.JobState
Md = tuple[tuple[str, str], ...]
OP: Md = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)


@dataclass
class Api:
    stub: gateway_pb2_grpc.GatewayStub
    db: asyncpg.Connection
    plane: Plane

    async def tenant(self, name: str, credits: str, *, quota: dict[str, int] | None = None,
                     rate: float = 1000, burst: int = 1000) -> Md:
        await self.stub.CreateTenant(gateway_pb2.CreateTenantRequest(
            tenant=gateway_pb2.Tenant(tenant=name, gpu_quota=quota or {"gpu-h100": 8,
                                                                         "gpu-a10": 8},
                                      rate_limit=gateway_pb2.RateLimit(per_s=rate, burst=burst)),
            initial_credits=credits), metadata=OP)
        key = await self.stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(
            tenant=name, name="test"), metadata=OP)
        return (("authorization", f"Bearer {key.secret}"),)

    async def submit(self, key: Md, gpus: int = 1, seconds: int = 100,
                     flavor: str = "gpu-h100", **kw: object) -> common_pb2.Job:
        spec = common_pb2.JobSpec(name=str(kw.pop("name", "train")), gpus=gpus,
                                  max_duration_s=seconds, flavor=flavor,
                                  priority=int(kw.pop("priority", 0)))  # type: ignore[call-overload]
        resp = await self.stub.SubmitJob(gateway_pb2.SubmitJobRequest(
            spec=spec, idempotency_key=str(kw.pop("idem", ""))), metadata=key)
        job: common_pb2.Job = resp.job
        return job

    async def job(self, key: Md, job_id: str) -> common_pb2.Job:
        resp = await self.stub.GetJob(gateway_pb2.GetJobRequest(job_id=job_id), metadata=key)
        job: common_pb2.Job = resp.job
        return job


@pytest.fixture
async def api(plane: Plane, database: str) -> AsyncIterator[Api]:
    db = await asyncpg.connect(database)
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        yield Api(gateway_pb2_grpc.GatewayStub(ch), db, plane)
    await db.close()


# h100 costs 0.01 per GPU-second here: 1 GPU x 100 s reserves exactly 1 credit.

async def test_a_job_that_fits_is_admitted_and_its_reservation_shows_in_the_runway(
        api: Api) -> None:
    key = await api.tenant("fits", "10")
    job = await api.submit(key)
    assert (job.state, job.reserved) == (S.JOB_STATE_ADMITTED, "1")
    runway = (await api.stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=key)).runway
    assert (runway.reserved, runway.remaining) == ("1", "9")


async def test_a_job_that_exactly_fits_is_admitted_leaving_nothing(api: Api) -> None:
    key = await api.tenant("exact", "1")
    job = await api.submit(key)
    assert job.state == S.JOB_STATE_ADMITTED
    assert "0 remain" in job.reason


async def test_a_held_job_is_released_by_a_top_up(api: Api) -> None:
    key = await api.tenant("topup", "1")
    assert (await api.submit(key)).state == S.JOB_STATE_ADMITTED
    held = await api.submit(key, seconds=50)
    assert held.state == S.JOB_STATE_HELD and "held until" in held.reason
    await api.stub.TopUp(gateway_pb2.GatewayTopUpRequest(tenant="topup", amount="0.5"),
                         metadata=OP)
    now = await eventually(lambda: api.job(key, held.job_id),
                           lambda j: j.state == S.JOB_STATE_ADMITTED, timeout_s=15)
    assert now.state == S.JOB_STATE_ADMITTED


async def test_a_held_job_is_released_when_a_reservation_frees(api: Api, clean_bus: str) -> None:
    key = await api.tenant("frees", "1")
    first = await api.submit(key)
    held = await api.submit(key, seconds=50)
    assert held.state == S.JOB_STATE_HELD
    # The first job runs 10 s of its 100 s (what the placer reports from Kubernetes).
    t0 = 1_800_000_000_000_000
    await publish_events(clean_bus, [wev("a", "frees", first.job_id, 1, t0),
                                     wev("f", "frees", first.job_id, 3, t0 + 10_000_000)])
    now = await eventually(lambda: api.job(key, held.job_id),
                           lambda j: j.state == S.JOB_STATE_ADMITTED, timeout_s=15)
    assert now.state == S.JOB_STATE_ADMITTED
    done = await api.job(key, first.job_id)
    assert done.state == S.JOB_STATE_SUCCEEDED
    runway = (await api.stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=key)).runway
    assert (runway.charged, runway.reserved, runway.remaining) == ("0.1", "0.5", "0.4")


async def test_a_burst_of_workload_events_moves_every_job_through_its_states_in_order(
        api: Api, clean_bus: str) -> None:
    """Admission applies a fetched batch of the placer's events a wave at a time, one
    statement each: every job still passes each state once, in stream order."""
    key = await api.tenant("burst", "100")
    jobs = [(await api.submit(key)).job_id for _ in range(6)]
    t0 = 1_800_000_000_000_000
    steps = (6, 1, 2, 3)  # QUEUED, ADMITTED (runs), STARTED, FINISHED
    await publish_events(clean_bus, [
        wev(f"{job}-{n}", "burst", job, typ, t0 + n * 1_000_000 + i)
        for n, typ in enumerate(steps) for i, job in enumerate(jobs)])
    await eventually(lambda: api.db.fetchval(
        "SELECT count(*) FROM jobs WHERE tenant = 'burst' AND state = $1",
        int(S.JOB_STATE_SUCCEEDED)), lambda n: n == len(jobs), timeout_s=15)
    rows = await api.db.fetch(
        "SELECT job_id, from_state, to_state FROM job_transitions WHERE tenant = 'burst' "
        "ORDER BY transition_id")
    for job in jobs:
        assert [(r["from_state"], r["to_state"]) for r in rows if r["job_id"] == job] == [
            (0, S.JOB_STATE_ADMITTED), (S.JOB_STATE_ADMITTED, S.JOB_STATE_QUEUED),
            (S.JOB_STATE_QUEUED, S.JOB_STATE_RUNNING), (S.JOB_STATE_RUNNING, S.JOB_STATE_SUCCEEDED)]
    done = await api.job(key, jobs[0])
    assert done.flavor == "gpu-h100" and done.state == S.JOB_STATE_SUCCEEDED


@pytest.mark.parametrize(("name", "kwargs", "quota", "why"), [
    ("a job beyond the whole budget is rejected", {"seconds": 5000}, None, "whole budget"),
    ("a job beyond the tenant's quota is rejected", {"gpus": 4}, {"gpu-h100": 2}, "quota"),
    ("a job on a flavor without quota is rejected", {"flavor": "gpu-a10"}, {"gpu-h100": 8},
     "quota"),
], ids=lambda x: x if isinstance(x, str) else "")
async def test_a_job_that_can_never_fit_is_rejected(api: Api, name: str, kwargs: dict[str, int],
                                                    quota: dict[str, int] | None,
                                                    why: str) -> None:
    key = await api.tenant("never", "10", quota=quota)
    job = await api.submit(key, **kwargs)  # type: ignore[arg-type]
    assert job.state == S.JOB_STATE_REJECTED and why in job.reason
    assert await api.db.fetchval("SELECT count(*) FROM reservations") == 0


async def test_an_explicit_borrow_raises_what_a_tenant_may_hold_and_is_kept(api: Api) -> None:
    """Quota is a cap; the operator's --borrow is the one way past it."""
    await api.stub.CreateTenant(gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant="lender", gpu_quota={"gpu-h100": 2},
                                  gpu_borrow={"gpu-h100": 4}),
        initial_credits="100"), metadata=OP)
    key = (("authorization", "Bearer " + (await api.stub.CreateApiKey(
        gateway_pb2.CreateApiKeyRequest(tenant="lender", name="t"), metadata=OP)).secret),)
    assert (await api.submit(key, gpus=6)).state == S.JOB_STATE_ADMITTED  # 2 + 4
    assert (await api.submit(key, gpus=7)).state == S.JOB_STATE_REJECTED
    got = (await api.stub.GetTenant(gateway_pb2.GetTenantRequest(tenant="lender"),
                                    metadata=OP)).tenant
    assert (dict(got.gpu_quota), dict(got.gpu_borrow)) == ({"gpu-h100": 2}, {"gpu-h100": 4})
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await api.stub.CreateTenant(gateway_pb2.CreateTenantRequest(
            tenant=gateway_pb2.Tenant(tenant="other", gpu_borrow={"gpu-x": 1})), metadata=OP)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gpu_borrow" in (bad.value.details() or "")


async def test_racing_submissions_never_reserve_more_than_the_budget(api: Api) -> None:
    key = await api.tenant("race", "10")
    jobs = await asyncio.gather(*(api.submit(key) for _ in range(40)))
    states = [j.state for j in jobs]
    assert states.count(S.JOB_STATE_ADMITTED) == 10
    assert states.count(S.JOB_STATE_HELD) == 30
    assert await api.db.fetchval(
        "SELECT sum(amount) FROM reservations WHERE tenant = 'race'") == Decimal(10)


async def test_held_jobs_are_released_by_priority_then_first_come(api: Api) -> None:
    key = await api.tenant("order", "1")
    await api.submit(key)
    low = await api.submit(key, seconds=40, priority=0)
    high = await api.submit(key, seconds=40, priority=5)
    later = await api.submit(key, seconds=40, priority=0)
    assert {low.state, high.state, later.state} == {S.JOB_STATE_HELD}
    await api.stub.TopUp(gateway_pb2.GatewayTopUpRequest(tenant="order", amount="0.8"),
                         metadata=OP)
    await eventually(lambda: api.job(key, low.job_id),
                     lambda j: j.state == S.JOB_STATE_ADMITTED, timeout_s=15)
    states = [(await api.job(key, j.job_id)).state for j in (high, low, later)]
    assert states == [S.JOB_STATE_ADMITTED, S.JOB_STATE_ADMITTED, S.JOB_STATE_HELD]


async def test_the_same_idempotency_key_returns_the_same_job(api: Api) -> None:
    key = await api.tenant("idem", "10")
    a = await api.submit(key, idem="nightly-1")
    b = await api.submit(key, idem="nightly-1")
    assert a.job_id == b.job_id
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 1


async def test_watch_streams_a_held_job_until_it_is_admitted_then_cancelled(api: Api) -> None:
    key = await api.tenant("watch", "1")
    await api.submit(key)
    held = await api.submit(key)
    seen: list[int] = []

    async def watch() -> None:
        async for resp in api.stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=held.job_id),
                                            metadata=key):
            seen.append(resp.job.state)

    watcher = asyncio.create_task(watch())
    await eventually(lambda: asyncio.sleep(0, result=list(seen)), lambda s: len(s) >= 1)
    await api.stub.TopUp(gateway_pb2.GatewayTopUpRequest(tenant="watch", amount="1"), metadata=OP)
    await eventually(lambda: asyncio.sleep(0, result=list(seen)), lambda s: len(s) >= 2)
    await api.stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=held.job_id), metadata=key)
    await asyncio.wait_for(watcher, 15)
    assert seen == [S.JOB_STATE_HELD, S.JOB_STATE_ADMITTED, S.JOB_STATE_CANCELLED]
    # Cancelled before it ran: its reservation is released.
    assert await api.db.fetchval(
        "SELECT count(*) FROM reservation_releases WHERE reservation_id = $1", held.job_id) == 1


async def test_another_tenants_job_is_not_found_and_nothing_changes(api: Api) -> None:
    alice = await api.tenant("alice", "10")
    mallory = await api.tenant("mallory", "10")
    job = await api.submit(alice)
    for call, req in ((api.stub.GetJob, gateway_pb2.GetJobRequest(job_id=job.job_id)),
                      (api.stub.CancelJob, gateway_pb2.CancelJobRequest(job_id=job.job_id)),
                      (api.stub.WatchJob, gateway_pb2.WatchJobRequest(job_id=job.job_id))):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            result = call(req, metadata=mallory)
            if hasattr(result, "__aiter__"):
                async for _ in result:
                    pass
            else:
                await result
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert (await api.job(alice, job.job_id)).state == S.JOB_STATE_ADMITTED
    listed = await api.stub.ListJobs(gateway_pb2.ListJobsRequest(), metadata=mallory)
    assert list(listed.jobs) == []


async def test_the_operator_lists_every_tenants_jobs_by_tenant_and_state_page_by_page(
        api: Api) -> None:
    """ListAllJobs: the console's jobs view. The database is shared by this module's tests,
    so the tenants here are new and the listing is read for them."""
    a = await api.tenant("lista", "1")
    b = await api.tenant("listb", "10")
    a1 = await api.submit(a)  # reserves all of lista's 1 credit
    a2 = await api.submit(a, seconds=50)  # so this one is held
    b1 = await api.submit(b)
    assert (a1.state, a2.state, b1.state) == (S.JOB_STATE_ADMITTED, S.JOB_STATE_HELD,
                                              S.JOB_STATE_ADMITTED)

    async def every(tenant: str = "", states: tuple[int, ...] = (),
                    page_size: int = 1) -> list[common_pb2.Job]:
        out: list[common_pb2.Job] = []
        token = ""
        while True:
            r = await api.stub.ListAllJobs(gateway_pb2.ListAllJobsRequest(
                tenant=tenant, states=states, page_size=page_size, page_token=token),  # type: ignore[arg-type]
                metadata=OP)
            out += r.jobs
            if not (token := r.next_page_token):
                return out

    ours = {a1.job_id, a2.job_id, b1.job_id}
    listed = [j for j in await every() if j.job_id in ours]  # paged one job at a time
    assert [j.job_id for j in listed] == [a1.job_id, a2.job_id, b1.job_id]  # submission order
    assert {j.tenant for j in listed} == {"lista", "listb"}
    assert [j.job_id for j in await every("lista")] == [a1.job_id, a2.job_id]
    held = await every("lista", (S.JOB_STATE_HELD,))
    assert [j.job_id for j in held] == [a2.job_id] and "held until" in held[0].reason
    assert await every("nobody") == []
    # The SDK's operator call (and `kestrel tenants jobs`) walks the same pages.
    address = api.plane.address("gateway")
    async with AsyncClient(address, operator_token=OPERATOR_TOKEN) as op:
        assert [j.job_id async for j in op.list_all_jobs("lista", ["held"], page_size=1)] == [
            a2.job_id]

    def sync_listings() -> tuple[list[str], list[str]]:
        with Client(address, operator_token=OPERATOR_TOKEN) as op:
            every_a = [j.job_id for j in op.list_all_jobs("lista", page_size=1)]
        with Client(address, api_key=a[0][1].removeprefix("Bearer ")) as tenant_a:
            own = [j.job_id for j in tenant_a.list_jobs(page_size=1)]
        return every_a, own
    assert await asyncio.to_thread(sync_listings) == ([a1.job_id, a2.job_id],) * 2
    # A token is bound to its query: reused for another tenant, it is refused.
    first = await api.stub.ListAllJobs(gateway_pb2.ListAllJobsRequest(
        tenant="lista", page_size=1), metadata=OP)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.stub.ListAllJobs(gateway_pb2.ListAllJobsRequest(
            tenant="listb", page_size=1, page_token=first.next_page_token), metadata=OP)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A tenant's key may not list across tenants.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.stub.ListAllJobs(gateway_pb2.ListAllJobsRequest(), metadata=b)
    assert err.value.code() in (grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.UNAUTHENTICATED)


async def test_over_the_rate_limit_answers_resource_exhausted_with_retry_info(api: Api) -> None:
    key = await api.tenant("slow", "10", rate=1, burst=2)
    for _ in range(2):
        await api.stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=key)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=key)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(err.value)
    assert status is not None
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert 0 < retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9 <= 1.0


def _job(job_id: str, tenant: str, seconds: int = 100, key: str = "",
         gpus: int = 1) -> common_pb2.Job:
    return common_pb2.Job(job_id=job_id, tenant=tenant, idempotency_key=key,
                          spec=common_pb2.JobSpec(name="train", gpus=gpus, flavor="gpu-h100",
                                                  max_duration_s=seconds))


async def _admit_batch(api: Api, jobs: list[common_pb2.Job]
                       ) -> list[admission_pb2.AdmitResult]:
    async with grpc.aio.insecure_channel(api.plane.address("admission")) as ch:
        resp = await admission_pb2_grpc.AdmissionStub(ch).AdmitBatch(
            admission_pb2.AdmitBatchRequest(
                requests=[admission_pb2.AdmitRequest(job=j) for j in jobs]))
    return list(resp.results)


def _error(result: admission_pb2.AdmitResult) -> status_pb2.Status:
    assert result.WhichOneof("result") == "error"
    return status_pb2.Status.FromString(result.error)


async def test_a_batch_is_decided_in_order_as_if_submitted_one_by_one(api: Api) -> None:
    await api.tenant("batch", "2.5")
    jobs = [_job(f"job-{i:016x}", "batch") for i in range(4)]
    results = await _admit_batch(api, [
        jobs[0], _job("job-00000000000000a0", "nobody"), jobs[1],
        _job("job-00000000000000b0", "batch", gpus=0), jobs[2], jobs[3]])
    ok = [r.response for r in results if r.WhichOneof("result") == "response"]
    assert [(r.job.job_id, r.decision) for r in ok] == [
        (jobs[0].job_id, admission_pb2.DECISION_ADMITTED),
        (jobs[1].job_id, admission_pb2.DECISION_ADMITTED),
        (jobs[2].job_id, admission_pb2.DECISION_HELD),
        (jobs[3].job_id, admission_pb2.DECISION_HELD)]
    assert [r.runway.remaining for r in ok] == ["1.5", "0.5", "0.5", "0.5"]
    assert _error(results[1]).code == grpc.StatusCode.NOT_FOUND.value[0]
    bad = _error(results[3])
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "job.spec.gpus" in bad.message
    # Stored in the order given (seq is the release order among equals), each with its
    # first transition; reservations for the admitted two only.
    assert [r["job_id"] for r in await api.db.fetch(
        "SELECT job_id FROM jobs WHERE tenant = 'batch' ORDER BY seq")] == [
        j.job_id for j in jobs]
    assert await api.db.fetchval(
        "SELECT count(*) FROM job_transitions WHERE tenant = 'batch'") == 4
    assert await api.db.fetchval(
        "SELECT sum(amount) FROM reservations WHERE tenant = 'batch'") == Decimal(2)
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE tenant = 'nobody'") == 0


async def test_a_key_or_job_id_already_used_in_or_before_a_batch_reports_that_job(
        api: Api) -> None:
    await api.tenant("again", "10")
    await api.tenant("elsewhere", "10")
    (first,) = await _admit_batch(api, [_job("job-0000000000000c01", "again", key="k1")])
    results = await _admit_batch(api, [
        _job("job-0000000000000c02", "again", key="k1"),  # the key of an earlier batch
        _job("job-0000000000000c03", "again", key="k2"),
        _job("job-0000000000000c04", "again", key="k2"),  # the same key twice here
        _job("job-0000000000000c01", "again"),  # an id already stored, no key
        _job("job-0000000000000c01", "elsewhere"),  # another tenant's id
        _job("job-0000000000000c05", "again"),
        _job("job-0000000000000c05", "again"),  # the same id twice here, no key
        _job("job-0000000000000c05", "again", key="k3")])  # ... and with a new key
    ids = [r.response.job.job_id for r in results[:4]]
    assert ids == [first.response.job.job_id, "job-0000000000000c03",
                   "job-0000000000000c03", first.response.job.job_id]
    assert _error(results[4]).code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert [r.response.job.job_id for r in results[5:7]] == ["job-0000000000000c05"] * 2
    assert _error(results[7]).code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 3
    assert await api.db.fetchval("SELECT sum(amount) FROM reservations") == Decimal(3)


async def test_a_batch_beyond_its_bounds_is_refused_whole_and_stores_nothing(api: Api) -> None:
    await api.tenant("bulk", "1000")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _admit_batch(api, [_job(f"job-{i:016x}", "bulk") for i in range(1001)])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = error_details_pb2.BadRequest()
    status = rpc_status.from_call(err.value)
    assert status is not None and status.details[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["requests"]
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 0
    assert len(await _admit_batch(api, [_job(f"job-{i:016x}", "bulk")
                                        for i in range(1000)])) == 1000
