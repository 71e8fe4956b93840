"""kestrel.runway.follow against a real nats-server, as a service's own NATS user:
every tenant's last runway at start, each new one as it comes, a lost consumer made
again, and nothing left on the server after a stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kestrel import bus, runway
from kestrel.runway import STREAM, Runways
from kestrel_sdk.v1 import common_pb2, events_pb2
from kestrel_tools.devstack import Stack
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration


async def _say(js: Any, tenant: str, seq: int, credits: str) -> None:
    msg = events_pb2.RunwayChanged(runway=common_pb2.Runway(
        tenant=tenant, credits=credits, ledger_seq=seq, as_of_us=seq))
    await js.publish(bus.subject_runway(tenant), msg.SerializeToString())


@pytest.fixture
async def admin(clean_bus: str) -> AsyncIterator[Any]:
    nc = await bus.connect(clean_bus, "test-runway-admin")
    await bus.ensure_streams(nc.jetstream())
    yield nc
    await nc.close()


async def test_a_follower_reads_every_tenants_last_runway_then_each_new_one(
        stack: Stack, admin: Any) -> None:
    js = admin.jetstream()
    for seq, (tenant, credits) in enumerate([("a", "1"), ("b", "5"), ("a", "2")], 1):
        await _say(js, tenant, seq, credits)
    nc = await bus.connect(stack.nats_url_for("placer"), "test-runway-placer")
    runways, stop, ready = Runways(), asyncio.Event(), asyncio.Event()
    heard: list[tuple[str, str]] = []
    runways.listen(lambda r: heard.append((r.tenant, r.credits)))
    following = asyncio.create_task(runway.follow(nc, runways, stop, ready))
    await asyncio.wait_for(ready.wait(), 5)
    assert {t: r.credits for t, r in runways.items()} == {"a": "2", "b": "5"}
    assert sorted(heard) == [("a", "2"), ("b", "5")]  # the last per tenant only

    async def credits_of(tenant: str) -> str:
        return runways[tenant].credits

    await _say(js, "b", 4, "7")
    assert await eventually(lambda: credits_of("b"), lambda c: c == "7", 5) == "7"

    # The server loses the consumer (a restart, or it outlived its inactivity): the
    # next pull is refused and the follower makes it again, missing nothing newer.
    [name] = [c.name async for c in _consumers(js)]
    await js.delete_consumer(STREAM, name)
    await _say(js, "a", 5, "9")
    assert await eventually(lambda: credits_of("a"), lambda c: c == "9", 10) == "9"
    assert [c.name async for c in _consumers(js)] != [name]

    stop.set()
    await asyncio.wait_for(following, 2)
    assert [c.name async for c in _consumers(js)] == []  # deleted at stop
    await nc.close()


async def _consumers(js: Any) -> AsyncIterator[Any]:
    for c in await js.consumers_info(STREAM):
        yield c
