"""Runway changes reach subscribers: after a top-up, across thresholds, at exhaustion."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from nats.js.api import DeliverPolicy

from kestrel import bus
from kestrel.clock import now_us
from kestrel_sdk.v1 import events_pb2, meter_pb2, meter_pb2_grpc
from kestrel_tools.procs import ServiceProcess
from tests.integration.helpers import publish_events, wev

pytestmark = pytest.mark.integration
REASON = events_pb2.RunwayChangeReason


@pytest.fixture
async def stub(meter_factory: Callable[..., ServiceProcess]
               ) -> AsyncIterator[meter_pb2_grpc.MeterStub]:
    meter = meter_factory(KESTREL_METER_TICK_S="0.1", KESTREL_METER_SETTLE_US="0",
                          KESTREL_PRICES="gpu-burn=0.25").start()
    async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
        yield meter_pb2_grpc.MeterStub(ch)


Queue = asyncio.Queue[events_pb2.RunwayChanged]


async def subscribe(url: str, subject: str) -> tuple[object, Queue]:
    nc = await bus.connect(url, "test-subscriber")
    queue: asyncio.Queue[events_pb2.RunwayChanged] = asyncio.Queue()

    async def on_msg(msg: object) -> None:
        assert msg.headers[bus.TYPE_HEADER] == "kestrel.v1.RunwayChanged"  # type: ignore[attr-defined]
        await queue.put(events_pb2.RunwayChanged.FromString(msg.data))  # type: ignore[attr-defined]

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    return nc, queue


async def next_with(queue: asyncio.Queue[events_pb2.RunwayChanged], reason: int,
                    timeout_s: float = 15.0) -> tuple[events_pb2.RunwayChanged, list[int]]:
    seen: list[int] = []
    async with asyncio.timeout(timeout_s):
        while True:
            msg = await queue.get()
            seen.append(msg.reason)
            if msg.reason == reason:
                return msg, seen


async def test_a_subscriber_sees_the_top_up_the_thresholds_and_exhaustion(
        stub: meter_pb2_grpc.MeterStub, clean_bus: str) -> None:
    nc, queue = await subscribe(clean_bus, "kestrel.runway.burner")
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="burner"))
    topped = await stub.TopUp(meter_pb2.TopUpRequest(tenant="burner", amount="1"))
    msg, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_TOP_UP)
    assert (msg.runway.credits, msg.runway.remaining) == ("1", "1") == (
        topped.runway.credits, topped.runway.remaining)

    # 2 GPUs at 0.25/GPU-s burn 0.5 credits/s: the budget lasts 2 s.
    await publish_events(clean_bus, [wev("b-a", "burner", "burn-1", 1, now_us(), gpus=2,
                                         flavor="gpu-burn")])
    opened, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_ALLOCATION_OPENED)
    assert opened.runway.burn_per_s == "0.5" and opened.runway.running_gpus == 2
    half, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_THRESHOLD_50)
    tenth, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_THRESHOLD_10)
    gone, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_EXHAUSTED)
    assert half.runway.remaining_bp < 5000 and tenth.runway.remaining_bp < 1000
    assert float(gone.runway.remaining) <= 0 and gone.runway.runway_s == 0
    # Each figure traces back to rows: ledger_seq only grows.
    assert half.runway.ledger_seq <= tenth.runway.ledger_seq <= gone.runway.ledger_seq

    refill = await stub.TopUp(meter_pb2.TopUpRequest(tenant="burner", amount="100"))
    msg, _ = await next_with(queue, REASON.RUNWAY_CHANGE_REASON_TOP_UP)
    assert msg.runway.credits == refill.runway.credits == "101"
    await nc.close()  # type: ignore[attr-defined]


async def test_a_late_subscriber_reads_the_current_runway_of_every_tenant_at_once(
        stub: meter_pb2_grpc.MeterStub, clean_bus: str) -> None:
    for i, tenant in enumerate(["alpha", "beta", "gamma"]):
        await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant=tenant))
        for k in range(3):
            await stub.TopUp(meter_pb2.TopUpRequest(tenant=tenant, amount=str(10 * (i + 1)),
                                                    top_up_id=f"{tenant}-{k}"))
    nc = await bus.connect(clean_bus, "late")
    js = nc.jetstream()
    sub = await js.subscribe("kestrel.runway.>", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                             ordered_consumer=True)
    latest: dict[str, str] = {}
    async with asyncio.timeout(10):
        while len(latest) < 3:
            m = await sub.next_msg(timeout=5)
            r = events_pb2.RunwayChanged.FromString(m.data).runway
            latest[r.tenant] = r.credits
    assert latest == {"alpha": "30", "beta": "60", "gamma": "90"}
    info = await js.stream_info("KESTREL_RUNWAY")
    assert info.state.messages == 3  # one per subject: the last value only
    await nc.close()
