"""python -m services.gateway: run the public API until SIGTERM."""

from __future__ import annotations

from kestrel.service import run_main
from services.gateway.app import GatewayConfig, run


def main() -> None:
    run_main("gateway", lambda stop: run(GatewayConfig.from_env(), stop))


if __name__ == "__main__":
    main()
