"""The placer's settings (KESTREL_PLACER_* and the worker's, read by app.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlacerSettings:
    flavors: tuple[str, ...] = ("gpu-h100", "gpu-a10")
    runway_check: str = "kestrel-runway"
    short_bp: int = 2500
    # Endpoint replicas on the CPU pool: the model worker in the Kestrel image (empty:
    # the one recorded in worker_image_record, read at each placement: the local node
    # records the image it imported there) and the Redis it serves requests from.
    worker_image: str = ""
    worker_image_record: str = ""
    worker_redis_url: str = "redis://127.0.0.1:6379/0"
    # Run a host worker in place of each running simulated (KWOK) GPU replica.
    gpu_standins: bool = True

