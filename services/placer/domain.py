"""The placer's flavor choice, a pure function over frozen data.

Where a job runs follows its tenant's runway (ARCHITECTURE.md, Runway): a
tenant whose runway is short is placed on the cheapest flavor whose quota fits
the job; otherwise on its preferred flavor if that fits, else on the dearest
flavor that fits (the flavor admission priced the reservation at, so the
reservation always covers the placement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

DEFAULT_SHORT_BP = 2500  # under 25% of the credits left


@dataclass(frozen=True)
class FlavorAsk:
    gpus: int
    preference: str  # empty: no preference
    max_duration_s: int


@dataclass(frozen=True)
class RunwayView:
    """The last kestrel.runway.<tenant> figure the placer heard."""

    remaining_bp: int
    runway_s: float
    unlimited: bool


@dataclass(frozen=True)
class Placement:
    flavor: str
    reason: str
    short: bool = False


def _pct(bp: int) -> str:
    return f"{bp / 100:g}%"


def short_because(runway: RunwayView | None, max_duration_s: int, short_bp: int) -> str | None:
    """Why the runway is short for a job of this length, or None when it is not."""
    if runway is None:
        return None
    if runway.remaining_bp < short_bp:
        return f"{_pct(max(runway.remaining_bp, 0))} left"
    if not runway.unlimited and runway.runway_s < 2 * max_duration_s:
        return (f"{runway.runway_s:.0f} s of runway < 2 x max duration "
                f"{max_duration_s} s")
    return None


def choose_flavor(ask: FlavorAsk, quota: Mapping[str, int], prices: Mapping[str, Decimal],
                  runway: RunwayView | None, short_bp: int = DEFAULT_SHORT_BP) -> Placement:
    """The flavor a job is placed on, and why, in words a person can read.

    `quota` is the tenant's nominal GPU quota per flavor (the flavors the
    placer knows); `prices` the latest price per GPU-second per flavor. A
    flavor without a price ranks as the dearest (never chosen as "cheapest"
    while a priced one fits).
    """
    fits = sorted(f for f, q in quota.items() if q >= ask.gpus)

    def cost(f: str) -> tuple[int, Decimal, str]:
        price = prices.get(f)
        return (1, Decimal(0), f) if price is None else (0, price, f)

    short = short_because(runway, ask.max_duration_s, short_bp)
    if not fits:
        known = sorted(quota) or sorted(prices)
        if ask.preference:
            flavor = ask.preference
        elif known:
            flavor = max(known, key=cost)
        else:
            flavor = ""
        return Placement(flavor, f"no flavor's quota fits {ask.gpus} GPUs: "
                                 f"{flavor or 'nothing'} placed as asked, it may borrow "
                                 "from the cohort", short is not None)
    if short is not None:
        cheapest = min(fits, key=cost)
        return Placement(cheapest, f"runway short ({short}): cheapest flavor that fits", True)
    health = ("no runway figure yet" if runway is None
              else f"runway healthy ({_pct(runway.remaining_bp)} left)")
    if ask.preference and ask.preference in fits:
        return Placement(ask.preference, f"{health}: preferred flavor fits its quota")
    dearest = max(fits, key=cost)
    if ask.preference:
        have = quota.get(ask.preference, 0)
        return Placement(dearest, f"{health}: preferred {ask.preference} has quota {have} "
                                  f"< {ask.gpus} GPUs; dearest flavor that fits")
    return Placement(dearest, f"{health}: no preference; dearest flavor that fits")
