"""NATS as a three-node JetStream cluster (the devstack's `nats_nodes=3`, what
`make up HA=1` starts): routes between the nodes on loopback, authenticated; every
Kestrel stream kept by three of them (Raft), so a stream stays writable while two are
up. Real nats-server processes; the clients are Kestrel's own (kestrel.bus)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamInfo

from kestrel import bus
from kestrel_sdk.v1 import events_pb2
from kestrel_tools.devstack import Stack

pytestmark = pytest.mark.integration

TENANT = "ha"
N = 300
T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "ha", nats_nodes=3)
    stack.start_nats()
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture
async def js(cluster: Stack) -> AsyncIterator[JetStreamContext]:
    nc: NATS = await bus.connect(cluster.nats_url, "ha-test")
    js = nc.jetstream()
    # the cluster's meta leader is elected a moment after the nodes start
    await _meta_answers(lambda: bus.ensure_streams(js, replicas=3))
    yield js
    await nc.close()


async def _settled(js: JetStreamContext, stream: str, timeout_s: float = 30) -> StreamInfo:
    """The stream's info once it has a leader and both other replicas are current."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = await js.stream_info(stream)
            c = info.cluster
            if c and c.leader and c.replicas and len(c.replicas) == 2 and all(
                    r.current for r in c.replicas):
                return info
        except (nats.errors.Error, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"{stream} not settled in {timeout_s} s"
        await asyncio.sleep(0.2)


async def _publish_until_acked(js: JetStreamContext, i: int) -> int:
    """Publish event i until a stream acknowledges it, with the same message id each try
    (a try whose ack was lost is dropped by the stream's duplicate window); how many
    tries it took."""
    msg = events_pb2.WorkloadEvent(workload_id=f"w{i}", tenant=TENANT,
                                   type=events_pb2.WORKLOAD_EVENT_TYPE_ADMITTED)
    tries = 0
    while True:
        tries += 1
        try:
            await bus.publish(js, bus.subject_workload(TENANT, 1), msg, f"ha-{i}",
                              ack_timeout_s=1.0)
            return tries
        except (nats.errors.Error, TimeoutError):
            await asyncio.sleep(0.05)


async def _meta_answers(call: Callable[[], Awaitable[T]], timeout_s: float = 30) -> T:
    """`call`, again while the cluster's meta leader is being elected."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def test_a_cluster_node_is_configured_with_authenticated_routes(cluster: Stack) -> None:
    conf = (cluster.root / "nats-2.conf").read_text()
    assert '"server_name": "nats-2"' in conf
    assert f"route:{cluster.nats_route_password}@127.0.0.1:" in conf
    assert conf.count("nats-route://") == 2  # routes to the two others
    assert len(cluster.nats_url.split(",")) == 3


async def test_every_stream_is_kept_by_three_nodes(js: JetStreamContext) -> None:
    for spec in bus.STREAMS:
        info = await _settled(js, spec.name)
        assert info.config.num_replicas == 3


async def test_the_stream_leader_killed_mid_publish_loses_and_doubles_nothing(
        cluster: Stack, js: JetStreamContext) -> None:
    stream = "KESTREL_WORKLOADS"
    leader = (await _settled(js, stream)).cluster.leader  # type: ignore[union-attr]
    assert leader in cluster.nats_node_names
    retried = 0
    recovery_s = 0.0
    for i in range(N):
        if i == N // 3:
            os.kill(cluster.pids[leader], signal.SIGKILL)
            killed_at = time.monotonic()
        retried += await _publish_until_acked(js, i) - 1
        if i == N // 3:
            recovery_s = time.monotonic() - killed_at
    after = await js.stream_info(stream)
    assert after.cluster is not None and after.cluster.leader != leader
    assert after.state.messages == N  # none lost, none twice
    # Read back in order from one of the two nodes left: each event once, in order.
    # Creating the consumer asks the meta leader, which may have been the killed node
    # and is elected anew (4-9 s) independently of the stream's leader.
    sub = await _meta_answers(lambda: js.subscribe(bus.subject_workload(TENANT, 1),
                                                   ordered_consumer=True))
    seen = []
    for _ in range(N):
        msg = await sub.next_msg(timeout=10)
        seen.append(events_pb2.WorkloadEvent.FromString(msg.data).workload_id)
    await sub.unsubscribe()
    assert seen == [f"w{i}" for i in range(N)]
    print(f"\nnats cluster: stream leader {leader} killed at message {N // 3}; "
          f"{after.cluster.leader} leads; that message acknowledged {recovery_s:.2f} s "
          f"after the kill; {retried} tries again in all; {N} messages, each once")
    # The killed node comes back and catches up from the others.
    cluster.start_nats()
    info = await _settled(js, stream, timeout_s=60)
    assert info.state.messages == N
