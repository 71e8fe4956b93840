"""Admission's re-evaluator and its runway listener, with admission behind a fake:
which tenants are decided again, and how often, when runways and job ends arrive."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kestrel_sdk.v1 import common_pb2
from services.admission.consumers import Reevaluator, on_runway


@dataclass
class Book:
    held: list[str] = field(default_factory=list)
    holds: dict[str, object] = field(default_factory=dict)


@dataclass
class FakeAdmission:
    books: dict[str, Book] = field(default_factory=dict)
    decided: list[str] = field(default_factory=list)
    fail: bool = False

    async def reevaluate(self, tenant: str) -> None:
        self.decided.append(tenant)
        if self.fail:
            raise RuntimeError("postgres went away")


def reevaluator(**books: Book) -> tuple[FakeAdmission, Reevaluator]:
    admission = FakeAdmission(dict(books))
    return admission, Reevaluator(admission, coalesce_s=0.01)  # type: ignore[arg-type]


async def settle(r: Reevaluator) -> None:
    while r.tasks:
        await asyncio.gather(*list(r.tasks))


async def test_a_burst_of_requests_for_one_tenant_is_served_by_one_decision() -> None:
    admission, r = reevaluator()
    for _ in range(50):
        r.request("acme")
    r.request("zeta")
    await settle(r)
    assert sorted(admission.decided) == ["acme", "zeta"]


async def test_a_request_after_the_decision_began_is_decided_again() -> None:
    admission, r = reevaluator()
    r.request("acme")
    await settle(r)
    r.request("acme")
    await settle(r)
    assert admission.decided == ["acme", "acme"]


async def test_a_failed_decision_is_logged_and_the_tenant_can_be_asked_again() -> None:
    admission, r = reevaluator()
    admission.fail = True
    r.request("acme")
    await settle(r)
    admission.fail = False
    r.request("acme")
    await settle(r)
    assert admission.decided == ["acme", "acme"] and not r.pending


async def test_a_runway_decides_again_only_tenants_with_held_jobs() -> None:
    admission, r = reevaluator(held=Book(held=["j1"]), holding=Book(holds={"j2": 1}),
                               idle=Book())
    woken: list[str] = []
    listener = on_runway(r, lambda runway: woken.append(runway.tenant))
    for tenant in ("held", "holding", "idle", "unknown"):
        listener(common_pb2.Runway(tenant=tenant))
    await settle(r)
    # Open holds alone need no decision: the meter counts closed ones as nothing and
    # the next decision (or the sweep) spends them.
    assert admission.decided == ["held"]
    # The runway check decides every tenant's waiting Workloads again, whatever its book.
    assert woken == ["held", "holding", "idle", "unknown"]


async def test_without_a_runway_check_a_runway_still_frees_held_jobs() -> None:
    admission, r = reevaluator(held=Book(held=["j1"]))
    on_runway(r)(common_pb2.Runway(tenant="held"))
    await settle(r)
    assert admission.decided == ["held"]
