"""kestrel.runway.Runways: every tenant's newest runway, and who hears of it."""

from __future__ import annotations

import pytest

from kestrel.runway import Runways
from kestrel_sdk.v1 import common_pb2


def rw(tenant: str, seq: int, as_of_us: int, remaining: str = "1",
       version: int = 0) -> common_pb2.Runway:
    return common_pb2.Runway(tenant=tenant, ledger_seq=seq, as_of_us=as_of_us,
                             remaining=remaining, meter_version=version)


@pytest.mark.parametrize(("held", "heard", "taken"), [
    pytest.param(None, rw("acme", 5, 100), True, id="the first figure of a tenant is kept"),
    pytest.param(rw("acme", 5, 100), rw("acme", 6, 90), True,
                 id="a later ledger row wins even if its clock reads earlier"),
    pytest.param(rw("acme", 5, 100), rw("acme", 5, 200), True,
                 id="the same ledger row computed later wins (a top-up or a burn change)"),
    pytest.param(rw("acme", 5, 100), rw("acme", 5, 100, "2"), True,
                 id="the same stamp is taken again: a replay changes nothing it should not"),
    pytest.param(rw("acme", 6, 100), rw("acme", 5, 300), False,
                 id="an older ledger row is dropped (a redelivery after a reconnect)"),
    pytest.param(rw("acme", 5, 200), rw("acme", 5, 100), False,
                 id="the same ledger row computed earlier is dropped"),
    pytest.param(None, rw("", 5, 100), False, id="a figure without a tenant is dropped"),
    pytest.param(rw("acme", 5, 300, version=7), rw("acme", 5, 200, version=8), True,
                 id="a later meter version wins whichever replica's clock reads later "
                    "(a top-up committed after the other replica's figure)"),
    pytest.param(rw("acme", 6, 100, version=8), rw("acme", 6, 300, version=7), False,
                 id="an older meter version is dropped though its replica's clock reads "
                    "later (the other replica's figure, before the top-up, came last)"),
])
def test_take(held: common_pb2.Runway | None, heard: common_pb2.Runway, taken: bool) -> None:
    runways, told = Runways(), list[common_pb2.Runway]()
    if held is not None:
        runways.take(held)
    runways.listen(told.append)
    assert runways.take(heard) is taken
    assert told == ([heard] if taken else [])
    if held is not None:
        assert runways[held.tenant] == (heard if taken else held)


def test_tenants_are_kept_apart_and_every_listener_hears_each_figure() -> None:
    runways, first, second = Runways(), list[str](), list[str]()
    runways.listen(lambda r: first.append(r.tenant))
    runways.listen(lambda r: second.append(r.tenant))
    runways.take(rw("acme", 9, 1))
    runways.take(rw("zeta", 1, 1))
    assert first == second == ["acme", "zeta"]
    assert dict(runways) == {"acme": rw("acme", 9, 1), "zeta": rw("zeta", 1, 1)}
    assert runways.get("other") is None


def test_a_listener_that_fails_neither_stops_the_others_nor_loses_the_figure() -> None:
    runways, told = Runways(), list[common_pb2.Runway]()

    def broken(_: common_pb2.Runway) -> None:
        raise RuntimeError("boom")

    runways.listen(broken)
    runways.listen(told.append)
    assert runways.take(rw("acme", 1, 1))
    assert told == [rw("acme", 1, 1)] and "acme" in runways
