"""Configuration from KESTREL_* environment variables, read once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None


@dataclass(frozen=True)
class Endpoints:
    """Where the shared infrastructure is (the devstack writes these)."""

    nats_url: str
    postgres_dsn: str
    redis_url: str

    @classmethod
    def from_env(cls) -> Endpoints:
        return cls(
            nats_url=env_str("KESTREL_NATS_URL", "nats://127.0.0.1:4222"),
            postgres_dsn=env_str("KESTREL_POSTGRES_DSN",
                                 "postgresql://postgres@127.0.0.1:5432/kestrel"),
            redis_url=env_str("KESTREL_REDIS_URL", "redis://127.0.0.1:6379/0"),
        )
