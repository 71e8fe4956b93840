"""Endpoints and Infer end to end: gateway -> Redis streams -> model worker processes ->
gateway, on the real Postgres, NATS and Redis of the fixtures. Replicas are host
processes (`python -m services.worker`), as they are until Kubernetes placement lands."""

from __future__ import annotations

import asyncio
import math
import statistics
import urllib.request
from collections import Counter
from typing import Any

import grpc
import pytest

import kestrel_sdk
from kestrel import endpoints as ep
from kestrel.clock import now_us
from kestrel_sdk.v1 import gateway_pb2, worker_pb2
from kestrel_tools.devstack import free_port
from tests.integration.endpoint_world import (
    BABY,
    BREAD,
    FOOD,
    World,
    _create,
    answer,
    cos,
    infer,
    make_tenant,
)
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration


async def test_infer_end_to_end_vectors_truncation_and_bad_input(world: World) -> None:
    w = world
    metrics_port = free_port()
    w.start_worker(w.endpoint_id, KESTREL_WORKER_METRICS_PORT=str(metrics_port))
    got = await w.stub.GetEndpoint(gateway_pb2.GetEndpointRequest(endpoint_id=w.endpoint_id),
                                   metadata=w.md)
    assert got.endpoint.ready_replicas == 1 and got.endpoint.spec.model == ep.MODEL_NAME
    listed = await w.stub.ListEndpoints(gateway_pb2.ListEndpointsRequest(), metadata=w.md)
    assert [e.endpoint_id for e in listed.endpoints] == [w.endpoint_id]

    long_text = "bread " * 600  # ~600 word pieces: cut at 256
    resp = await infer(w, [FOOD, BREAD, BABY, long_text])
    v = [list(e.values) for e in resp.embeddings]
    assert len(v) == 4 and all(len(x) == 384 for x in v)
    assert all(abs(math.sqrt(sum(x * x for x in e)) - 1) < 1e-3 for e in v)
    similar, unrelated = cos(v[0], v[1]), cos(v[0], v[2])
    print(f"\ncos(food, bread)={similar:.4f} cos(food, baby)={unrelated:.4f} "
          f"truncated={list(resp.truncated)} queue_ms={resp.queue_ms:.1f} "
          f"latency_ms={resp.latency_ms:.1f} replica={resp.replica}")
    assert 0.70 <= similar <= 0.80
    assert abs(unrelated) <= 0.2
    assert list(resp.truncated) == [3] and resp.max_input_tokens == ep.MAX_INPUT_TOKENS

    # /metrics: batch sizes, queue wait, inference time, embeddings served.
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                       timeout=5).read().decode())
    for line in ("kestrel_worker_batch_size_count", "kestrel_worker_queue_wait_seconds_count",
                 "kestrel_worker_inference_seconds_count",
                 "kestrel_worker_last_heartbeat_timestamp_seconds"):
        assert line in text, line
    served = [x for x in text.splitlines() if x.startswith("kestrel_worker_embeddings_total")]
    assert served and float(served[0].split()[-1]) == 4.0, served

    # The SDK: the same vectors, the endpoint in its own types.
    key = w.md[0][1].removeprefix("Bearer ")
    async with kestrel_sdk.AsyncClient(w.plane.address("gateway"), api_key=key) as c:
        r = await c.infer(w.endpoint_id, [FOOD, long_text], priority="high", timeout_s=5)
        assert r.truncated == [1] and cos(r.embeddings[0], v[0]) > 0.9999
        assert [e.endpoint_id for e in await c.list_endpoints()] == [w.endpoint_id]
        mine = await c.create_endpoint("second")
        assert (await c.get_endpoint(mine.endpoint_id)).name == "second"
        assert await c.delete_endpoint(mine.endpoint_id) is True
        assert await c.delete_endpoint(mine.endpoint_id) is False
        with pytest.raises(kestrel_sdk.InvalidArgument):
            await c.infer(w.endpoint_id, [])

    bad = {
        "empty list": gateway_pb2.InferRequest(endpoint_id=w.endpoint_id),
        "too many texts": gateway_pb2.InferRequest(endpoint_id=w.endpoint_id,
                                                   inputs=["x"] * (ep.MAX_TEXTS + 1)),
        "unknown priority": gateway_pb2.InferRequest(endpoint_id=w.endpoint_id, inputs=["x"],
                                                     priority=9),  # type: ignore[arg-type]
        "timeout over a minute": gateway_pb2.InferRequest(endpoint_id=w.endpoint_id,
                                                          inputs=["x"], timeout_ms=60_001),
        "malformed id": gateway_pb2.InferRequest(endpoint_id="nope", inputs=["x"]),
        "text over 4096 characters": gateway_pb2.InferRequest(endpoint_id=w.endpoint_id,
                                                              inputs=["x" * 4097]),
    }
    for what, req in bad.items():
        code, details, _, _ = await answer(w.stub.Infer(req, metadata=w.md, timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (what, code, details)

    # Another tenant's endpoint is one that never existed.
    foreign = await answer(infer(w, [FOOD], md=w.other_md))
    never = await answer(infer(w, [FOOD], endpoint_id="ep-0123456789abcdef"))
    assert foreign[0] == never[0] == grpc.StatusCode.NOT_FOUND
    assert foreign[1].replace(w.endpoint_id, "X") == never[1].replace("ep-0123456789abcdef",
                                                                     "X")
    for call in (w.stub.GetEndpoint(gateway_pb2.GetEndpointRequest(endpoint_id=w.endpoint_id),
                                    metadata=w.other_md),
                 w.stub.DeleteEndpoint(gateway_pb2.GatewayDeleteEndpointRequest(
                     endpoint_id=w.endpoint_id), metadata=w.other_md)):
        assert (await answer(call))[0] == grpc.StatusCode.NOT_FOUND
    theirs = await w.stub.ListEndpoints(gateway_pb2.ListEndpointsRequest(), metadata=w.other_md)
    assert not theirs.endpoints

    # Deleted: NOT_FOUND, saying so; gone from the list; a second delete changes nothing.
    d = await w.stub.DeleteEndpoint(gateway_pb2.GatewayDeleteEndpointRequest(
        endpoint_id=w.endpoint_id), metadata=w.md)
    assert d.deleted
    code, details, _, _ = await answer(infer(w, [FOOD]))
    assert code == grpc.StatusCode.NOT_FOUND and "deleted" in details
    assert not (await w.stub.ListEndpoints(gateway_pb2.ListEndpointsRequest(),
                                           metadata=w.md)).endpoints


async def test_no_replica_unavailable_expired_not_computed_and_rate_limit(
        world: World) -> None:
    w = world
    # No replica at all: the call waits to its deadline, then UNAVAILABLE with RetryInfo.
    t0 = asyncio.get_running_loop().time()
    code, details, retry, _ = await answer(infer(w, [FOOD], timeout_ms=800))
    waited = asyncio.get_running_loop().time() - t0
    assert code == grpc.StatusCode.UNAVAILABLE and retry is not None and retry > 0, details
    assert "no ready replica" in details and waited >= 0.7

    # A replica that heartbeats but does not read (stands in for a saturated one): the
    # request expires in the queue -> DEADLINE_EXCEEDED; the real replica started after
    # skips it, never computes it.
    fake = worker_pb2.WorkerHeartbeat(replica="stuck", endpoint_id=w.endpoint_id,
                                      time_us=now_us() + 60_000_000)
    await w.redis.hset(ep.replicas_key(w.endpoint_id), "stuck", fake.SerializeToString())
    code, details, _, _ = await answer(infer(w, [FOOD, BREAD], timeout_ms=500))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "not computed" in details, details
    await w.redis.hdel(ep.replicas_key(w.endpoint_id), "stuck")
    w.start_worker(w.endpoint_id)
    ok = await infer(w, [FOOD])  # served after the expired one was skipped
    assert len(ok.embeddings) == 1

    async def heartbeat() -> worker_pb2.WorkerHeartbeat:
        beats: Any = await w.redis.hgetall(ep.replicas_key(w.endpoint_id))
        return worker_pb2.WorkerHeartbeat.FromString(next(iter(beats.values())))

    hb = await eventually(heartbeat, lambda h: h.served >= 1 and h.expired >= 2, 10)
    # Both requests that outlived their deadline in the queue (the one without a replica
    # and the one behind the stuck replica) were skipped; their texts never ran.
    assert hb.expired == 2 and hb.served == 1 and hb.batches == 1, hb
    assert hb.mean_batch_size == 1.0
    assert 0 < hb.busy_s < 10  # the one batch that ran, in model seconds

    # Per-tenant rate limit: RESOURCE_EXHAUSTED with RetryInfo.
    slow = await make_tenant(w.stub, "slow", rate=0.1, burst=2)
    e = await w.stub.CreateEndpoint(_create("e"), metadata=slow)  # its first token
    codes = [await answer(infer(w, [FOOD], md=slow, endpoint_id=e.endpoint.endpoint_id,
                                timeout_ms=50)) for _ in range(4)]
    limited = [c for c in codes if c[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert limited and all(c[2] is not None and c[2] > 0 for c in limited), codes


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


async def test_high_priority_waits_less_than_low_under_saturation(world: World) -> None:
    """Closed-loop clients of both classes, more than a batch holds: high requests are
    served first, low ones still complete (the starvation guard)."""
    w = world
    w.start_worker(w.endpoint_id, KESTREL_WORKER_MAX_BATCH="4",
                   KESTREL_WORKER_STARVE_MS="2000")
    waits: dict[str, list[float]] = {"high": [], "low": []}
    failures: Counter[str] = Counter()
    stop = asyncio.Event()

    async def client(cls: str) -> None:
        prio = gateway_pb2.INFER_PRIORITY_HIGH if cls == "high" else \
            gateway_pb2.INFER_PRIORITY_LOW
        while not stop.is_set():
            code, details, _, resp = await answer(infer(w, [FOOD], priority=prio,
                                                        timeout_ms=30_000))
            if resp is None:
                failures[f"{cls} {code.name} {details[:60]}"] += 1
            else:
                waits[cls].append(resp.queue_ms)

    await infer(w, [FOOD])  # warm
    tasks = [asyncio.create_task(client(c)) for c in ["high"] * 8 + ["low"] * 8]
    for _ in range(600):
        await asyncio.sleep(0.1)
        if len(waits["high"]) >= 300 and len(waits["low"]) >= 40:
            break
    stop.set()
    await asyncio.gather(*tasks)
    hi, lo = p99(waits["high"]), p99(waits["low"])
    print(f"\npriority: high n={len(waits['high'])} p50={statistics.median(waits['high']):.1f}"
          f" p99={hi:.1f} ms; low n={len(waits['low'])} p50="
          f"{statistics.median(waits['low']):.1f} p99={lo:.1f} ms; failures={dict(failures)}")
    assert not failures
    assert len(waits["low"]) >= 10, "low priority starved"
    assert hi < lo
    assert statistics.median(waits["high"]) < statistics.median(waits["low"])


async def test_kill9_of_a_replica_mid_batch_loses_nothing(world: World) -> None:
    """Two replicas under load; one is killed -9. Every call gets exactly one answer: its
    vectors, or a clear error; the dead replica's pending requests are claimed."""
    w = world
    victim = w.start_worker(w.endpoint_id, KESTREL_WORKER_MAX_BATCH="8")
    w.start_worker(w.endpoint_id, KESTREL_WORKER_MAX_BATCH="8")
    results: list[tuple[str, Any]] = []

    async def one(i: int) -> None:
        texts = [f"request {i} text {j}" for j in range(4)]
        code, details, _, resp = await answer(infer(w, texts, timeout_ms=20_000))
        if resp is not None:
            assert len(resp.embeddings) == 4
            results.append(("ok", resp.replica))
        else:
            results.append((code.name, details))

    sem = asyncio.Semaphore(24)

    async def gated(i: int) -> None:
        async with sem:
            await one(i)

    tasks = [asyncio.create_task(gated(i)) for i in range(400)]
    await eventually(lambda: asyncio.sleep(0.02, len(results)), lambda n: n >= 60, 60)
    victim.kill9()
    killed_at = len(results)
    await asyncio.gather(*tasks)
    kinds = Counter(r[0] for r in results)
    claimed = await w.redis.xinfo_groups(ep.request_stream(w.endpoint_id, ep.Priority.NORMAL))
    taken = sum(line.count("claimed") for p in w.plane.tmp.glob("worker-*.log")
                for line in p.read_text().splitlines())
    print(f"\nkill -9 after {killed_at} answers: {dict(kinds)} of {len(results)}; "
          f"claim log lines {taken}; group: {claimed}")
    assert len(results) == 400  # every call answered, once
    assert set(kinds) <= {"ok", "UNAVAILABLE", "DEADLINE_EXCEEDED"}
    assert kinds["ok"] >= 390
    pending = await w.redis.xpending(ep.request_stream(w.endpoint_id, ep.Priority.NORMAL),
                                     ep.GROUP)
    assert pending["pending"] == 0
    # The dead replica's consumer leaves the group once nothing is pending under it.
    groups = await eventually(lambda: w.redis.xinfo_consumers(
        ep.request_stream(w.endpoint_id, ep.Priority.NORMAL), ep.GROUP),
        lambda cs: len(cs) == 1, 15)
    assert len(groups) == 1, groups
