"""kestrel.bus.Puller against a real nats-server: JetStream's pull protocol as the
server speaks it (batches, 408 expiries, acks, redelivery of what was handed back)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kestrel import bus

pytestmark = pytest.mark.integration

STREAM = "KESTREL_WORKLOADS"


@pytest.fixture
async def conn(clean_bus: str) -> AsyncIterator[tuple[Any, Any, str]]:
    """A connection to the bus, its JetStream context, and a tenant of this test's own."""
    nc = await bus.connect(clean_bus, "test-puller")
    yield nc, nc.jetstream(), f"p{uuid.uuid4().hex[:6]}"
    await nc.close()


async def _publish(js: object, tenant: str, n: int, start: int = 0) -> None:
    await asyncio.gather(*(js.publish(  # type: ignore[attr-defined]
        f"kestrel.workload.{tenant}.admitted", f"{i}".encode(),
        headers={"Nats-Msg-Id": f"{tenant}-{i}"}) for i in range(start, start + n)))


async def _handle(puller: bus.Puller, batch: int, until: int, into: list[int],
                  sizes: list[int] | None = None) -> None:
    """Fetch, record and acknowledge until `into` holds `until` messages."""
    while len(into) < until:
        msgs = await puller.fetch(batch, timeout=2)
        assert msgs, f"stalled at {len(into)}: {into}"
        if sizes is not None:
            sizes.append(len(msgs))
        for m in msgs:
            into.append(int(m.data))
            await m.ack()


async def test_a_backlog_comes_in_order_in_batches_no_larger_than_asked_each_message_once(
        conn: tuple[Any, Any, str]) -> None:
    nc, js, tenant = conn
    await _publish(js, tenant, 2500)
    puller = await bus.Puller.open(nc, bus.Durable(STREAM, "kestrel.workload.>", "puller-a",
                                                   1000))
    seen: list[int] = []
    sizes: list[int] = []
    await _handle(puller, 1000, 2500, seen, sizes)
    assert seen == list(range(2500))
    assert max(sizes) <= 1000
    assert await puller.fetch(1000, timeout=0.7) == []  # a 408 came and went: nothing more
    await puller.close()
    info = await js.consumer_info(STREAM, "puller-a")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


async def test_an_idle_consumer_gets_a_new_message_within_its_long_poll(
        conn: tuple[Any, Any, str]) -> None:
    nc, js, tenant = conn
    puller = await bus.Puller.open(nc, bus.Durable(STREAM, "kestrel.workload.>", "puller-b",
                                                   256))
    assert await puller.fetch(256, timeout=0.1) == []  # a request is now waiting on the server
    later = asyncio.create_task(_publish(js, tenant, 1))
    got = await puller.fetch(256, timeout=2)
    await later
    assert [m.data for m in got] == [b"0"]
    await got[0].ack()
    await puller.close()


async def test_what_a_closed_puller_did_not_hand_out_is_delivered_again_at_once(
        conn: tuple[Any, Any, str]) -> None:
    nc, js, tenant = conn
    await _publish(js, tenant, 10)
    durable = bus.Durable(STREAM, "kestrel.workload.>", "puller-c", 4)
    first = await bus.Puller.open(nc, durable)
    handled: list[int] = []
    await _handle(first, 4, 4, handled)  # a full batch: the next one is asked for ahead
    await first.close()  # the batch asked ahead goes back (nak), not after the 30 s ack wait

    second = await bus.Puller.open(nc, durable)
    await _handle(second, 4, 10, handled)  # the rest, at once
    assert sorted(handled) == list(range(10)) and len(set(handled)) == 10
    await second.close()


