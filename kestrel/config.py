"""Configuration from KESTREL_* environment variables, read once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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


def local_cluster_dir() -> Path:
    """The local development cluster's state directory (cluster/README.md):
    KESTREL_CLUSTER_DIR, else $KESTREL_CACHE/cluster, else ~/.cache/kestrel/cluster.
    The services take two defaults from it, the kubeconfig and the CPU node's image
    record, so that `make up` needs no settings; a real install sets KESTREL_KUBECONFIG
    (the chart: in-cluster) and KESTREL_WORKER_IMAGE instead."""
    cache = Path(os.environ.get("KESTREL_CACHE", str(Path.home() / ".cache" / "kestrel")))
    return Path(os.environ.get("KESTREL_CLUSTER_DIR", str(cache / "cluster")))


def local_kubeconfig() -> Path:
    return local_cluster_dir() / "kubeconfig"


def local_image_record() -> Path:
    """Where the local CPU node records the images it runs (kestrel_tools.cluster.node
    writes it: {"kestrel": {"ref": ...}, "pause": {...}})."""
    return local_cluster_dir() / "node" / "images.json"


@dataclass(frozen=True)
class Stores:
    """Where the stores are: Postgres, NATS, Redis (the devstack writes these; model
    endpoints are services.gateway.endpoints, another thing).

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
    def from_env(cls, service: str = "") -> Stores:
        own = os.environ.get(f"KESTREL_{service.upper()}_POSTGRES_DSN", "") if service else ""
        own_nats = os.environ.get(f"KESTREL_{service.upper()}_NATS_URL", "") if service else ""
        return cls(
            nats_url=own_nats or env_str("KESTREL_NATS_URL", "nats://127.0.0.1:4222"),
            postgres_dsn=own or env_str("KESTREL_POSTGRES_DSN",
                                        "postgresql://postgres@127.0.0.1:5432/kestrel"),
            redis_url=env_str("KESTREL_REDIS_URL", "redis://127.0.0.1:6379/0"),
            postgres_owner_dsn=env_str("KESTREL_POSTGRES_OWNER_DSN", ""),
        )
