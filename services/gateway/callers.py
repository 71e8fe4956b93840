"""Who is calling the gateway: the operator's token, or a tenant's API key and its
rate limit. Key rows and tenant profiles are cached for CACHE_S, which bounds how long
another gateway replica honours a revoked key or an old profile; this replica forgets
them as it changes them."""

from __future__ import annotations

import time

from kestrel.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from services.gateway import auth
from services.gateway.ratelimit import RateLimiter
from services.gateway.store import GatewayStore, KeyRow, Profile

CACHE_S = 1.0


class Callers:
    def __init__(self, store: GatewayStore, limiter: RateLimiter,
                 operator_token_hash: str) -> None:
        self.store = store
        self.limiter = limiter
        self.operator_token_hash = operator_token_hash
        self._keys: dict[str, tuple[float, KeyRow | None]] = {}
        self._revocations = 0  # bumped by every revocation: see _key
        self._profiles: dict[str, tuple[float, Profile | None]] = {}

    def operator(self, metadata: object) -> None:
        """The operator token, or PermissionDenied."""
        token = auth.bearer(metadata)
        if not auth.token_matches(token, self.operator_token_hash):
            raise PermissionDenied("this call needs the operator token")

    async def tenant(self, metadata: object) -> Profile:
        """Authenticate a tenant key and spend one token of its rate limit."""
        key_id, secret = auth.parse_key(auth.bearer(metadata))
        key = await self._key(key_id)
        if key is None or not auth.secret_matches(secret, key.secret_hash):
            raise Unauthenticated("the API key is not valid")
        if key.revoked_us:
            raise Unauthenticated("the API key was revoked")
        profile = await self.profile(key.tenant)
        if profile is None:
            raise Unauthenticated("the API key's tenant no longer exists")
        verdict = await self.limiter.take(profile.tenant, profile.rate_per_s, profile.burst)
        if not verdict.allowed:
            raise ResourceExhausted(
                f"rate limit of {profile.rate_per_s:g}/s (burst {profile.burst}) exceeded",
                retry_after_s=verdict.retry_after_s)
        return profile

    async def profile(self, tenant: str) -> Profile | None:
        hit = self._profiles.get(tenant)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        p = await self.store.profile(tenant)
        self._profiles[tenant] = (time.monotonic(), p)
        return p

    def forget(self, tenant: str) -> None:
        """The tenant's profile changed here: read it afresh next time."""
        self._profiles.pop(tenant, None)

    def revoked(self, key_id: str) -> None:
        """The key was revoked here: refuse it from now on."""
        self._revocations += 1
        self._keys.pop(key_id, None)

    async def _key(self, key_id: str) -> KeyRow | None:
        """A key row, cached for CACHE_S. A read that a revocation overtook is not
        cached: it could hold the key as it was before."""
        hit = self._keys.get(key_id)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        before = self._revocations
        row = await self.store.key(key_id)
        if self._revocations == before:
            self._keys[key_id] = (time.monotonic(), row)
        return row
