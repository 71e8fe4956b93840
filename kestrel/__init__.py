"""Kestrel: runway-aware GPU compute control plane.

`kestrel.Client` (blocking) and `kestrel.AsyncClient` (asyncio) are the Python SDK of
the public gateway API; see `kestrel.sdk`. They are imported on first use, so the
services that import `kestrel.<module>` do not load the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kestrel.sdk import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kestrel import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'kestrel' has no attribute {name!r}")
