"""The ledger audit's verdicts over hand-built chains (services.meter.audit.verify)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from services.meter.audit import GENESIS, ChainRow, digest, verify


def chain(n: int) -> list[ChainRow]:
    rows, prev = [], GENESIS
    for i in range(1, n + 1):
        values = (str(i), str(100 + i), "acme", f"w{i}", "gpu-h100", "1", "0", "10", "10",
                  "0.001000000", "0.000000010000000", f"c{i}", "usage", "0")
        h = digest(prev, values)
        rows.append(ChainRow(values, prev, h))
        prev = h
    return rows


def edited(rows: list[ChainRow]) -> list[ChainRow]:
    r = rows[2]
    return [*rows[:2], replace(r, values=(*r.values[:2], "other", *r.values[3:])), *rows[3:]]


def rehashed(rows: list[ChainRow]) -> list[ChainRow]:
    r = edited(rows)[2]
    return [*rows[:2], replace(r, row_hash=digest(r.prev_hash or b"", r.values)), *rows[3:]]


def forged(rows: list[ChainRow]) -> list[ChainRow]:
    return [ChainRow((None, "999", *rows[0].values[2:]), None, None), *rows]


CASES: dict[str, tuple[Callable[[list[ChainRow]], list[ChainRow]], str]] = {
    "a row's tenant changed: its hash no longer matches": (edited, "altered"),
    "a row changed and rehashed: the next row's link breaks": (rehashed, "broken"),
    "a middle row deleted: chain_seq has a gap": (lambda r: r[:2] + r[3:], "gaps"),
    "a row written with the trigger off: outside the chain": (forged, "unchained"),
}


def test_an_untouched_chain_is_intact_and_names_its_head() -> None:
    rows = chain(5)
    report = verify(rows)
    assert report.intact and report.head_seq == 5 and report.head_hash == rows[-1].row_hash
    assert report.lines()[-1] == "intact"


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rewrite_is_reported(case: str) -> None:
    change, finding = CASES[case]
    report = verify(change(chain(5)))
    assert not report.intact and getattr(report, finding), report.lines()
    assert report.lines()[-1] == "NOT INTACT"


def test_a_deleted_tail_is_seen_only_against_a_head_recorded_before() -> None:
    rows = chain(5)
    head = (5, rows[-1].row_hash or b"")
    assert verify(rows[:3]).intact
    report = verify(rows[:3], head)
    assert not report.intact and report.head_missing
    assert verify(rows, head).intact
