"""The gateway's rate limiter against a real Redis: leases never let more through than
the tenant's bucket holds, across replicas, and a busy tenant's calls mostly spend
tokens leased ahead instead of each costing a Redis call."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from kestrel_tools.devstack import Stack
from services.gateway.ratelimit import RateLimiter, connect


@pytest.fixture
async def redis_client(stack: Stack) -> AsyncIterator[aioredis.Redis]:
    client = connect(stack.redis_url, max_connections=16, wait_s=5.0)
    try:
        yield client
    finally:
        await client.aclose()


async def script_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha",
                                                                   "cmdstat_eval"))


async def test_a_burst_of_concurrent_first_calls_gets_exactly_the_burst(
        redis_client: aioredis.Redis) -> None:
    limiter = RateLimiter(redis_client)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    verdicts = await asyncio.gather(*(limiter.take(tenant, 0.01, 10) for _ in range(30)))
    assert sum(v.allowed for v in verdicts) == 10  # nothing leased and lost meanwhile
    refused = [v for v in verdicts if not v.allowed]
    assert all(v.retry_after_s > 1 for v in refused)  # 100 s a token at 0.01/s


async def test_two_replicas_together_never_let_through_more_than_the_bucket(
        redis_client: aioredis.Redis) -> None:
    replicas = [RateLimiter(redis_client), RateLimiter(redis_client)]
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    rate, burst = 500.0, 100
    allowed = 0
    t0 = time.monotonic()
    for i in range(600):  # far faster than 500/s: most are refused
        v = await replicas[i % 2].take(tenant, rate, burst)
        allowed += v.allowed
    elapsed = time.monotonic() - t0
    assert allowed <= burst + rate * elapsed + 1
    # Leased tokens left unspent are lost: at most a lease (an eighth of the burst) per
    # replica per lease period; the burst itself went through.
    assert allowed >= burst - 2 * (burst // 8)
    assert allowed < 600


async def test_a_busy_tenants_calls_mostly_spend_leased_tokens(
        redis_client: aioredis.Redis) -> None:
    limiter = RateLimiter(redis_client)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    before = await script_calls(redis_client)
    verdicts = []
    for _ in range(20):  # 20 rounds of 10 concurrent calls, all within the limit
        verdicts += await asyncio.gather(*(limiter.take(tenant, 10_000, 10_000)
                                           for _ in range(10)))
    asked = await script_calls(redis_client) - before
    assert all(v.allowed for v in verdicts)
    assert asked < len(verdicts) / 3, f"{asked} Redis calls for {len(verdicts)} calls"
