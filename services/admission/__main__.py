"""python -m services.admission: run admission until SIGTERM."""

from __future__ import annotations

import asyncio

from kestrel.config import env_str
from kestrel.service import setup_logging, stop_event_on_signals
from services.admission.app import AdmissionConfig, run


async def _main() -> None:
    await run(AdmissionConfig.from_env(), stop_event_on_signals())


def main() -> None:
    setup_logging("admission", env_str("KESTREL_LOG_LEVEL", "INFO"))
    asyncio.run(_main())


if __name__ == "__main__":
    main()
