"""python -m services.meter: run the meter until SIGTERM."""

from __future__ import annotations

from kestrel.service import run_main
from services.meter.app import MeterConfig, run


def main() -> None:
    run_main("meter", lambda stop: run(MeterConfig.from_env(), stop))


if __name__ == "__main__":
    main()
