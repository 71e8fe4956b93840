"""Money: exact decimals with fixed scales, never floats.

Prices are credits per GPU-second with at most 9 decimal places. A ledger row
costs gpu_us x price / 1e6, which is exact at scale 15 (the column's scale).
"""

from __future__ import annotations

import decimal
from decimal import Decimal

PRICE_PLACES = 9
AMOUNT_PLACES = 9
COST_PLACES = 15
MAX_AMOUNT = Decimal("1000000000000")  # 1e12 credits: anything larger is a typo

# Enough digits for gpu_us (~1e14) x price (9 places) without rounding.
_CTX = decimal.Context(prec=60, traps=[decimal.InvalidOperation, decimal.Inexact])

ZERO = Decimal(0)


class MoneyError(ValueError):
    """A decimal string that is not an acceptable amount; the message says why."""


def parse_amount(text: str, *, places: int = AMOUNT_PLACES, positive: bool = True,
                 maximum: Decimal = MAX_AMOUNT, signed: bool = False) -> Decimal:
    """Parse a decimal string strictly: no exponents, NaN, infinities or excess places."""
    s = text.strip()
    if not s:
        raise MoneyError("is empty; give a decimal such as 12.5")
    if any(c not in "0123456789.-+" for c in s):
        raise MoneyError(f"{text!r} is not a plain decimal number")
    try:
        value = Decimal(s)
    except decimal.InvalidOperation:
        raise MoneyError(f"{text!r} is not a decimal number") from None
    if not value.is_finite():
        raise MoneyError(f"{text!r} is not finite")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > places:
        raise MoneyError(f"{text!r} has more than {places} decimal places")
    if signed:
        if value == 0:
            raise MoneyError(f"{text!r} must not be zero")
        if abs(value) > maximum:
            raise MoneyError(f"{text!r} exceeds the maximum of {maximum} either way")
        return value
    if positive and value <= 0:
        raise MoneyError(f"{text!r} must be greater than zero")
    if not positive and value < 0:
        raise MoneyError(f"{text!r} must not be negative")
    if value > maximum:
        raise MoneyError(f"{text!r} exceeds the maximum of {maximum}")
    return value


def row_cost(gpu_us: int, price_per_gpu_s: Decimal) -> Decimal:
    """Exact cost of gpu_us GPU-microseconds at a per-GPU-second price."""
    return _CTX.divide(_CTX.multiply(Decimal(gpu_us), price_per_gpu_s), Decimal(1_000_000))


def fmt(value: Decimal) -> str:
    """Canonical decimal text for the wire: no exponent, trailing zeros trimmed."""
    if value == 0:
        return "0"
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
