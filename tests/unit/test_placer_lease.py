"""The placer's leadership steps (services/placer/app.py): wait warm for the Lease,
stop on losing it. The Lease itself is kestrel.lease (test_lease.py); the hand-over on
the real cluster is tests/e2e/test_placer.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from kestrel.lease import Elector
from services.placer.app import _step_down_on_loss, _until_leading


def _elector(leading: bool) -> Any:
    return cast(Elector, SimpleNamespace(leading=leading, name="kestrel-placer",
                                         namespace="default"))


async def test_a_standby_starts_acting_once_it_holds_the_lease() -> None:
    elector, stop = _elector(False), asyncio.Event()
    waiting = asyncio.create_task(_until_leading(elector, stop))
    await asyncio.sleep(0.25)
    assert not waiting.done()
    elector.leading = True
    assert await asyncio.wait_for(waiting, 2) is True
    assert not stop.is_set()


async def test_a_standby_stopped_before_it_leads_never_acts() -> None:
    elector, stop = _elector(False), asyncio.Event()
    waiting = asyncio.create_task(_until_leading(elector, stop))
    stop.set()
    assert await asyncio.wait_for(waiting, 2) is False


async def test_a_leader_that_loses_the_lease_stops_the_process() -> None:
    elector, stop = _elector(True), asyncio.Event()
    watching = asyncio.create_task(_step_down_on_loss(elector, stop))
    await asyncio.sleep(0.25)
    assert not stop.is_set()
    elector.leading = False
    await asyncio.wait_for(watching, 2)
    assert stop.is_set()


async def test_a_clean_stop_is_not_taken_for_a_lost_lease() -> None:
    elector, stop = _elector(True), asyncio.Event()
    watching = asyncio.create_task(_step_down_on_loss(elector, stop))
    stop.set()
    await asyncio.wait_for(watching, 2)
    assert elector.leading  # released later, after the drain, by _end_lease
