"""The worker's batch assembly (services/worker/batching.py): a table of sentences."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kestrel.endpoints import Priority
from services.worker.batching import BatchPolicy, Queued, plan_batch, ready, wait_left_us

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW
POLICY = BatchPolicy(max_batch=4, max_wait_us=5_000, starve_after_us=100_000)
NOW = 1_000_000


def q(key: str, prio: Priority, age_us: int, texts: int = 1, deadline_in_us: int = 10**9,
      seen_age_us: int = 0) -> Queued[None]:
    return Queued(key, prio, NOW - age_us, NOW + deadline_in_us if deadline_in_us else 0,
                  texts, NOW - seen_age_us, None)


@dataclass(frozen=True)
class Case:
    name: str
    queued: list[Queued[None]]
    want_batch: list[str]
    want_expired: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.name


CASES = [
    Case("high priority goes before older normal and low ones",
         [q("l1", L, 50_000), q("n1", N, 40_000), q("h1", H, 1_000)], ["h1", "n1", "l1"]),
    Case("first come first served within a priority",
         [q("h2", H, 1_000), q("h1", H, 2_000)], ["h1", "h2"]),
    Case("a full batch leaves the lowest priority for later",
         [q("l1", L, 50_000), *(q(f"h{i}", H, 1_000 + i) for i in range(4))],
         ["h3", "h2", "h1", "h0"]),
    Case("a low request that waited past the starvation age goes before fresh high ones",
         [q("l1", L, 150_000), *(q(f"h{i}", H, 1_000 + i) for i in range(4))],
         ["l1", "h3", "h2", "h1"]),
    Case("starving requests go oldest first, whatever their priority",
         [q("h1", H, 120_000), q("l1", L, 200_000), q("h2", H, 1_000)], ["l1", "h1", "h2"]),
    Case("an expired request is dropped, never computed",
         [q("h1", H, 1_000, deadline_in_us=-1), q("n1", N, 1_000)], ["n1"], ["h1"]),
    Case("no deadline (0) never expires",
         [q("n1", N, 10**8, deadline_in_us=0)], ["n1"]),
    Case("texts count, not requests: a 3-text request leaves room for one more",
         [q("a", H, 3_000, texts=3), q("b", H, 2_000, texts=2), q("c", H, 1_000)], ["a"]),
    Case("one request larger than the batch runs alone",
         [q("big", H, 3_000, texts=9), q("b", H, 1_000)], ["big"]),
    Case("nothing queued, nothing to run", [], []),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_plan_batch(case: Case) -> None:
    plan = plan_batch(case.queued, NOW, POLICY)
    assert [x.key for x in plan.batch] == case.want_batch
    assert [x.key for x in plan.expired] == case.want_expired
    assert {x.key for x in plan.batch} | {x.key for x in plan.expired} | \
        {x.key for x in plan.rest} == {x.key for x in case.queued}


def test_deadline_of_exactly_now_is_expired() -> None:
    item = Queued("n1", N, NOW - 1_000, NOW, 1, NOW, None)
    assert [x.key for x in plan_batch([item], NOW, POLICY).expired] == ["n1"]


@pytest.mark.parametrize(("name", "queued", "want_ready", "want_left"), [
    ("empty: nothing to run", [], False, 0),
    ("a full batch runs at once", [q(f"h{i}", H, 0) for i in range(4)], True, 0),
    ("one request seen 1 ms ago waits 4 ms more", [q("h", H, 0, seen_age_us=1_000)], False,
     4_000),
    ("one request seen max_wait ago runs", [q("h", H, 0, seen_age_us=5_000)], True, 0),
], ids=lambda x: x if isinstance(x, str) else "")
def test_ready_and_wait(name: str, queued: list[Queued[None]], want_ready: bool,
                        want_left: int) -> None:
    assert ready(queued, NOW, POLICY) is want_ready
    assert wait_left_us(queued, NOW, POLICY) == want_left


def test_a_policy_with_no_room_is_refused() -> None:
    with pytest.raises(ValueError):
        BatchPolicy(max_batch=0)
