"""kestrel.batching: what a caller gets back, and how calls are gathered, with a send
function that records each batch and answers when the test lets it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from kestrel.batching import Batcher


@dataclass
class Backend:
    """send(): records each batch, waits for `release`, answers item * 10 (or the
    exception an item names)."""

    batches: list[list[object]] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    fail_call: Exception | None = None

    async def send(self, items: list[object], timeout_s: float
                   ) -> Sequence[object | Exception]:
        self.batches.append(list(items))
        self.timeouts.append(timeout_s)
        await self.release.wait()
        if self.fail_call is not None:
            raise self.fail_call
        return [i if isinstance(i, Exception) else i * 10  # type: ignore[operator]
                for i in items]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_item_alone_goes_at_once_in_a_batch_of_one() -> None:
    b = Backend()
    b.release.set()
    batcher: Batcher[object, object] = Batcher(b.send)
    assert await batcher.call(4, 5.0) == 40
    assert b.batches == [[4]]


async def test_items_arriving_while_batches_are_out_go_together_in_order() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_in_flight=1)
    first = asyncio.ensure_future(batcher.call(1, 5.0))
    await settle()
    rest = [asyncio.ensure_future(batcher.call(i, 5.0)) for i in (2, 3, 4)]
    await settle()
    assert b.batches == [[1]]  # the others wait for the batch out
    b.release.set()
    assert [await f for f in (first, *rest)] == [10, 20, 30, 40]
    assert b.batches == [[1], [2, 3, 4]]


async def test_items_of_one_turn_of_the_loop_leave_together() -> None:
    b = Backend()
    b.release.set()
    batcher: Batcher[object, object] = Batcher(b.send)
    assert await asyncio.gather(*(batcher.call(i, 5.0) for i in range(3))) == [0, 10, 20]
    assert b.batches == [[0, 1, 2]]


async def test_no_batch_is_larger_than_max_batch_and_no_more_are_out_than_allowed() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_batch=2, max_in_flight=2)
    calls = [asyncio.ensure_future(batcher.call(i, 5.0)) for i in range(7)]
    await settle()
    assert b.batches == [[0, 1], [2, 3]]
    b.release.set()
    assert [await c for c in calls] == [0, 10, 20, 30, 40, 50, 60]
    assert b.batches == [[0, 1], [2, 3], [4, 5], [6]]


async def test_a_batch_stops_short_of_max_bytes_and_a_larger_item_goes_alone() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_in_flight=1, max_bytes=10,
                                               size=lambda item: item)  # type: ignore[arg-type,return-value]
    first = asyncio.ensure_future(batcher.call(1, 5.0))
    await settle()
    rest = [asyncio.ensure_future(batcher.call(i, 5.0)) for i in (4, 5, 2, 30, 3)]
    await settle()
    b.release.set()
    await asyncio.gather(first, *rest)
    assert b.batches == [[1], [4, 5], [2], [30], [3]]


async def test_each_caller_gets_its_own_items_failure_and_the_others_their_results() -> None:
    b = Backend()
    b.release.set()
    batcher: Batcher[object, object] = Batcher(b.send)
    bad = ValueError("that one")
    out = await asyncio.gather(batcher.call(1, 5.0), batcher.call(bad, 5.0),
                               batcher.call(3, 5.0), return_exceptions=True)
    assert list(out) == [10, bad, 30]


async def test_a_failed_call_fails_every_item_it_carried_and_the_next_batch_still_goes(
        ) -> None:
    b = Backend(fail_call=ConnectionError("admission away"))
    b.release.set()
    batcher: Batcher[object, object] = Batcher(b.send)
    out = await asyncio.gather(batcher.call(1, 5.0), batcher.call(2, 5.0),
                               return_exceptions=True)
    assert [type(e) for e in out] == [ConnectionError, ConnectionError]
    assert out[0] is not out[1]  # each caller raises its own copy
    b.fail_call = None
    assert await batcher.call(3, 5.0) == 30


async def test_a_caller_gone_before_its_item_left_takes_it_out() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_in_flight=1)
    first = asyncio.ensure_future(batcher.call(1, 5.0))
    await settle()
    gone = asyncio.ensure_future(batcher.call(2, 5.0))
    stays = asyncio.ensure_future(batcher.call(3, 5.0))
    await settle()
    gone.cancel()
    b.release.set()
    assert (await first, await stays) == (10, 30)
    assert b.batches == [[1], [3]]


async def test_a_caller_gone_after_its_item_left_leaves_the_others_their_results() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send)
    gone = asyncio.ensure_future(batcher.call(1, 5.0))
    stays = asyncio.ensure_future(batcher.call(2, 5.0))
    await settle()
    assert b.batches == [[1, 2]]
    gone.cancel()
    b.release.set()
    assert await stays == 20
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_batch_waits_for_the_latest_deadline_among_its_items() -> None:
    b = Backend()
    b.release.set()
    batcher: Batcher[object, object] = Batcher(b.send)
    await asyncio.gather(batcher.call(1, 2.0), batcher.call(2, 9.0), batcher.call(3, 4.0))
    assert len(b.timeouts) == 1 and 8.5 < b.timeouts[0] <= 9.0


def test_a_batcher_needs_room_for_one_item_and_one_call() -> None:
    async def send(items: list[int], timeout_s: float) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Batcher(send, max_batch=0)
    with pytest.raises(ValueError):
        Batcher(send, max_in_flight=0)


async def test_with_patience_a_second_batch_waits_while_the_first_may_yet_answer() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_in_flight=4, patience_s=60.0)
    first = asyncio.ensure_future(batcher.call(1, 5.0))
    await settle()
    rest = [asyncio.ensure_future(batcher.call(i, 5.0)) for i in (2, 3)]
    await settle()
    assert b.batches == [[1]]  # room for three more calls, but the first is young
    b.release.set()
    assert [await f for f in (first, *rest)] == [10, 20, 30]
    assert b.batches == [[1], [2, 3]]


async def test_with_patience_a_slow_batch_lets_the_next_go_once_patience_runs_out() -> None:
    b = Backend()
    batcher: Batcher[object, object] = Batcher(b.send, max_in_flight=2, patience_s=0.05)
    first = asyncio.ensure_future(batcher.call(1, 5.0))
    await settle()
    second = asyncio.ensure_future(batcher.call(2, 5.0))
    await asyncio.sleep(0.01)
    assert b.batches == [[1]]
    await asyncio.sleep(0.08)
    assert b.batches == [[1], [2]]  # the first is still out
    third = asyncio.ensure_future(batcher.call(3, 5.0))
    await asyncio.sleep(0.1)
    assert b.batches == [[1], [2]]  # two out: max_in_flight holds it whatever their age
    b.release.set()
    assert [await f for f in (first, second, third)] == [10, 20, 30]
    assert b.batches == [[1], [2], [3]]


def test_patience_is_not_negative() -> None:
    async def send(items: list[int], timeout_s: float) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Batcher(send, patience_s=-1.0)
