"""`kestrel tap` prints bus messages decoded from protobuf, one JSON line each."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest

from tests.integration.helpers import T0, publish_events, wev

pytestmark = pytest.mark.integration


async def test_tap_prints_each_message_as_one_decoded_json_line(clean_bus: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kestrel_sdk.cli", "tap", "kestrel.>", "--nats-url", clean_bus,
        "--count", "2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    lines: list[dict[str, object]] = []
    async with asyncio.timeout(30):
        while not lines:  # publish until the tap is subscribed and sees the first one
            await publish_events(clean_bus, [wev(f"e-{T0}", "acme", "w", 1, T0, gpus=3)])
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), 0.5)  # type: ignore[union-attr]
            except TimeoutError:
                continue
            lines.append(json.loads(raw))
        await publish_events(clean_bus, [wev(f"e-{i}", "acme", "w", 3, T0 + 5, gpus=3)
                                         for i in range(2, 40)])
        lines.append(json.loads(await proc.stdout.readline()))  # type: ignore[union-attr]
        assert await proc.wait() == 0
        assert await proc.stdout.read() == b""  # type: ignore[union-attr]  # --count 2: no more
        # A normal end says nothing about the connection it closes (issue 10 #9).
        assert await proc.stderr.read() == b""  # type: ignore[union-attr]
    first, second = lines
    assert first["subject"] == "kestrel.workload.acme.admitted"
    assert first["type"] == "kestrel.v1.WorkloadEvent"
    assert first["message"]["gpus"] == 3  # type: ignore[index]
    assert second["message"]["type"] == "WORKLOAD_EVENT_TYPE_FINISHED"  # type: ignore[index]


async def test_tap_stopped_with_ctrl_c_ends_quietly(clean_bus: str) -> None:
    # Its own subject, so that nothing else on the shared server fills its pipes; and
    # both pipes are read to the end while it stops (a tap blocked writing to a full
    # pipe could not see the signal).
    # Ctrl-C as at a terminal, whatever the runner of the suite ignores (a background
    # job's SIGINT is ignored); reset by env at exec, not by a preexec_fn, which would
    # fork this gRPC-using process (kestrel_tools.procs).
    proc = await asyncio.create_subprocess_exec(
        "env", "--default-signal=INT", sys.executable, "-m", "kestrel_sdk.cli", "tap",
        "kestrel.workload.tapctl.>", "--nats-url", clean_bus, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        while True:  # publish until the tap is subscribed and prints
            await publish_events(clean_bus, [wev(f"c-{T0}", "tapctl", "w", 1, T0)])
            try:
                await asyncio.wait_for(proc.stdout.readline(), 0.5)  # type: ignore[union-attr]
                break
            except TimeoutError:
                continue
        proc.send_signal(signal.SIGINT)
        _, err = await proc.communicate()
    assert proc.returncode == 0
    assert err == b""
