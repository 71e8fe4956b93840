"""kestrel.service.tune_gc: what a service made before it serves is frozen (no
collection traverses it again) and collections are rarer than CPython's default."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kestrel import service


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_start_up_objects_are_frozen_and_young_collections_come_less_often() -> None:
    made_at_start = [{"n": i} for i in range(1000)]
    service.tune_gc()
    assert gc.get_freeze_count() >= len(made_at_start)
    assert gc.get_threshold() == service.GC_THRESHOLDS
    assert gc.get_threshold()[0] > 700  # CPython's default


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_while_serving_are_still_collected() -> None:
    service.tune_gc()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    del a, b
    assert gc.collect() >= 2
