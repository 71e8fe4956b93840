"""services.gateway.callers: who is calling, with fakes for the store and the limiter
(the real ones are exercised by the integration tier)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kestrel.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from services.gateway import auth
from services.gateway.callers import Callers
from services.gateway.ratelimit import Allowance
from services.gateway.store import KeyRow, Profile

KEY = auth.new_key()
OP_TOKEN = "op-secret"


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class Store:
    def __init__(self) -> None:
        self.keys = {KEY.key_id: KeyRow(KEY.key_id, "acme", "ci", KEY.secret_hash, 1, 0)}
        self.profiles = {"acme": Profile("acme", "", {"gpu-h100": 1}, 5.0, 10, False, 1)}
        self.key_reads = 0
        self.hold: asyncio.Event | None = None  # a key read waits on it when set

    async def key(self, key_id: str) -> KeyRow | None:
        self.key_reads += 1
        row = self.keys.get(key_id)
        if self.hold is not None:
            await self.hold.wait()
        return row

    async def profile(self, tenant: str) -> Profile | None:
        return self.profiles.get(tenant)


class Limiter:
    def __init__(self, allowed: bool = True) -> None:
        self.allowed = allowed
        self.taken: list[str] = []

    async def take(self, tenant: str, rate_per_s: float, burst: int, cost: int = 1) -> Allowance:
        self.taken.append(tenant)
        return Allowance(self.allowed, 0.0 if self.allowed else 0.2)


def callers(store: Store, limiter: Limiter | None = None) -> Callers:
    return Callers(cast(Any, store), cast(Any, limiter or Limiter()),
                   auth.hash_secret(OP_TOKEN))


async def test_a_tenant_key_names_its_tenant_and_spends_one_token() -> None:
    limiter = Limiter()
    c = callers(Store(), limiter)
    assert (await c.tenant(md(KEY.secret))).tenant == "acme"
    assert limiter.taken == ["acme"]


@pytest.mark.parametrize(("name", "token", "why"), [
    ("a malformed key", "ks_nope", "malformed"),
    ("a wrong secret", KEY.secret[:-4] + "AAAA", "not valid"),
    ("the operator token", OP_TOKEN, "malformed"),
])
async def test_a_bad_key_is_unauthenticated(name: str, token: str, why: str) -> None:
    with pytest.raises(Unauthenticated, match=why):
        await callers(Store()).tenant(md(token))


async def test_a_tenant_over_its_rate_is_told_when_to_retry() -> None:
    with pytest.raises(ResourceExhausted) as err:
        await callers(Store(), Limiter(allowed=False)).tenant(md(KEY.secret))
    assert err.value.retry_after_s == 0.2


async def test_only_the_operator_token_is_the_operator() -> None:
    c = callers(Store())
    c.operator(md(OP_TOKEN))
    with pytest.raises(PermissionDenied):
        c.operator(md(KEY.secret))


async def test_a_key_is_read_once_per_cache_period() -> None:
    store = Store()
    c = callers(store)
    await c.tenant(md(KEY.secret))
    await c.tenant(md(KEY.secret))
    assert store.key_reads == 1


async def test_a_revocation_here_is_refused_at_once_and_not_undone_by_a_read_in_flight() -> None:
    store = Store()
    c = callers(store)
    store.hold = asyncio.Event()
    reading = asyncio.create_task(c.tenant(md(KEY.secret)))  # reads the key as it was
    await asyncio.sleep(0)
    store.keys[KEY.key_id] = KeyRow(KEY.key_id, "acme", "ci", KEY.secret_hash, 1, 99)
    c.revoked(KEY.key_id)
    store.hold.set()
    assert (await reading).tenant == "acme"  # it began before the revocation
    with pytest.raises(Unauthenticated, match="revoked"):  # its stale row was not cached
        await c.tenant(md(KEY.secret))


async def test_a_profile_changed_here_is_read_afresh() -> None:
    store = Store()
    c = callers(store)
    assert (await c.tenant(md(KEY.secret))).rate_per_s == 5.0
    store.profiles["acme"] = Profile("acme", "", {}, 9.0, 10, False, 1)
    assert (await c.tenant(md(KEY.secret))).rate_per_s == 5.0  # cached
    c.forget("acme")
    assert (await c.tenant(md(KEY.secret))).rate_per_s == 9.0
