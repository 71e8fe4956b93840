"""Per-tenant token buckets in Redis, refilled and spent atomically by one Lua script."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

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


class RateLimiter:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.script = client.register_script(_SCRIPT)

    async def take(self, tenant: str, rate_per_s: float, burst: int, cost: int = 1) -> Verdict:
        allowed, wait_us = await self.script(keys=[f"kestrel:rl:{tenant}"],
                                             args=[rate_per_s, burst, cost])
        return Verdict(bool(int(allowed)), int(wait_us) / 1e6)
