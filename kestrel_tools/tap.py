"""`kestrel tap SUBJECT`: every bus message on SUBJECT as one JSON line.

The server distribution adds `command` to the SDK's CLI (entry point group
`kestrel_sdk.commands` in pyproject.toml): the tap needs nats-py, which the SDK leaves out.

A core NATS subscription (JetStream publishes reach core subscribers too), so
it taps any subject, in a stream or not, without creating consumers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, TextIO

import nats
import typer
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus, natsauth


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
    parked = {k.removeprefix("Kestrel-Deadletter-").lower(): v
              for k, v in (msg.headers or {}).items() if k.startswith("Kestrel-Deadletter-")}
    if parked:  # a dead letter: where it came from and why it was parked
        line["deadletter"] = parked
        line["raw_base64"] = base64.b64encode(msg.data[:4096]).decode()
    return json.dumps(line, separators=(",", ":"), sort_keys=False)


async def connect(url: str, err: TextIO = sys.stderr) -> NATS:
    """Connect like the services do (riding out a NATS restart), but say on stderr only
    what a person needs: a lost or regained connection while tapping — never the
    disconnection that closing the tap itself causes (nats-py calls the disconnected
    callback on every close, after marking the client closed)."""
    client: list[NATS] = []  # set once connected, before any callback can run
    last = ""

    def closing() -> bool:
        return bool(client) and client[0].is_closed

    def say(text: str) -> None:
        err.write(f"kestrel tap: {text}\n")
        err.flush()

    async def on_error(exc: Exception) -> None:
        nonlocal last
        if not closing() and str(exc) != last:  # a reconnect loop repeats itself
            last = str(exc)
            say(last if last.startswith("nats") else f"nats: {last}")

    async def on_disconnect() -> None:
        if not closing():
            say("nats disconnected; reconnecting")

    async def on_reconnect() -> None:
        nonlocal last
        last = ""
        say("nats reconnected")

    user = natsauth.user_of(url)  # the operators' read-only `tap` user, usually
    extra: dict[str, Any] = {"inbox_prefix": natsauth.inbox_prefix(user)} if user else {}
    client.append(await nats.connect(
        natsauth.servers(url), name="kestrel-tap", max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
        **extra))
    return client[0]


async def tap(url: str, subject: str, *, count: int = 0, out: TextIO = sys.stdout,
              stop: asyncio.Event | None = None,
              on_ready: Callable[[], None] = lambda: None, err: TextIO = sys.stderr) -> int:
    """Print messages until `count` were printed (0 = forever) or `stop` is set."""
    nc = await connect(url, err)
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
        if nc.is_connected:
            await sub.unsubscribe()
            await nc.drain()
        else:  # stopped while NATS is away: nothing to drain
            await nc.close()
    return seen


def command(subject: Annotated[str, typer.Argument(help="NATS subject, wildcards allowed")]
            = "kestrel.>",
            nats_url: Annotated[str, typer.Option(envvar="KESTREL_NATS_URL")]
            = "nats://127.0.0.1:4222",
            count: Annotated[int, typer.Option(help="stop after N messages (0: never)")] = 0,
            ) -> None:
    """Print every bus message on SUBJECT decoded from protobuf, one JSON line each."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(tap(nats_url, subject, count=count))
