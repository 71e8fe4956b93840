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
    """Where the shared infrastructure is (the devstack writes these).

    `postgres_dsn` is the service's own role: KESTREL_<SERVICE>_POSTGRES_DSN (e.g.
    KESTREL_METER_POSTGRES_DSN), else KESTREL_POSTGRES_DSN. `postgres_owner_dsn`
    (KESTREL_POSTGRES_OWNER_DSN) is the tables' owner, used only to run migrations;
    empty when unset (then migrations fall back to `postgres_dsn`, with a warning).
    `nats_url` likewise: KESTREL_<SERVICE>_NATS_URL (the service's own NATS user, see
    kestrel.natsauth), else KESTREL_NATS_URL."""

    nats_url: str
    postgres_dsn: str
    redis_url: str
    postgres_owner_dsn: str = ""

    @classmethod
    def from_env(cls, service: str = "") -> Endpoints:
        own = os.environ.get(f"KESTREL_{service.upper()}_POSTGRES_DSN", "") if service else ""
        own_nats = os.environ.get(f"KESTREL_{service.upper()}_NATS_URL", "") if service else ""
        return cls(
            nats_url=own_nats or env_str("KESTREL_NATS_URL", "nats://127.0.0.1:4222"),
            postgres_dsn=own or env_str("KESTREL_POSTGRES_DSN",
                                        "postgresql://postgres@127.0.0.1:5432/kestrel"),
            redis_url=env_str("KESTREL_REDIS_URL", "redis://127.0.0.1:6379/0"),
            postgres_owner_dsn=env_str("KESTREL_POSTGRES_OWNER_DSN", ""),
        )
