"""`kestrel tap SUBJECT`: every bus message on SUBJECT as one JSON line.

A core NATS subscription (JetStream publishes reach core subscribers too), so
it taps any subject, in a stream or not, without creating consumers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from nats.aio.msg import Msg

from kestrel import bus


def render(msg: Msg) -> str:
    kind, body = bus.decode(msg.headers, msg.data)
    line: dict[str, Any] = {"subject": msg.subject, "type": kind or None}
    msg_id = (msg.headers or {}).get(bus.MSG_ID_HEADER)
    if msg_id:
        line["msg_id"] = msg_id
    if body is not None:
        line["message"] = body
    else:
        line["raw_bytes"] = len(msg.data)
    return json.dumps(line, separators=(",", ":"), sort_keys=False)


async def tap(url: str, subject: str, *, count: int = 0, out: TextIO = sys.stdout,
              stop: asyncio.Event | None = None,
              on_ready: Callable[[], None] = lambda: None) -> int:
    """Print messages until `count` were printed (0 = forever) or `stop` is set."""
    nc = await bus.connect(url, "kestrel-tap")
    seen = 0
    done = stop or asyncio.Event()

    async def handler(msg: Msg) -> None:
        nonlocal seen
        if count and seen >= count:  # already dispatched before the unsubscribe
            return
        out.write(render(msg) + "\n")
        out.flush()
        seen += 1
        if count and seen >= count:
            done.set()

    sub = await nc.subscribe(subject, cb=handler)
    await nc.flush()
    on_ready()
    try:
        await done.wait()
    finally:
        await sub.unsubscribe()
        await nc.drain()
    return seen
