"""Per-tenant token buckets in Redis, refilled and spent atomically by one Lua script.

The Redis pool is bounded on purpose (`KESTREL_GATEWAY_REDIS_MAX_CONNECTIONS`): a
burst of calls waits for a connection up to `KESTREL_GATEWAY_REDIS_WAIT_S` rather
than failing, and a call that still finds none, or finds Redis away, is refused as
UNAVAILABLE with RetryInfo, never INTERNAL.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kestrel.errors import Unavailable

# A client told to come back after this long finds the pool drained or Redis back.
RETRY_AFTER_S = 0.5

# KEYS[1] bucket hash; ARGV: rate per second, burst, cost.
# Uses the server's clock, so every gateway replica agrees.
_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(b[1])
local at = tonumber(b[2])
if tokens == nil then tokens = burst; at = now end
tokens = math.min(burst, tokens + (now - at) * rate / 1000000)
local allowed = 0
local wait_us = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait_us = math.ceil((cost - tokens) * 1000000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, wait_us}
"""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: float


def connect(url: str, max_connections: int, wait_s: float) -> aioredis.Redis:
    """A client over a bounded pool: at most `max_connections` sockets; a caller waits up
    to `wait_s` for a free one, and a command is bounded by a socket timeout as well."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s,
        socket_connect_timeout=5.0, socket_timeout=5.0)
    return aioredis.Redis(connection_pool=pool)


class RateLimiter:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.script = client.register_script(_SCRIPT)

    async def take(self, tenant: str, rate_per_s: float, burst: int, cost: int = 1) -> Verdict:
        try:
            allowed, wait_us = await self.script(keys=[f"kestrel:rl:{tenant}"],
                                                 args=[rate_per_s, burst, cost])
        except (RedisError, OSError, TimeoutError) as exc:
            # Pool exhausted past its wait, Redis restarting or slow: the call may succeed
            # a moment later, so say so instead of failing as INTERNAL.
            raise Unavailable(f"the rate limiter is busy or unreachable "
                              f"({type(exc).__name__}); retry",
                              retry_after_s=RETRY_AFTER_S) from exc
        return Verdict(bool(int(allowed)), int(wait_us) / 1e6)
