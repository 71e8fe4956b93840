"""Several admission replicas over one Postgres (issue 49, item 1): each with its own
books, batchers and pool, as separate processes have, deciding at the same time. They
give exactly the results one replica gives: a tenant whose budget covers k jobs gets k
admitted however its submissions are spread, never k + 1, and a hold freed on one
replica releases held work decided on another, once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import asyncpg
import grpc
import pytest

from kestrel.db import create_pool
from kestrel.jobs import JobRow
from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.devstack import port_map
from kestrel_tools.procs import ServiceProcess
from services.admission.core import Admission, Outcome, Submission
from services.admission.domain import JobAsk, JobState, Ruling
from services.admission.store import AdmissionStore
from tests.conftest import OPERATOR_TOKEN, Plane

pytestmark = pytest.mark.integration

PRICE = Decimal("0.001")  # per GPU-second: each job (1 GPU, 100 s) reserves 0.1
RESERVE = Decimal("0.1")
JOBS_EACH = 50
# How many jobs each tenant's credits cover exactly: 8 tenants x 50 = 400 submissions.
COVERS = {"none": 0, "one": 1, "seven": 7, "thirteen": 13, "quarter": 25, "most": 49,
          "all": 50, "more": 60}
SPEC = common_pb2.JobSpec(name="race", gpus=1, flavor="gpu-h100",
                          max_duration_s=100).SerializeToString()


async def _seed(owner: asyncpg.Connection, prefix: str) -> None:
    for name, k in COVERS.items():
        tenant = f"{prefix}-{name}"
        await owner.execute("INSERT INTO tenants (tenant, created_us) VALUES ($1, 1)", tenant)
        if k:  # a top-up is positive: the tenant covering none has no credits at all
            await owner.execute("INSERT INTO credits (tenant, top_up_id, amount, recorded_us) "
                                "VALUES ($1, $2, $3, 1)", tenant, f"t-{tenant}", RESERVE * k)
        await owner.execute(
            "INSERT INTO tenant_profiles (tenant, gpu_quota, rate_per_s, burst, created_us) "
            "VALUES ($1, '{\"gpu-h100\": 1000}', 1, 1, 1)", tenant)


async def _replicas(n: int, role_dsn: Callable[[str], str], pools: list[asyncpg.Pool]
                    ) -> list[Admission]:
    out = []
    for _ in range(n):
        pool = await create_pool(role_dsn("kestrel_admission"), max_size=4)
        pools.append(pool)

        async def publish(row: JobRow, prev: JobState | None) -> None:
            return None

        a = Admission(AdmissionStore(pool), publish)
        await a.load()
        a.prices = {"gpu-h100": PRICE}
        out.append(a)
    return out


def _submission(tenant: str, i: int) -> Submission:
    return Submission(JobAsk(f"{tenant}-{i}", tenant, 1, "gpu-h100", 100, 0), "race", SPEC,
                      f"key-{i}")


async def _submit_all(replicas: list[Admission], prefix: str) -> dict[str, list[Ruling]]:
    """Every tenant's 50 submissions at once, spread round robin over the replicas."""
    subs = [_submission(f"{prefix}-{name}", i) for i in range(JOBS_EACH) for name in COVERS]
    outs = await asyncio.gather(*(replicas[i % len(replicas)].admit_many([s])
                                  for i, s in enumerate(subs)))
    verdicts: dict[str, list[Ruling]] = {name: [] for name in COVERS}
    for (o,) in outs:
        assert isinstance(o, Outcome), o
        verdicts[o.job.tenant.split("-", 1)[1]].append(o.decision.verdict)
    return verdicts


async def _open_holds(owner: asyncpg.Connection, prefix: str) -> dict[str, Decimal]:
    rows = await owner.fetch("SELECT tenant, sum(amount) AS held FROM open_reservations "
                             "WHERE tenant LIKE $1 GROUP BY tenant", f"{prefix}-%")
    return {r["tenant"].split("-", 1)[1]: r["held"] for r in rows}


async def test_400_submits_across_three_replicas_admit_exactly_what_one_replica_does(
        owner: asyncpg.Connection, role_dsn: Callable[[str], str]) -> None:
    await _seed(owner, "one")
    await _seed(owner, "three")
    pools: list[asyncpg.Pool] = []
    try:
        (alone,) = await _replicas(1, role_dsn, pools)
        replicas = await _replicas(3, role_dsn, pools)
        by_one = await _submit_all([alone], "one")
        by_three = await _submit_all(replicas, "three")
        contended = sum(a.stale_rounds for a in replicas)
    finally:
        for p in pools:
            await p.close()
    expected = {name: min(k, JOBS_EACH) for name, k in COVERS.items()}
    assert {n: v.count(Ruling.ADMITTED) for n, v in by_one.items()} == expected
    assert {n: v.count(Ruling.ADMITTED) for n, v in by_three.items()} == expected
    # The rest as one replica answers them (held; rejected for the tenant with nothing).
    assert {n: sorted(v) for n, v in by_three.items()} == {
        n: sorted(v) for n, v in by_one.items()}
    # The replicas really raced: some decisions were fenced out and made again.
    assert contended > 0
    held = await _open_holds(owner, "three")
    assert {n: held.get(n, Decimal(0)) for n in COVERS} == {
        n: RESERVE * k for n, k in expected.items()}
    assert await owner.fetchval("SELECT count(*) FROM jobs WHERE tenant LIKE 'three-%'") == 400
    # Each submission was stored by one statement that moved its tenant's book on once
    # (a fenced-out one wrote nothing), whichever replica made it: 50 versions each.
    versions = {r["tenant"]: r["version"] for r in await owner.fetch(
        "SELECT tenant, version FROM admission_books WHERE tenant LIKE 'three-%'")}
    assert versions == {f"three-{n}": JOBS_EACH for n in COVERS}


