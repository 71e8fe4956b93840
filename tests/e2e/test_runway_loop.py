"""The runway loop on the real cluster: gateway, admission (with its Kueue
AdmissionCheck controller), placer, meter, Kueue and KWOK, all real processes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from kestrel_sdk import JobState
from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw
from kestrel_tools.devstack import free_port
from tests.e2e.loop import Loop, allocation, in_state, plane_env, until, workload

pytestmark = pytest.mark.e2e
TOKEN = "kso_e2e-loop"


@pytest.fixture
async def loop(cluster_up: kc.ClusterInfo, service_env: dict[str, str], database: str,
               tmp_path: Path) -> AsyncIterator[Loop]:
    lp = Loop(plane_env(cluster_up, service_env, TOKEN), tmp_path, database)
    try:
        lp.start_all()
        yield lp
    finally:
        lp.stop_all()


async def test_a_held_job_waits_at_the_runway_check_and_kubectl_describe_says_why(
        loop: Loop) -> None:
    # 1 GPU x 100 s x 0.01 = 1 credit each: the first takes the whole budget.
    client = await loop.tenant("1")
    tenant = loop.tenants[-1]
    first = await client.submit_job(name="first", gpus=1, max_duration_s=100, sim_duration_s=60,
                                    flavor="gpu-h100")
    held = await client.submit_job(name="second", gpus=1, max_duration_s=100,
                                   sim_duration_s=2, flavor="gpu-h100")
    assert (first.state, held.state) == (JobState.ADMITTED, JobState.HELD)

    async def pending_with_reason() -> dict[str, Any] | None:
        w = await asyncio.to_thread(workload, tenant, held.job_id)
        checks = (w or {}).get("status", {}).get("admissionChecks", [])
        ours = [c for c in checks if c["name"] == "kestrel-runway"]
        return w if ours and ours[0]["state"] == "Pending" and "held by Kestrel" in ours[0].get(
            "message", "") else None

    w = await until("the held job's Workload Pending at the runway check", pending_with_reason)
    described = kc.kubectl("describe", "workload", "-n", f"kestrel-{tenant}",
                           w["metadata"]["name"], check=True).stdout
    assert "kestrel-runway" in described and "held by Kestrel for budget" in described
    assert not kw.condition_true(w, "Admitted")  # waiting: not metered

    async with loop.operator() as op:
        await op.top_up(tenant, "1")
    await until("the held job released and run", in_state(client, held.job_id,
                                                            JobState.SUCCEEDED))
    await client.close()


async def test_a_budget_cut_to_zero_evicts_running_work_metered_to_the_eviction_instant(
        loop: Loop) -> None:
    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    job = await client.submit_job(name="long", gpus=2, max_duration_s=300, sim_duration_s=240,
                                  flavor="gpu-a10")
    await until("running", in_state(client, job.job_id, JobState.RUNNING))

    async def admitted_at() -> int | None:
        # Read while it runs: at eviction Kueue flips Admitted to False, moving its time.
        w = await asyncio.to_thread(workload, tenant, job.job_id)
        c = kw.condition(w, "Admitted") if w else None
        return kw.k8s_time_s(c["lastTransitionTime"]) if c and c["status"] == "True" else None

    want_start = await until("Kueue's Admitted instant", admitted_at) * 1_000_000
    async with loop.operator() as op:
        runway = await client.runway()
        await op.adjust_credits(tenant, -runway.credits, note="e2e: budget withdrawn")
    evicted = await until("evicted", in_state(client, job.job_id, JobState.EVICTED))
    assert evicted.state is JobState.EVICTED
    # The job says why in words about the budget, not Kueue's "Deactivated".
    assert evicted.reason == f"evicted: tenant {tenant}'s budget is spent"
    w = await asyncio.to_thread(workload, tenant, job.job_id)
    assert w is not None and (w.get("spec") or {}).get("active") is False
    gone = kw.condition(w, "Evicted")
    assert gone is not None
    got = await until("the allocation closed", lambda: allocation(loop.dsn, job.job_id))
    want_end = kw.k8s_time_s(gone["lastTransitionTime"]) * 1_000_000
    assert got[2] == want_end and got[1] == 2 * (want_end - want_start)
    await client.close()


async def test_a_cancelled_job_is_metered_to_the_cancel_instant(loop: Loop) -> None:
    client = await loop.tenant("10")
    job = await client.submit_job(name="cancel-me", gpus=1, max_duration_s=300,
                                  sim_duration_s=240, flavor="gpu-h100")
    await until("running", in_state(client, job.job_id, JobState.RUNNING))
    await client.cancel_job(job.job_id, reason="e2e")
    got = await until("the allocation closed", lambda: allocation(loop.dsn, job.job_id))
    conn = await asyncpg.connect(loop.dsn)
    cancelled = await conn.fetchval(
        "SELECT time_us FROM workload_events WHERE workload_id = $1 AND type = 7", job.job_id)
    started = await conn.fetchval(
        "SELECT time_us FROM workload_events WHERE workload_id = $1 AND type = 1", job.job_id)
    # A cancel is its own event on the bus, never a failure.
    failures = await conn.fetchval(
        "SELECT count(*) FROM workload_events WHERE workload_id = $1 AND type = 5", job.job_id)
    await conn.close()
    assert cancelled is not None and failures == 0
    assert got[2] == cancelled and got[1] == cancelled - started
    assert (await client.get_job(job.job_id)).state is JobState.CANCELLED
    await client.close()


async def test_a_job_without_a_simulated_duration_succeeds_inside_its_bound(
        loop: Loop) -> None:
    """The README's `kestrel submit --max-duration ...` with no simulated duration: the
    job ends SUCCEEDED just inside activeDeadlineSeconds, not FAILED by its deadline,
    and its ledger equals gpus x Kueue's own times."""
    client = await loop.tenant("10")
    tenant = loop.tenants[-1]
    job = await client.submit_job(name="whole-bound", gpus=1, max_duration_s=8,
                                  flavor="gpu-h100")
    done = await until("ended", in_state(client, job.job_id, JobState.SUCCEEDED,
                                         JobState.FAILED))
    assert done.state is JobState.SUCCEEDED, done.reason
    got = await until("closed", lambda: allocation(loop.dsn, job.job_id))
    want = await asyncio.to_thread(kw.gpu_seconds_by_job, [f"kestrel-{tenant}"])
    assert got[1] == int(want[job.job_id] * 1_000_000)
    assert got[1] <= 8 * 1_000_000
    await client.close()


