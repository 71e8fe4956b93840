"""python -m services.placer: run the placer until SIGTERM."""

from __future__ import annotations

import asyncio

from kestrel.config import env_str
from kestrel.service import setup_logging, stop_event_on_signals
from services.placer.app import PlacerConfig, run


async def _main() -> None:
    await run(PlacerConfig.from_env(), stop_event_on_signals())


def main() -> None:
    setup_logging("placer", env_str("KESTREL_LOG_LEVEL", "INFO"))
    asyncio.run(_main())


if __name__ == "__main__":
    main()
