"""kestrel.bus.Puller, JetStream's pull protocol gathered on one inbox, against a fake
connection: the pull requests it publishes are recorded, and what the server would
answer on the inbox is handed to its callback by the test."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from kestrel import bus

DURABLE = bus.Durable("KESTREL_WORKLOADS", "kestrel.workload.>", "meter", batch=3)
NEXT = "$JS.API.CONSUMER.MSG.NEXT.KESTREL_WORKLOADS.meter"


class Msg:
    def __init__(self, name: str, *, reply: str = "", headers: dict[str, str] | None = None
                 ) -> None:
        self.name = name
        self.reply = reply
        self.headers = headers
        self.naks = 0

    async def nak(self, delay: float | None = None) -> None:
        self.naks += 1


def stream_msg(name: str) -> Msg:
    return Msg(name, reply=f"$JS.ACK.KESTREL_WORKLOADS.meter.1.{name}.1.0.0")


def status(code: str, text: str = "") -> Msg:
    return Msg(code, headers={"Status": code, "Description": text})


class JS:
    def __init__(self, exists: bool) -> None:
        self.exists = exists
        self.added: list[tuple[str, Any]] = []

    async def consumer_info(self, stream: str, name: str) -> object:
        if not self.exists:
            raise NotFoundError
        return object()

    async def add_consumer(self, stream: str, config: Any) -> None:
        self.added.append((stream, config))


class Sub:
    unsubscribed = False

    async def unsubscribe(self) -> None:
        self.unsubscribed = True


class NC:
    def __init__(self, exists: bool = False) -> None:
        self.js = JS(exists)
        self.asked: list[dict[str, Any]] = []
        self.subscribed: list[str] = []
        self.sub = Sub()
        self.stats = {"reconnects": 0}  # as nats-py's Client counts them

    def jetstream(self) -> JS:
        return self.js

    def new_inbox(self) -> str:
        return "_INBOX_meter.abc"

    async def subscribe(self, subject: str, cb: Any) -> Sub:
        self.subscribed.append(subject)
        return self.sub

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        assert (subject, reply) == (NEXT, "_INBOX_meter.abc")
        self.asked.append(json.loads(payload))


async def opened(nc: NC | None = None) -> tuple[bus.Puller, NC]:
    nc = nc or NC()
    return await bus.Puller.open(nc, DURABLE), nc  # type: ignore[arg-type]


async def deliver(p: bus.Puller, *msgs: Msg) -> None:
    for m in msgs:
        await p.on_msg(m)  # type: ignore[arg-type]


def names(msgs: list[Any]) -> list[str]:
    return [m.name for m in msgs]


def later(p: bus.Puller, *msgs: Msg, after_s: float = 0.01) -> asyncio.Task[None]:
    async def go() -> None:
        await asyncio.sleep(after_s)
        await deliver(p, *msgs)
    return asyncio.create_task(go())


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus, "PULL_EXPIRES_S", 0.2)
    monkeypatch.setattr(bus, "PULL_AHEAD_EXPIRES_S", 0.2)
    monkeypatch.setattr(bus, "PULL_LOST_S", 0.1)


async def test_a_missing_consumer_is_created_durable_with_explicit_acks_and_unlimited_redelivery(
) -> None:
    _, nc = await opened()
    [(stream, cfg)] = nc.js.added
    assert (stream, cfg.durable_name, cfg.name, cfg.filter_subject) == (
        "KESTREL_WORKLOADS", "meter", "meter", "kestrel.workload.>")
    assert (cfg.ack_policy.value, cfg.max_deliver, cfg.ack_wait) == ("explicit", -1, 30)
    assert nc.subscribed == ["_INBOX_meter.abc"]


async def test_an_existing_consumer_is_used_as_it_is() -> None:
    _, nc = await opened(NC(exists=True))
    assert nc.js.added == []


async def test_a_fetch_asks_for_a_batch_with_an_expiry_and_returns_the_first_arrival_at_once(
) -> None:
    p, nc = await opened()
    later(p, stream_msg("a"))
    got = await p.fetch(3, timeout=1)
    assert names(got) == ["a"]  # not held back until the batch is full
    assert nc.asked == [{"batch": 3, "expires": 200_000_000}]


async def test_while_a_request_is_in_flight_no_other_is_sent_and_its_later_messages_are_kept(
) -> None:
    p, nc = await opened()
    assert await p.fetch(3, timeout=0.02) == []
    assert await p.fetch(3, timeout=0.02) == []
    assert len(nc.asked) == 1
    await deliver(p, stream_msg("a"), stream_msg("b"))
    assert names(await p.fetch(3, timeout=0.02)) == ["a", "b"]
    assert len(nc.asked) == 1  # one message is still owed on that request


async def test_a_request_that_expired_unfilled_is_followed_by_a_new_one() -> None:
    p, nc = await opened()
    later(p, status("408", "Request Timeout"), after_s=0.01)
    later(p, stream_msg("a"), after_s=0.05)
    got = await p.fetch(3, timeout=1)
    assert names(got) == ["a"] and len(nc.asked) == 2


async def test_a_request_never_answered_is_taken_as_lost_and_asked_again() -> None:
    p, nc = await opened()
    assert await p.fetch(3, timeout=0.35) == []  # 0.2 s expiry + 0.1 s before it is lost
    assert len(nc.asked) == 2


async def test_a_refused_pull_raises_with_the_status_and_the_next_fetch_asks_again() -> None:
    p, nc = await opened()
    later(p, status("409", "Exceeded MaxWaiting"))
    with pytest.raises(bus.Refused, match="409 Exceeded MaxWaiting"):
        await p.fetch(3, timeout=1)
    later(p, stream_msg("a"))
    assert names(await p.fetch(3, timeout=1)) == ["a"]
    assert len(nc.asked) == 2


async def test_heartbeats_are_ignored_and_a_stream_message_is_one_whatever_its_headers() -> None:
    p, _ = await opened()
    forged = Msg("forged", reply="$JS.ACK.KESTREL_WORKLOADS.meter.1.9.9.0.0",
                 headers={"Status": "409"})
    await deliver(p, status("100", "Idle Heartbeat"), forged)
    assert names(await p.fetch(3, timeout=0.05)) == ["forged"]


async def test_a_burst_is_gathered_while_it_keeps_coming_up_to_the_batch() -> None:
    p, nc = await opened()
    await p.fetch(5, timeout=0.01)  # the request is out
    later(p, stream_msg("a"), stream_msg("b"), after_s=0.005)
    later(p, stream_msg("c"), after_s=0.0065)  # 1.5 ms after the first chunk: same burst
    later(p, stream_msg("d"), after_s=0.15)  # long after (inside the expiry): the next fetch's
    got = await p.fetch(5, timeout=1)
    assert names(got) == ["a", "b", "c"]
    assert names(await p.fetch(5, timeout=1)) == ["d"]
    assert len(nc.asked) == 1


async def test_a_full_batch_asks_for_the_next_ahead_and_close_takes_back_what_was_not_handled(
) -> None:
    p, nc = await opened()
    later(p, *(stream_msg(n) for n in "abc"))
    assert names(await p.fetch(3, timeout=1)) == ["a", "b", "c"]
    assert len(nc.asked) == 2  # the next batch is on its way while this one is handled
    d, e = stream_msg("d"), stream_msg("e")
    later(p, d, e, status("408"), after_s=0.02)
    await p.close()  # waits for the batch asked ahead, then gives it back
    assert nc.sub.unsubscribed and (d.naks, e.naks) == (1, 1)


async def test_with_gather_a_lone_message_waits_for_company_but_not_a_full_batch_or_its_tail(
) -> None:
    p, _ = await opened()
    later(p, stream_msg("a"), after_s=0.01)
    later(p, stream_msg("b"), after_s=0.05)  # 40 ms after the first: inside 0.1 s
    later(p, stream_msg("c"), after_s=0.3)  # outside
    assert names(await p.fetch(3, timeout=1, gather_s=0.1)) == ["a", "b"]
    assert names(await p.fetch(3, timeout=1, gather_s=0.1)) == ["c"]
    await deliver(p, stream_msg("d"), stream_msg("e"), stream_msg("f"))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert names(await p.fetch(3, timeout=1, gather_s=10)) == ["d", "e", "f"]
    assert loop.time() - t0 < 1
    await deliver(p, stream_msg("g"))  # the tail of that backlog: not held back
    t0 = loop.time()
    assert names(await p.fetch(3, timeout=1, gather_s=10)) == ["g"]
    assert loop.time() - t0 < 1


async def test_a_message_heard_while_the_request_is_being_sent_is_not_waited_past() -> None:
    class Answering(NC):
        puller: bus.Puller

        async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
            await super().publish(subject, payload, reply)
            await deliver(self.puller, stream_msg("a"))  # the server was quicker than us

    nc = Answering()
    p, _ = await opened(nc)
    nc.puller = p
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert names(await p.fetch(3, timeout=5)) == ["a"]
    assert loop.time() - t0 < 1  # not the 5 s timeout
