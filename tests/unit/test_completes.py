"""kestrel.grpcserver.completes: work an RPC began ends although the RPC is cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kestrel.grpcserver import completes


async def test_work_runs_to_its_end_after_the_rpc_awaiting_it_is_cancelled() -> None:
    steps: list[str] = []
    committed = asyncio.Event()

    async def decide() -> str:
        steps.append("commit")
        committed.set()
        await asyncio.sleep(0.05)  # the announcement, on its way
        steps.append("announce")
        return "admitted"

    rpc = asyncio.create_task(completes(decide()))
    await committed.wait()
    rpc.cancel()  # the client's deadline
    with pytest.raises(asyncio.CancelledError):
        await rpc
    await asyncio.sleep(0.1)
    assert steps == ["commit", "announce"]


async def test_an_uncancelled_rpc_gets_the_result_or_the_error() -> None:
    async def ok() -> int:
        return 7

    async def bad() -> int:
        raise ValueError("no")

    assert await completes(ok()) == 7
    with pytest.raises(ValueError, match="no"):
        await completes(bad())


async def test_a_failure_after_the_rpc_went_away_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()

    async def fails_later() -> None:
        started.set()
        await asyncio.sleep(0.05)
        raise RuntimeError("store away")

    rpc = asyncio.create_task(completes(fails_later()))
    await started.wait()
    rpc.cancel()
    with caplog.at_level(logging.WARNING, logger="kestrel.grpc"), \
            pytest.raises(asyncio.CancelledError):
        await rpc
    with caplog.at_level(logging.WARNING, logger="kestrel.grpc"):
        await asyncio.sleep(0.1)
    assert "work of a cancelled rpc failed after it: store away" in caplog.text
