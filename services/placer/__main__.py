"""python -m services.placer: run the placer until SIGTERM."""

from __future__ import annotations

from kestrel.service import run_main
from services.placer.app import PlacerConfig, run


def main() -> None:
    run_main("placer", lambda stop: run(PlacerConfig.from_env(), stop))


if __name__ == "__main__":
    main()
