"""Time as integer microseconds since the Unix epoch: the ledger's unit."""

from __future__ import annotations

import time
from typing import Protocol


def now_us() -> int:
    return time.time_ns() // 1_000


class Clock(Protocol):
    def __call__(self) -> int: ...


US_PER_S = 1_000_000
