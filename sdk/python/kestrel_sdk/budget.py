"""A tenant's budget at one instant, computed in one place: `budget()`.

From four figures — credits (every top-up and adjustment), charged (the cost of
every ledger row), reserved (what admission's holds have not yet consumed) and
the burn of what runs now — it answers two questions a person asks, which the
single "runway" used to blur:

- How long does the money last at the current burn? `money_runway_s` =
  (credits - charged) / burn. Holds spend nothing: only running work does, so a
  budget fully reserved by covered jobs still has all its money.
- How much can still be reserved for new work? `free_to_reserve` = remaining,
  never below zero, where remaining = credits - charged - reserved; `runway_s` =
  remaining / burn is how long that unreserved part would last.

Pure: money is Decimal throughout; only the seconds are floats (inf when nothing
burns, 0 when the money in question is gone).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from kestrel_sdk.money import ZERO

__all__ = ["Budget", "Hold", "budget", "remaining", "reserved_of", "spent", "unspent"]


@dataclass(frozen=True)
class Hold:
    """A reservation and what the ledger says it has consumed so far."""

    amount: Decimal
    consumed: Decimal = ZERO
    closed: bool = False  # its allocation closed: the final cost is in `charged`
    # An endpoint replica's: it holds the whole amount (a horizon of its spend) for as
    # long as the replica runs; open-ended work never uses its reservation up.
    rolling: bool = False

    @property
    def held(self) -> Decimal:
        if self.closed:
            return ZERO
        return self.amount if self.rolling else max(ZERO, self.amount - self.consumed)


def reserved_of(holds: Iterable[Hold]) -> Decimal:
    return sum((h.held for h in holds), ZERO)


@dataclass(frozen=True)
class Budget:
    credits: Decimal
    charged: Decimal
    reserved: Decimal
    burn_per_s: Decimal
    # credits - charged: the money not yet spent (holds are not spending).
    unspent: Decimal
    # credits - charged - reserved; negative when open-ended work overran.
    remaining: Decimal
    # remaining, never below zero: what a new job can still reserve.
    free_to_reserve: Decimal
    # Nothing burns: neither figure of seconds ever runs out.
    unlimited: bool
    # remaining / burn: how long the unreserved money lasts (0 when none is left).
    runway_s: float
    # unspent / burn: how long the money lasts at the current burn (0 when spent).
    money_runway_s: float
    # remaining / credits in basis points, clamped to [0, 10000].
    remaining_bp: int


def unspent(credits: Decimal, charged: Decimal) -> Decimal:
    """The money not yet spent, reserved or not: credits - charged."""
    return credits - charged


def spent(credits: Decimal, charged: Decimal) -> bool:
    """The tenant's money is gone (running work is stopped, nothing new starts)."""
    return unspent(credits, charged) <= 0


def remaining(credits: Decimal, charged: Decimal, reserved: Decimal) -> Decimal:
    """What is neither spent nor held: credits - charged - reserved (negative when
    open-ended work overran)."""
    return unspent(credits, charged) - reserved


def _seconds(money: Decimal, burn: Decimal) -> float:
    if burn <= 0:
        return math.inf
    if money <= 0:
        return 0.0
    return float(money / burn)


def budget(credits: Decimal, charged: Decimal, reserved: Decimal | Iterable[Hold],
           burn_per_s: Decimal) -> Budget:
    """Every figure of a budget from credits, charged, holds (or their sum) and burn."""
    held = reserved if isinstance(reserved, Decimal) else reserved_of(reserved)
    left = remaining(credits, charged, held)
    bp = 0 if credits <= 0 else max(0, min(10_000, int((left * 10_000) // credits)))
    return Budget(credits=credits, charged=charged, reserved=held, burn_per_s=burn_per_s,
                  unspent=unspent(credits, charged), remaining=left,
                  free_to_reserve=max(ZERO, left), unlimited=burn_per_s <= 0,
                  runway_s=_seconds(left, burn_per_s),
                  money_runway_s=_seconds(unspent(credits, charged), burn_per_s),
                  remaining_bp=bp)