async def test_holds_freed_on_one_replica_release_held_jobs_once_whichever_decides(
        owner: asyncpg.Connection, role_dsn: Callable[[str], str]) -> None:
    await _seed(owner, "free")
    pools: list[asyncpg.Pool] = []
    try:
        replicas = await _replicas(3, role_dsn, pools)
        await _submit_all(replicas, "free")
        admitted = await owner.fetch(
            "SELECT tenant, job_id FROM jobs WHERE tenant LIKE 'free-%' AND state = $1",
            int(JobState.ADMITTED))
        # Cancel every admitted job (none ran: each frees its whole hold), each on a
        # replica that did not necessarily admit it, all at once; then every replica
        # re-evaluates every tenant at once, as a runway event makes them.
        await asyncio.gather(*(replicas[i % 3].cancel(r["tenant"], r["job_id"], "freed")
                               for i, r in enumerate(admitted)))
        await asyncio.gather(*(a.reevaluate(f"free-{n}") for a in replicas for n in COVERS))
    finally:
        for p in pools:
            await p.close()
    states = await owner.fetch(
        "SELECT tenant, state, count(*) AS n FROM jobs WHERE tenant LIKE 'free-%' "
        "GROUP BY 1, 2")
    now_admitted = {r["tenant"].split("-", 1)[1]: r["n"] for r in states
                    if r["state"] == int(JobState.ADMITTED)}
    expected = {n: min(k, JOBS_EACH - min(k, JOBS_EACH)) for n, k in COVERS.items()}
    assert {n: now_admitted.get(n, 0) for n in COVERS} == expected
    held = await _open_holds(owner, "free")
    assert {n: held.get(n, Decimal(0)) for n in COVERS} == {
        n: RESERVE * k for n, k in expected.items()}


# --- as processes: two admission replicas behind one gateway -------------------------

OP = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)


@pytest.fixture
def two_admissions(service_env: dict[str, str], tmp_path: Path
                   ) -> Iterator[tuple[Plane, ServiceProcess]]:
    """The plane with a second admission process on its own port; the gateway dials
    both (client-side round robin over the list, as on loopback)."""
    p = Plane(service_env, tmp_path)
    second = f"127.0.0.1:{port_map('admission-b')['admission-b']}"
    p.env["KESTREL_ADMISSION_ADDR"] = f"{p.address('admission')},{second}"
    extra = ServiceProcess("admission", {**p.env, "KESTREL_ADMISSION_PORT":
                                         second.rsplit(":", 1)[1]},
                           second, tmp_path / "admission-b.log")
    try:
        for name in ("meter", "gateway", "admission"):
            p.start(name)
        extra.start()
        yield p, extra
    finally:
        extra.stop()
        p.stop_all()


def _decided(log: Path) -> int:
    return sum(" submitted -> " in line for line in log.read_text().splitlines())


async def test_a_gateway_spreads_submits_over_two_admissions_and_the_budget_holds(
        two_admissions: tuple[Plane, ServiceProcess], tmp_path: Path) -> None:
    plane, extra = two_admissions
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        # h100 costs 0.01 per GPU-second here: each job (1 GPU, 100 s) reserves 1 credit.
        await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
            tenant=gateway_pb2.Tenant(tenant="pair", gpu_quota={"gpu-h100": 100},
                                      rate_limit=gateway_pb2.RateLimit(per_s=1000,
                                                                       burst=1000)),
            initial_credits="7"), metadata=OP)
        key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant="pair",
                                                                      name="t"), metadata=OP)
        md = (("authorization", f"Bearer {key.secret}"),)

        async def submit(i: int) -> common_pb2.Job:
            resp = await stub.SubmitJob(gateway_pb2.SubmitJobRequest(
                spec=common_pb2.JobSpec(name="p", gpus=1, max_duration_s=100,
                                        flavor="gpu-h100"),
                idempotency_key=f"pair-{i}"), metadata=md)
            job: common_pb2.Job = resp.job
            return job

        # In waves: the gateway sends a burst to admission as one AdmitMany call, and
        # round robin spreads calls, not the jobs inside one.
        jobs = [j for wave in range(8) for j in await asyncio.gather(
            *(submit(wave * 5 + i) for i in range(5)))]
        states = [j.state for j in jobs]
        assert states.count(common_pb2.JOB_STATE_ADMITTED) == 7
        assert states.count(common_pb2.JOB_STATE_HELD) == 33
        # Both replicas decided some of them.
        first = plane.procs["admission"].log_path
        assert _decided(first) > 0 and _decided(extra.log_path) > 0
        assert _decided(first) + _decided(extra.log_path) == 40
        # One replica gone: the other answers every submission (the channel leaves the
        # dead one out), and the budget still holds.
        extra.stop()
        more = await asyncio.gather(*(submit(i) for i in range(40, 50)))
        assert {j.state for j in more} == {common_pb2.JOB_STATE_HELD}
