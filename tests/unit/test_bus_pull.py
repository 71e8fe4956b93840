"""bus.pull, the loop of every durable consumer, and its failure policy, with a fake
JetStream subscription (what is fetched is scripted; acks and naks are recorded)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeout

from kestrel import bus


class Msg:
    def __init__(self, name: str) -> None:
        self.name = name
        self.acked = False
        self.naks: list[float] = []

    async def ack(self) -> None:
        self.acked = True

    async def nak(self, delay: float | None = None) -> None:
        if self.acked:
            raise RuntimeError("already acknowledged")
        self.naks.append(delay or 0.0)


class Sub:
    def __init__(self, script: list[Any], stop: asyncio.Event) -> None:
        self.script = script
        self.stop = stop

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109
        step = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(step, BaseException):
            raise step
        assert len(step) <= batch
        result: list[Msg] = step
        return result


class JS:
    def __init__(self, sub: Sub) -> None:
        self.sub = sub
        self.subscribed: dict[str, Any] = {}

    async def pull_subscribe(self, subject: str, **kw: Any) -> Sub:
        self.subscribed = {"subject": subject, **kw}
        return self.sub


DURABLE = bus.Durable("KESTREL_WORKLOADS", "kestrel.workload.>", "meter", batch=10)


def run(script: list[Any], handle: Any) -> JS:
    async def go() -> JS:
        stop = asyncio.Event()
        js = JS(Sub(script, stop))
        await bus.pull(js, DURABLE, handle, stop)  # type: ignore[arg-type]
        return js
    return asyncio.run(go())


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus, "FETCH_RETRY_S", 0.01)


def test_the_consumer_is_durable_with_explicit_acks_and_unlimited_redelivery() -> None:
    js = run([[]], lambda msgs: asyncio.sleep(0))
    cfg = js.subscribed["config"]
    assert (js.subscribed["subject"], js.subscribed["durable"], js.subscribed["stream"]) == (
        "kestrel.workload.>", "meter", "KESTREL_WORKLOADS")
    assert (cfg.ack_policy.value, cfg.max_deliver, cfg.ack_wait) == ("explicit", -1, 30)


def test_an_empty_poll_and_a_failed_fetch_are_tried_again_and_the_next_batch_handled() -> None:
    seen: list[str] = []

    async def handle(msgs: list[Msg]) -> None:
        seen.extend(m.name for m in msgs)
        for m in msgs:
            await m.ack()

    a, b = Msg("a"), Msg("b")
    run([NatsTimeout(), ConnectionResetError("nats away"), [a, b]], handle)
    assert seen == ["a", "b"] and a.acked and b.acked


def test_a_batch_whose_handler_raises_is_nakd_for_redelivery_and_acked_ones_keep_their_ack(
) -> None:
    async def handle(msgs: list[Msg]) -> None:
        await msgs[0].ack()
        raise RuntimeError("the store went away")

    a, b, c = Msg("a"), Msg("b"), Msg("c")
    run([[a, b, c]], handle)
    assert a.acked and a.naks == []
    assert b.naks == [bus.WORK_RETRY_S] and c.naks == [bus.WORK_RETRY_S]


def test_until_done_retries_the_work_until_it_succeeds() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("postgres restarting")
        return "done"

    assert asyncio.run(bus.until_done("ingest", flaky, delay_s=0.01)) == "done"
    assert len(calls) == 3