async def test_a_message_after_a_puller_closed_goes_to_the_next_at_once_not_its_dead_inbox(
        conn: tuple[Any, Any, str]) -> None:
    """An idle puller leaves a request waiting on the server for PULL_EXPIRES_S (5 s).
    Once it closed, nothing listens on that request's inbox: a message published then
    must not be delivered there (it would wait out the 30 s ack wait), but to the next
    puller of the same durable."""
    nc, js, tenant = conn
    durable = bus.Durable(STREAM, "kestrel.workload.>", "puller-d", 16)
    first = await bus.Puller.open(nc, durable)
    assert await first.fetch(16, timeout=0.1) == []  # a 5 s request now waits on the server
    assert first.in_flight()
    await first.close()
    await _publish(js, tenant, 1)
    second = await bus.Puller.open(nc, durable)
    got = await second.fetch(16, timeout=3)
    assert [m.data for m in got] == [b"0"]
    await got[0].ack()
    await second.close()


async def test_a_request_the_server_forgot_in_a_reconnect_is_asked_again_at_once(
        conn: tuple[Any, Any, str]) -> None:
    """A restarted NATS forgets waiting requests: a reconnect (the client's count of
    them) ends the one in flight, so the next fetch asks again rather than waiting
    out its 5 s expiry."""
    nc = conn[0]
    puller = await bus.Puller.open(nc, bus.Durable(STREAM, "kestrel.workload.>", "puller-e",
                                                   16))
    assert await puller.fetch(16, timeout=0.1) == []
    assert puller.in_flight()
    nc.stats["reconnects"] += 1  # what nats-py counts when it reconnected
    assert not puller.in_flight()
    await puller.close()


async def test_an_idle_pull_loop_waits_in_one_fetch_and_returns_as_soon_as_it_is_stopped(
        conn: tuple[Any, Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle, the loop sits in one fetch while its requests expire and are asked again
    (each a 408 from the server), not in a fetch that gives up every half second; its
    stop event ends that wait at once."""
    monkeypatch.setattr(bus, "PULL_EXPIRES_S", 0.3)
    nc, js, tenant = conn
    fetches, asks = [], []
    fetch, ask = bus.Puller.fetch, bus.Puller._ask

    async def counted_fetch(self: bus.Puller, *a: Any, **kw: Any) -> Any:
        fetches.append(1)
        return await fetch(self, *a, **kw)

    async def counted_ask(self: bus.Puller, *a: Any, **kw: Any) -> Any:
        asks.append(1)
        return await ask(self, *a, **kw)
    monkeypatch.setattr(bus.Puller, "fetch", counted_fetch)
    monkeypatch.setattr(bus.Puller, "_ask", counted_ask)
    stop, seen = asyncio.Event(), []

    async def handle(msgs: list[Any]) -> None:
        for m in msgs:
            seen.append(int(m.data))
            await m.ack()
    loop = asyncio.create_task(bus.pull(nc, bus.Durable(
        STREAM, f"kestrel.workload.{tenant}.>", f"puller-f-{tenant}", 16), handle, stop))
    await asyncio.sleep(1.6)
    assert len(fetches) == 1 and len(asks) >= 4, (fetches, asks)  # expired and asked again
    await _publish(js, tenant, 1)
    for _ in range(50):  # handled, and the loop back in its next fetch
        if seen and len(fetches) >= 2:
            break
        await asyncio.sleep(0.05)
    assert seen == [0] and len(fetches) == 2
    stop.set()
    await asyncio.wait_for(loop, 1.0)  # not the 30 s of the fetch's own wait


async def test_a_reconnect_makes_a_waiting_fetch_ask_again_at_once(
        conn: tuple[Any, Any, str]) -> None:
    """A fetch waiting on a request the server forgot (NATS restarted) is woken by the
    connection's reconnect and asks again, rather than at the request's lapse."""
    nc = conn[0]
    puller = await bus.Puller.open(nc, bus.Durable(STREAM, "kestrel.workload.>", "puller-g",
                                                   16))
    fetching = asyncio.create_task(puller.fetch(16, timeout=10))
    await asyncio.sleep(0.2)
    asked_in = puller.asked_in
    nc.stats["reconnects"] += 1  # what nats-py counts, then it calls reconnected_cb
    await nc._reconnected_cb()
    await asyncio.sleep(0.2)
    assert puller.asked_in == asked_in + 1 and puller.in_flight()
    puller.halt()
    assert await asyncio.wait_for(fetching, 1.0) == []
    await puller.close()
