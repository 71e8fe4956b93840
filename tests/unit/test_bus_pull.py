"""bus.pull, the loop of every durable consumer, and its failure policy, with a fake
JetStream subscription (what is fetched is scripted; acks and naks are recorded)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


class Puller:
    """What bus.pull sees of kestrel.bus.Puller: scripted fetches."""

    def __init__(self, script: list[Any], stop: asyncio.Event) -> None:
        self.script = script
        self.stop = stop
        self.closed = False

    def halt(self) -> None:
        pass

    async def fetch(self, batch: int, timeout: float,  # noqa: ASYNC109
                    gather_s: float = 0.0) -> list[Msg]:
        step = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(step, BaseException):
            raise step
        assert len(step) <= batch
        result: list[Msg] = step
        return result

    async def close(self) -> None:
        self.closed = True


DURABLE = bus.Durable("KESTREL_WORKLOADS", "kestrel.workload.>", "meter", batch=10)


def run(script: list[Any], handle: Any, monkeypatch: pytest.MonkeyPatch) -> Puller:
    async def go() -> Puller:
        stop = asyncio.Event()
        puller = Puller(script, stop)

        async def open_(nc: Any, durable: bus.Durable) -> Puller:
            assert durable is DURABLE
            return puller
        monkeypatch.setattr(bus.Puller, "open", open_)
        await bus.pull(None, DURABLE, handle, stop)  # type: ignore[arg-type]
        return puller
    return asyncio.run(go())


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus, "FETCH_RETRY_S", 0.01)


def test_an_empty_poll_and_a_failed_fetch_are_tried_again_and_the_next_batch_handled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    async def handle(msgs: list[Msg]) -> None:
        seen.extend(m.name for m in msgs)
        for m in msgs:
            await m.ack()

    a, b = Msg("a"), Msg("b")
    puller = run([[], bus.Refused("409 Exceeded MaxWaiting"), ConnectionResetError("nats away"),
                  [a, b]], handle, monkeypatch)
    assert seen == ["a", "b"] and a.acked and b.acked
    assert puller.closed


def test_a_batch_whose_handler_raises_is_nakd_for_redelivery_and_acked_ones_keep_their_ack(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def handle(msgs: list[Msg]) -> None:
        await msgs[0].ack()
        raise RuntimeError("the store went away")

    a, b, c = Msg("a"), Msg("b"), Msg("c")
    run([[a, b, c]], handle, monkeypatch)
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
