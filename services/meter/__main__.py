"""python -m services.meter: run the meter until SIGTERM."""

from __future__ import annotations

import asyncio

from kestrel.config import env_str
from kestrel.service import setup_logging, stop_event_on_signals
from services.meter.app import MeterConfig, run


async def _main() -> None:
    await run(MeterConfig.from_env(), stop_event_on_signals())


def main() -> None:
    setup_logging("meter", env_str("KESTREL_LOG_LEVEL", "INFO"))
    asyncio.run(_main())


if __name__ == "__main__":
    main()
