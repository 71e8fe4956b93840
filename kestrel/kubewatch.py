"""One Kubernetes watch, read as the apiserver writes it: a line of JSON per event.

The client's `Watch.stream` decodes each line with the standard library's json, and
with `deserialize=False` turns an ERROR event (410 Gone above all) into
KeyError('raw_object') instead of the status it carries. Watch events are most of what
the placer and the runway check decode (a fifth of the placer's CPU in bench-jobs was
json's decoder), so this reads the stream itself: orjson per line, and an ERROR event
raised as the ApiException it describes, so a 410 relists like a 410 from a list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

__all__ = ["events", "loads"]

loads = orjson.loads


def events(call: Callable[..., Any], *args: Any, resource_version: str, timeout_s: int,
           **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Watch events of `call` (a list call of the Kubernetes client, or one taking the
    same keywords) from `resource_version` until the apiserver ends the watch after
    `timeout_s`: each a dict with "type" and "object", bookmarks included. An ERROR
    event raises ApiException with its code and message."""
    resp = call(*args, watch=True, resource_version=resource_version,
                timeout_seconds=timeout_s, allow_watch_bookmarks=True,
                _preload_content=False, **kwargs)
    try:
        status = getattr(resp, "status", 200)
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=resp.reason,
                               http_resp=None) from None
        rest = b""
        for chunk in resp.stream(amt=None, decode_content=False):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    yield event_of(line)
        if rest.strip():
            yield event_of(rest)
    finally:
        # Closed before it goes back to the pool, as the client's own Watch does: a
        # watch left mid-stream (an ERROR event, a stop) still has bytes unread, and a
        # pooled connection with a body pending would hand them to the next request.
        resp.close()
        resp.release_conn()


def event_of(line: bytes) -> dict[str, Any]:
    """One line of a watch as its event; an ERROR event raises its status."""
    event: dict[str, Any] = loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise ApiException(status=int(status.get("code") or 500),
                           reason=str(status.get("message") or status.get("reason") or ""))
    return event
