"""kestrel.service.event_loop_factory: the services run on uvloop unless told to run on
CPython's own loop, and a misspelt choice stops the service instead of being ignored."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import uvloop

from kestrel import service


def test_the_default_loop_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KESTREL_EVENT_LOOP", raising=False)
    factory = service.event_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_asyncio_chooses_cpythons_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KESTREL_EVENT_LOOP", "asyncio")
    assert service.event_loop_factory() is None  # asyncio.Runner's default loop


def test_an_unknown_loop_stops_the_service_with_the_choices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KESTREL_EVENT_LOOP", "uv-loop")
    with pytest.raises(SystemExit, match=r"'uv-loop'.*uvloop or asyncio"):
        service.event_loop_factory()


def test_a_service_loop_runs_threads_handoffs_and_signals_on_uvloop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What every service does on its loop: hand work to a thread and back (the placer's
    watch threads), and install SIGTERM/SIGINT handlers (stop_event_on_signals)."""
    monkeypatch.delenv("KESTREL_EVENT_LOOP", raising=False)
    monkeypatch.setattr(service, "_stopping", None)  # restored after: other tests see none

    async def main() -> tuple[str, bool]:
        stop = service.stop_event_on_signals()
        loop = asyncio.get_running_loop()
        got: asyncio.Future[str] = loop.create_future()
        await asyncio.to_thread(loop.call_soon_threadsafe, got.set_result, "from a thread")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 5)
        return await got, isinstance(loop, uvloop.Loop)

    with asyncio.Runner(loop_factory=service.event_loop_factory()) as runner:
        assert runner.run(main()) == ("from a thread", True)
