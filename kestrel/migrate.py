"""Apply the schema migrations of Kestrel's services as the tables' owner, then exit.

    python -m kestrel.migrate [meter] [gateway] [admission]     (default: all three)

Reads KESTREL_POSTGRES_OWNER_DSN (required: the point is that the long-running
services never hold it) and waits for Postgres to answer. Each component's
migrations live with the service that writes its tables (services/<c>/migrations);
applying is idempotent and serialised by an advisory lock, so several migrators may
run at once. The Helm chart runs this in each service's init container, so the
service itself starts with its own role only and finds its schema current.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from kestrel.config import Stores
from kestrel.db import migrate_component

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("meter", "gateway", "admission")


def directory(component: str) -> Path:
    return REPO / "services" / component / "migrations"


async def _run(components: list[str]) -> list[tuple[str, list[str]]]:
    stores = Stores.from_env()
    return [(c, await migrate_component(stores, c, directory(c))) for c in components]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel.migrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("components", nargs="*", metavar="COMPONENT",
                    help=f"any of {', '.join(COMPONENTS)}")
    args = ap.parse_args(argv)
    if unknown := [c for c in args.components if c not in COMPONENTS]:
        ap.error(f"unknown component {', '.join(unknown)} (known: {', '.join(COMPONENTS)})")
    components = list(dict.fromkeys(args.components)) or list(COMPONENTS)
    if not os.environ.get("KESTREL_POSTGRES_OWNER_DSN"):
        print("kestrel.migrate: KESTREL_POSTGRES_OWNER_DSN is not set (the tables' "
              "owner; the services' own roles may not create tables)", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("KESTREL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for component, applied in asyncio.run(_run(components)):
        print(f"migrate: {component}: "
              + (f"applied {', '.join(applied)}" if applied else "up to date"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
