"""python -m services.autoscaler: run the autoscaler until SIGTERM."""

from __future__ import annotations

from kestrel.service import run_main
from services.autoscaler.app import AutoscalerConfig, run


def main() -> None:
    run_main("autoscaler", lambda stop: run(AutoscalerConfig.from_env(), stop))


if __name__ == "__main__":
    main()