async def test_kill_9_of_placer_and_admission_mid_scenario_loses_nothing(loop: Loop) -> None:
    client = await loop.tenant("100")
    tenant = loop.tenants[-1]
    jobs = [await client.submit_job(name=f"j{i}", gpus=1, max_duration_s=60, sim_duration_s=3,
                                    flavor="gpu-h100") for i in range(6)]
    loop.procs["placer"].kill9()
    loop.procs["admission"].kill9()
    loop.start("admission")
    loop.start("placer")
    more = [await client.submit_job(name=f"k{i}", gpus=1, max_duration_s=60, sim_duration_s=3,
                                    flavor="gpu-a10") for i in range(4)]
    for j in [*jobs, *more]:
        await until(f"{j.spec.name} succeeded", in_state(client, j.job_id, JobState.SUCCEEDED))
    k8s_jobs = kc.kubectl("get", "jobs", "-n", f"kestrel-{tenant}", "-o", "name",
                          check=True).stdout.split()
    assert sorted(k8s_jobs) == sorted(f"job.batch/{j.job_id}" for j in [*jobs, *more])
    want = await asyncio.to_thread(kw.gpu_seconds_by_job, [f"kestrel-{tenant}"])
    for j in [*jobs, *more]:
        got = await until("closed", lambda j=j: allocation(loop.dsn, j.job_id))  # type: ignore[misc]
        assert got[1] == int(want[j.job_id] * 1_000_000)
    await client.close()


def _lease_holder(name: str) -> str:
    return kc.kubectl("get", "lease", "-n", "default", name, "-o",
                      "jsonpath={.spec.holderIdentity}", check=False).stdout


async def test_of_two_admission_replicas_the_lease_holder_runs_the_check_and_the_other_takes_over(
        cluster_up: kc.ClusterInfo, service_env: dict[str, str], database: str,
        tmp_path: Path) -> None:
    """Two admission replicas behind the gateway (both decide submits) and one Lease:
    only its holder patches the runway check. After kill -9 of the holder the other
    takes the Lease and releases a held job at a top-up, through the check."""
    env = plane_env(cluster_up, service_env, TOKEN)
    lease, second = f"kestrel-admission-{uuid.uuid4().hex[:6]}", free_port()
    env |= {"KESTREL_ADMISSION_LEASE": lease, "KESTREL_ADMISSION_LEASE_S": "3",
            "KESTREL_ADMISSION_ADDR": f"{env['KESTREL_ADMISSION_ADDR']},127.0.0.1:{second}"}
    lp = Loop(env, tmp_path, database)
    try:
        lp.start_all()
        replicas = [lp.procs["admission"], lp.start("admission", port=second)]
        leader = await until("one admission replica to hold the Lease", lambda: asyncio.sleep(
            0, next((p for p in replicas if f"-{p.pid}-" in _lease_holder(lease)), None)))
        other = next(p for p in replicas if p is not leader)
        client = await lp.tenant("1")
        tenant = lp.tenants[-1]
        jobs = [await client.submit_job(name=f"j{i}", gpus=1, max_duration_s=100,
                                        sim_duration_s=60 if i == 0 else 2, flavor="gpu-h100")
                for i in range(2)]
        assert [j.state for j in jobs] == [JobState.ADMITTED, JobState.HELD]

        async def pending() -> dict[str, Any] | None:
            w = await asyncio.to_thread(workload, tenant, jobs[1].job_id)
            ours = [c for c in (w or {}).get("status", {}).get("admissionChecks", [])
                    if c["name"] == "kestrel-runway"]
            return w if ours and ours[0]["state"] == "Pending" else None

        await until("the held job's Workload Pending at the runway check", pending)

        def patched(p: Any) -> bool:
            return b"runway_check: check " in p.log_path.read_bytes()

        # Kueue itself lists a new check as Pending, so wait for the holder's own patch.
        await until("the Lease holder to patch the check",
                    lambda: asyncio.sleep(0, patched(leader) or None))
        assert not patched(other), "only the Lease holder patches the check"
        leader.kill9()
        killed = time.monotonic()
        async with lp.operator() as op:
            await op.top_up(tenant, "1")
        await until("the held job released and run", in_state(client, jobs[1].job_id,
                                                                JobState.RUNNING,
                                                                JobState.SUCCEEDED))
        print(f"\nadmission hand-over: the held job ran {time.monotonic() - killed:.1f} s "
              "after kill -9 of the Lease holder (Lease 3 s)")
        assert f"-{other.pid}-" in _lease_holder(lease)
        await until("the released job succeeded", in_state(client, jobs[1].job_id,
                                                              JobState.SUCCEEDED))
        await client.close()
    finally:
        lp.stop_all()
        kc.kubectl("delete", "lease", "-n", "default", lease, "--ignore-not-found",
                   check=False)
