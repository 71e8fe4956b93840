"""services.gateway.core: the order of calls across services and what a partial
failure leaves behind, with the store and the admission, meter and placer stubs
behind small fakes (the real ones are exercised by the integration tier)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

import grpc
import pytest

from kestrel.errors import (
    AlreadyExists,
    FieldViolation,
    InvalidArgument,
    NotFound,
    Unavailable,
    to_status,
)
from kestrel.jobs import JobRow, JobState
from kestrel_sdk.v1 import admission_pb2, common_pb2, meter_pb2, placer_pb2
from services.gateway.core import Gateway, ProfileChange, changed
from services.gateway.store import Profile

ACME = Profile("acme", "Acme", {"gpu-h100": 2}, 5.0, 10, False, 1, {"gpu-a10": 1})


def unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), "down")


@dataclass
class Store:
    profiles: dict[str, Profile] = field(default_factory=dict)
    jobs: dict[tuple[str, str], JobRow] = field(default_factory=dict)
    insert_loses_race: bool = False

    async def profile(self, tenant: str) -> Profile | None:
        return self.profiles.get(tenant)

    async def insert_profile(self, p: Profile) -> bool:
        if self.insert_loses_race:
            return False
        self.profiles[p.tenant] = p
        return True

    async def update_profile(self, p: Profile) -> Profile | None:
        if p.tenant not in self.profiles:
            return None
        self.profiles[p.tenant] = p
        return p

    async def job(self, tenant: str, job_id: str) -> JobRow | None:
        return self.jobs.get((tenant, job_id))

    async def flavors(self) -> set[str]:
        return {"gpu-h100", "gpu-a10"}


@dataclass
class Stubs:
    """Admission, meter and placer at once: each call is recorded in order."""

    calls: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    refuse: dict[str, Exception] = field(default_factory=dict)  # AdmitBatch, per job id

    def __getattr__(self, method: str) -> Any:
        async def rpc(request: Any, **_: Any) -> Any:  # timeout=
            self.calls.append(method)
            if method in self.fail:
                raise unavailable()
            if method == "CreateAccount":
                return meter_pb2.CreateAccountResponse(
                    runway=common_pb2.Runway(tenant=request.tenant,
                                             credits=request.initial_credits))
            if method == "AdmitBatch":
                return admission_pb2.AdmitBatchResponse(results=[
                    admission_pb2.AdmitResult(error=to_status(self.refuse[r.job.job_id])
                                              .SerializeToString())
                    if r.job.job_id in self.refuse else
                    admission_pb2.AdmitResult(response=admission_pb2.AdmitResponse(job=r.job))
                    for r in request.requests])
            if method in ("Admit", "Release"):
                job = common_pb2.Job(job_id=getattr(request, "job_id", "") or request.job.job_id)
                return (admission_pb2.AdmitResponse(job=job) if method == "Admit"
                        else admission_pb2.ReleaseResponse(job=job))
            if method == "EnsureTenant":
                assert [q.flavor for q in request.quota] == sorted(q.flavor for q in request.quota)
                return placer_pb2.EnsureTenantResponse()
            return None
        return rpc


def gateway(store: Store, stubs: Stubs, placed: bool = True) -> tuple[Gateway, list[str]]:
    forgot: list[str] = []
    core = Gateway(cast(Any, store), cast(Any, stubs), cast(Any, stubs),
                   cast(Any, stubs) if placed else None, forgot.append)
    return core, forgot


def row(tenant: str, job_id: str) -> JobRow:
    return JobRow(job_id, tenant, b"", JobState.ADMITTED, "", Decimal(0), "", "", "", "", 1, 0,
                  0, 0, 1, 0, 1, 60)


async def test_a_tenant_is_opened_at_the_meter_then_profiled_then_given_queues() -> None:
    store, stubs = Store(), Stubs()
    core, forgot = gateway(store, stubs)
    p, runway = await core.create_tenant(ACME, "100")
    assert stubs.calls == ["CreateAccount", "EnsureTenant"]
    assert store.profiles["acme"] == p and runway.credits == "100" and forgot == ["acme"]


async def test_a_meter_that_is_away_leaves_no_profile_behind() -> None:
    store, stubs = Store(), Stubs(fail={"CreateAccount"})
    core, _ = gateway(store, stubs)
    with pytest.raises(Unavailable):
        await core.create_tenant(ACME, "100")
    assert store.profiles == {}  # no key could reach a tenant without a budget


async def test_an_existing_tenant_is_refused_before_the_meter_is_asked() -> None:
    store, stubs = Store(profiles={"acme": ACME}), Stubs()
    core, _ = gateway(store, stubs)
    with pytest.raises(AlreadyExists):
        await core.create_tenant(ACME, "100")
    assert stubs.calls == []


async def test_a_create_that_loses_the_race_for_the_profile_is_refused() -> None:
    store, stubs = Store(insert_loses_race=True), Stubs()
    core, _ = gateway(store, stubs)
    with pytest.raises(AlreadyExists):
        await core.create_tenant(ACME, "100")
    assert stubs.calls == ["CreateAccount"]  # idempotent: the winner's account stands


async def test_queues_are_best_effort_a_placer_that_is_away_does_not_fail_the_create() -> None:
    store, stubs = Store(), Stubs(fail={"EnsureTenant"})
    core, _ = gateway(store, stubs)
    await core.create_tenant(ACME, "0")
    assert "acme" in store.profiles


async def test_without_a_placer_no_queue_is_asked_for() -> None:
    store, stubs = Store(), Stubs()
    core, _ = gateway(store, stubs, placed=False)
    await core.create_tenant(ACME, "0")
    assert stubs.calls == ["CreateAccount"]


@pytest.mark.parametrize(("change", "want"), [
    pytest.param(ProfileChange(), ACME, id="an empty change keeps every field"),
    pytest.param(ProfileChange(display_name="New"), Profile(
        "acme", "New", {"gpu-h100": 2}, 5.0, 10, False, 1, {"gpu-a10": 1}),
        id="a name replaces the name"),
    pytest.param(ProfileChange(gpu_quota={"gpu-a10": 4}), Profile(
        "acme", "Acme", {"gpu-a10": 4}, 5.0, 10, False, 1, {"gpu-a10": 1}),
        id="a quota replaces the whole quota"),
    pytest.param(ProfileChange(gpu_borrow={"gpu-h100": 3}), Profile(
        "acme", "Acme", {"gpu-h100": 2}, 5.0, 10, False, 1, {"gpu-a10": 1, "gpu-h100": 3}),
        id="borrowing merges per flavor"),
    pytest.param(ProfileChange(rate=(1.5, 3)), Profile(
        "acme", "Acme", {"gpu-h100": 2}, 1.5, 3, False, 1, {"gpu-a10": 1}),
        id="a rate limit replaces rate and burst together"),
])
def test_changed(change: ProfileChange, want: Profile) -> None:
    assert changed(ACME, change) == want


async def test_an_update_forgets_the_cached_profile_and_follows_with_queues() -> None:
    store, stubs = Store(profiles={"acme": ACME}), Stubs()
    core, forgot = gateway(store, stubs)
    p = await core.update_tenant("acme", ProfileChange(gpu_quota={"gpu-h100": 8}))
    assert p.gpu_quota == {"gpu-h100": 8} == store.profiles["acme"].gpu_quota
    assert forgot == ["acme"] and stubs.calls == ["EnsureTenant"]


async def test_suspending_changes_the_profile_only() -> None:
    store, stubs = Store(profiles={"acme": ACME}), Stubs()
    core, forgot = gateway(store, stubs)
    assert (await core.suspend_tenant("acme", True)).suspended
    assert forgot == ["acme"] and stubs.calls == []


async def test_an_unknown_tenant_is_not_found_for_update_and_suspend() -> None:
    core, _ = gateway(Store(), Stubs())
    with pytest.raises(NotFound):
        await core.update_tenant("ghost", ProfileChange())
    with pytest.raises(NotFound):
        await core.suspend_tenant("ghost", True)


async def test_a_job_is_released_at_admission_then_deleted_in_kubernetes() -> None:
    store, stubs = Store(jobs={("acme", "job-1"): row("acme", "job-1")}), Stubs()
    core, _ = gateway(store, stubs)
    job = await core.cancel("acme", "job-1", "")
    assert job.job_id == "job-1" and stubs.calls == ["Release", "CancelWorkload"]


async def test_a_placer_that_is_away_does_not_fail_a_cancel_admission_took() -> None:
    store = Store(jobs={("acme", "job-1"): row("acme", "job-1")})
    stubs = Stubs(fail={"CancelWorkload"})
    core, _ = gateway(store, stubs)
    assert (await core.cancel("acme", "job-1", "why")).job_id == "job-1"


async def test_another_tenants_job_is_not_found_and_nothing_is_released() -> None:
    store, stubs = Store(jobs={("zeta", "job-1"): row("zeta", "job-1")}), Stubs()
    core, _ = gateway(store, stubs)
    with pytest.raises(NotFound):
        await core.cancel("acme", "job-1", "")
    with pytest.raises(NotFound):
        await core.job("acme", "job-1")
    assert stubs.calls == []


async def test_an_admission_that_is_away_fails_the_cancel_before_kubernetes_is_touched() -> None:
    store = Store(jobs={("acme", "job-1"): row("acme", "job-1")})
    stubs = Stubs(fail={"Release"})
    core, _ = gateway(store, stubs)
    with pytest.raises(Unavailable):
        await core.cancel("acme", "job-1", "")
    assert stubs.calls == ["Release"]


async def test_flavor_names_are_read_once_for_a_while() -> None:
    store = Store()
    reads = 0
    inner = store.flavors

    async def counted() -> set[str]:
        nonlocal reads
        reads += 1
        return await inner()

    store.flavors = counted  # type: ignore[method-assign]
    core, _ = gateway(store, Stubs())
    assert await core.flavor_names() == await core.flavor_names() == {"gpu-h100", "gpu-a10"}
    assert reads == 1


async def test_submits_arriving_together_reach_admission_in_one_call_each_with_its_answer(
        ) -> None:
    stubs = Stubs(refuse={
        "job-2": InvalidArgument([FieldViolation("job.spec.gpus", "must be positive")]),
        "job-3": Unavailable("postgres away", retry_after_s=2.5)})
    core, _ = gateway(Store(), stubs)
    out = await asyncio.gather(
        *(core.submit(common_pb2.Job(job_id=f"job-{i}", tenant="acme"), 5.0)
          for i in (1, 2, 3, 4)), return_exceptions=True)
    assert stubs.calls == ["AdmitBatch"]
    assert [getattr(o, "job_id", None) for o in out] == ["job-1", None, None, "job-4"]
    bad, away = out[1], out[2]
    assert isinstance(bad, InvalidArgument)
    assert bad.violations == [FieldViolation("job.spec.gpus", "must be positive")]
    assert isinstance(away, Unavailable) and away.retry_after_s == 2.5


async def test_an_admission_that_is_away_fails_each_submit_it_carried_as_unavailable(
        ) -> None:
    stubs = Stubs(fail={"AdmitBatch"})
    core, _ = gateway(Store(), stubs)
    out = await asyncio.gather(
        *(core.submit(common_pb2.Job(job_id=f"job-{i}", tenant="acme"), 5.0)
          for i in (1, 2)), return_exceptions=True)
    assert [type(o) for o in out] == [Unavailable, Unavailable]
