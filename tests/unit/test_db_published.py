"""kestrel.db.Published: another service's view is asked for until it exists, then
known, so a hot path (the placer's cancelled check on every placement) pays one
statement, not two."""

from __future__ import annotations

from typing import Any, cast

from kestrel.db import Published


class Pool:
    def __init__(self, exists: set[str]) -> None:
        self.exists = exists
        self.asked: list[str] = []

    async def fetchval(self, query: str, relation: str) -> bool:
        assert "to_regclass" in query
        self.asked.append(relation)
        return relation in self.exists


async def test_a_view_not_there_yet_is_asked_again_and_once_there_never_again() -> None:
    pool = Pool(set())
    published = Published(cast(Any, pool))
    assert not await published.exists("job_status")
    assert not await published.exists("job_status")
    pool.exists.add("job_status")  # the owner migrated meanwhile
    for _ in range(5):
        assert await published.exists("job_status")
    assert pool.asked == ["job_status"] * 3


async def test_each_view_is_known_on_its_own() -> None:
    pool = Pool({"current_prices"})
    published = Published(cast(Any, pool))
    assert await published.exists("current_prices")
    assert not await published.exists("open_holds")
    assert await published.exists("current_prices")
    assert pool.asked == ["current_prices", "open_holds"]
