"""API keys and the operator token.

A key reads `ks_<key_id>_<secret>`: key_id finds the row, the secret is
checked against its stored SHA-256 in constant time. Secrets are 32 random
bytes, so a fast hash is the right one (there is nothing to brute-force); the
database never holds a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from kestrel.errors import Unauthenticated

KEY_RE = re.compile(r"^ks_([a-f0-9]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewKey:
    key_id: str
    secret: str  # the whole presented key, shown once
    secret_hash: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_key() -> NewKey:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return NewKey(key_id, f"ks_{key_id}_{secret}", hash_secret(secret))


def bearer(metadata: object) -> str:
    """The token of `authorization: Bearer <token>`, or Unauthenticated."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            break
    raise Unauthenticated("missing 'authorization: Bearer <key>' metadata")


def parse_key(token: str) -> tuple[str, str]:
    m = KEY_RE.match(token)
    if not m:
        raise Unauthenticated("the API key is malformed")
    return m.group(1), m.group(2)


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def token_matches(token: str, expected_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(token), expected_hash)
