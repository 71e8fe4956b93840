"""Opaque page tokens bound to the query that issued them.

A token's digest ties it to its query (a token of another query, another tenant's
included, is refused like garbage) but it is no secret: anyone can compute it for a
query of their own. So the position a token carries is checked like any input: an
integer position must fit a bigint, a text position must be storable (no control
characters, bounded), or the token is "not a token this query returned".
"""

from __future__ import annotations

import base64
import hashlib
import re

from kestrel.errors import Violations
from kestrel.validation import string_problem

MAX_INT_POSITION = 2**63 - 1  # a bigint column: Postgres holds no larger position
MAX_TEXT_POSITION = 256
_INT_POSITION = re.compile(r"[0-9]{1,19}")


def _digest(query: tuple[object, ...]) -> str:
    return hashlib.sha256(repr(query).encode()).hexdigest()[:12]


def encode_token(after: str | int, query: tuple[object, ...]) -> str:
    raw = f"{after}|{_digest(query)}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, query: tuple[object, ...]) -> str | None:
    """The position to continue after; None when the token is not one this query issued."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    after, sep, digest = raw.rpartition("|")
    if not sep or digest != _digest(query):
        return None
    if string_problem(after, MAX_TEXT_POSITION) is not None:
        return None
    return after


def decode_int_token(token: str, query: tuple[object, ...]) -> int | None:
    after = decode_token(token, query)
    if after is None or not _INT_POSITION.fullmatch(after):
        return None
    position = int(after)
    return position if position <= MAX_INT_POSITION else None


def _bad(v: Violations) -> None:
    v.add("page_token", "is not a token this query returned")


def after_int(v: Violations, token: str, query: tuple[object, ...]) -> int:
    """Where a page continues (0: from the start); a foreign token is a field violation."""
    if not token:
        return 0
    after = decode_int_token(token, query)
    if after is None:
        _bad(v)
        return 0
    return after


def after_str(v: Violations, token: str, query: tuple[object, ...]) -> str:
    if not token:
        return ""
    after = decode_token(token, query)
    if after is None:
        _bad(v)
        return ""
    return after
