"""Least privilege on the bus against a real nats-server: each service's NATS user
(kestrel.natsauth) is refused what it may not publish, and a tap still reads."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus, natsauth
from kestrel_tools.devstack import Stack

pytestmark = pytest.mark.integration

# A subject of each kind a Kestrel service publishes on.
SUBJECTS = ["kestrel.runway.{t}", "kestrel.workload.{t}.finished", "kestrel.jobs.admitted.{t}",
            "kestrel.jobs.state.{t}", "kestrel.deadletter.meter", "kestrel.deadletter.placer",
            "kestrel.checks.workloads", "kestrel.checks.sync"]


async def _user(stack: Stack, user: str, errors: list[str]) -> NATS:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(stack.nats_url_for(user), name=f"perm-{user}",
                              inbox_prefix=natsauth.inbox_prefix(user), error_cb=on_error,
                              allow_reconnect=False)


async def test_each_user_publishes_exactly_what_its_grants_say_and_a_tap_reads_it(
        stack: Stack, clean_bus: str) -> None:
    tenant = f"perm{uuid.uuid4().hex[:6]}"
    seen: list[str] = []
    tap_errors: list[str] = []
    tap = await _user(stack, natsauth.TAP, tap_errors)

    async def on_msg(msg: Msg) -> None:
        seen.append(f"{msg.data.decode()}@{msg.subject}")

    await tap.subscribe("kestrel.>", cb=on_msg)
    await tap.flush()
    want: set[str] = set()
    for user in (*natsauth.SERVICES, natsauth.TAP):
        errors: list[str] = []
        nc = await _user(stack, user, errors)
        try:
            for pattern in SUBJECTS:
                subject = pattern.format(t=tenant)
                await nc.publish(subject, user.encode())
                if natsauth.may_publish(user, subject):
                    want.add(f"{user}@{subject}")
            await nc.flush()
            await asyncio.sleep(0.3)  # the server's -ERR for a refused publish is async
        finally:
            await nc.close()
        refused = [pattern.format(t=tenant) for pattern in SUBJECTS
                   if not natsauth.may_publish(user, pattern.format(t=tenant))]
        for subject in refused:
            assert any("permissions violation" in e.lower() and subject in e for e in errors), (
                user, subject, errors)
    await asyncio.sleep(0.3)
    await tap.close()
    # The tap read every permitted publish and nothing else; it itself sent nothing.
    assert set(seen) == want
    assert "meter@kestrel.runway." + tenant in want
    assert not any(s.startswith(("admission@kestrel.runway", "meter@kestrel.workload"))
                   for s in seen)
    assert tap_errors == []


async def test_a_forbidden_jetstream_publish_never_reaches_the_stream(
        stack: Stack, clean_bus: str) -> None:
    """Admission cannot forge a runway message into KESTREL_RUNWAY, however it asks."""
    errors: list[str] = []
    nc = await _user(stack, "admission", errors)
    admin = await bus.connect(stack.nats_url, "perm-admin")
    try:
        before = (await admin.jetstream().stream_info("KESTREL_RUNWAY")).state.messages
        with pytest.raises(Exception):  # noqa: B017 - refused: no ack ever comes
            await nc.jetstream().publish("kestrel.runway.forged", b"x", timeout=1.0)
        for verb in ("STREAM.PURGE.KESTREL_RUNWAY", "STREAM.DELETE.KESTREL_WORKLOADS",
                     "CONSUMER.DELETE.KESTREL_WORKLOADS.meter"):
            with pytest.raises(Exception):  # noqa: B017 - refused: no reply ever comes
                await nc.request(f"$JS.API.{verb}", b"", timeout=1.0)
        after = (await admin.jetstream().stream_info("KESTREL_RUNWAY")).state.messages
        assert after == before
        assert any("permissions violation" in e.lower() for e in errors)
    finally:
        await nc.close()
        await admin.close()


async def test_a_connection_without_credentials_is_refused(stack: Stack) -> None:
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises its own auth error types
        await nats.connect(f"nats://127.0.0.1:{stack.nats_port}", allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2)
